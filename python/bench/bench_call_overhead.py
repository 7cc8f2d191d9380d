"""Python call overhead of pagedattn's bindings (median of single calls).

    no-work calls:    KVCache.num_free_pages, ops.merge_states on 1 x 1 rows
    decode:           ops.paged_attention_decode at bench_ops' BM_VllmOverhead/1/16
                      shape (1 sequence, 16 keys, Hq 32, Hkv 8, D 128, float16,
                      block 16), to set beside the C++ adapter's time
    cache decode:     KVCache.attention, 1 new token, 16 cached (same shape)

Run with OMP_NUM_THREADS=1 to compare with the C++ numbers.
"""

import timeit

import numpy as np

import pagedattn
from pagedattn import ops


def best_us(fn, number):
    """Median of single-call times, in microseconds (the C++ bench reports
    medians too; a median ignores the other agents' load spikes)."""
    times = timeit.repeat(fn, number=1, repeat=number)
    return float(np.median(times)) * 1e6


def main():
    rng = np.random.default_rng(0)
    hq, hkv, d, block, keys = 32, 8, 128, 16, 16
    cache = pagedattn.KVCache(1, hq, hkv, d, block, 4, dtype="float16")
    one = np.zeros((1, 1), np.float32)
    lse = np.zeros(1, np.float32)
    print(f"KVCache.num_free_pages          {best_us(lambda: cache.num_free_pages, 200000):8.3f} us")
    print(f"ops.merge_states (1 x 1)        {best_us(lambda: ops.merge_states(one, lse, one, lse), 50000):8.3f} us")

    query = rng.standard_normal((1, hq, d)).astype(np.float16)
    kc = rng.standard_normal((1, block, hkv, d)).astype(np.float16)
    vc = rng.standard_normal((1, block, hkv, d)).astype(np.float16)
    tables, lens = np.zeros((1, 1), np.int32), np.array([keys], np.int32)
    decode = lambda: ops.paged_attention_decode(query, kc, vc, tables, lens, num_kv_heads=hkv,
                                                scale=d ** -0.5)
    print(f"ops.paged_attention_decode 1/16 {best_us(decode, 5000):8.3f} us")

    cache.add_sequence(0)
    cache.begin_forward([0], [keys - 1])
    x = rng.standard_normal((keys - 1, hq, d)).astype(np.float16)
    cache.attention(0, x, x[:, :hkv], x[:, :hkv])
    cache.end_forward()
    q1, k1 = query, query[:, :hkv]

    def step():  # one decode token, then rolled back so the length stays 16
        cache.begin_forward([0], [1])
        cache.attention(0, q1, k1, k1)
        cache.end_forward()
        cache.pop_n(0, 1)

    print(f"KVCache decode step 1/16 (begin, attention, end, pop_n) {best_us(step, 5000):8.3f} us")
    cache.begin_forward([0], [1])
    print(f"KVCache.attention alone 1/16 (same step, re-run)        "
          f"{best_us(lambda: cache.attention(0, q1, k1, k1), 5000):8.3f} us")
    cache.end_forward()


if __name__ == "__main__":
    main()
