"""pagedattn.ops against NumPy references written here (float64 softmax
attention over the pages the block tables name), and the in-place contract:
caches are updated in the caller's arrays."""

import math

import numpy as np
import pytest

import pagedattn
from pagedattn import ops
import numpy_reference as ref

rng = np.random.default_rng(11)
HQ, HKV, D, BS = 4, 2, 8, 4
# float32 inputs: the kernels accumulate in float32 (order differs from the
# float64 reference); float8 caches are compared after decoding the same bytes.
ATOL = 2e-5


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def gather(cache, table_row, length, layout="NHD"):
    """Tokens [0, length) of a sequence from a [blocks, ...] cache: [length, Hkv, D]."""
    blocks = cache[table_row[: -(-length // BS)]]
    if layout == "HND":
        blocks = blocks.transpose(0, 2, 1, 3)
    return blocks.reshape(-1, *blocks.shape[2:])[:length].astype(np.float64)


class TestOrt:
    def setup_case(self, past=(3, 5), new=(2, 1), rank=3):
        b = len(past)
        key_cache = randn(8, BS, HKV * D)
        value_cache = randn(8, BS, HKV * D)
        if rank == 4:
            key_cache, value_cache = (c.reshape(8, BS, HKV, D) for c in (key_cache, value_cache))
        table = np.array([[0, 2, 4], [1, 3, 5]][:b], np.int32)
        cu = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
        t = int(cu[-1])
        return dict(query=randn(t, HQ * D), key=randn(t, HKV * D), value=randn(t, HKV * D),
                    key_cache=key_cache, value_cache=value_cache,
                    cumulative_sequence_length=cu,
                    past_seqlens=np.array(past, np.int32), block_table=table)

    def reference(self, a, before_k, before_v, rotary=None):
        out = np.zeros((a["query"].shape[0], HQ, D))
        cu, past = a["cumulative_sequence_length"], a["past_seqlens"]
        for s in range(len(past)):
            lo, hi, p = cu[s], cu[s + 1], past[s]
            q = a["query"][lo:hi].reshape(-1, HQ, D)
            k_new = a["key"][lo:hi].reshape(-1, HKV, D)
            if rotary:
                q, k_new = (ref.rope(x, np.arange(p, p + hi - lo), rotary) for x in (q, k_new))
            k = np.concatenate([gather(before_k.reshape(8, BS, HKV, D), a["block_table"][s], p), k_new])
            v = np.concatenate([gather(before_v.reshape(8, BS, HKV, D), a["block_table"][s], p),
                                a["value"][lo:hi].reshape(-1, HKV, D)])
            out[lo:hi] = ref.attention(q, k, v, 1 / math.sqrt(D))
        return out.reshape(-1, HQ * D)

    @pytest.mark.parametrize("rank", [3, 4])
    def test_matches_reference_and_writes_caches_in_place(self, rank):
        a = self.setup_case(rank=rank)
        before_k, before_v = a["key_cache"].copy(), a["value_cache"].copy()
        k_ptr = a["key_cache"].__array_interface__["data"][0]
        out = ops.ort_paged_attention(**a, num_heads=HQ, kv_num_heads=HKV)
        assert out.shape == (3, HQ * D) and out.dtype == np.float32
        np.testing.assert_allclose(out, self.reference(a, before_k, before_v), atol=ATOL)
        # In place: the caller's cache array (same buffer) now holds the new tokens.
        assert a["key_cache"].__array_interface__["data"][0] == k_ptr
        kc = a["key_cache"].reshape(8, BS, HKV * D)
        # Sequence 0 (table [0, 2, 4], 3 cached) puts its new tokens at positions
        # 3 (block 0, slot 3) and 4 (block 2, slot 0); sequence 1 at 5 (block 3, slot 1).
        np.testing.assert_array_equal(kc[0, 3], a["key"][0])
        np.testing.assert_array_equal(kc[2, 0], a["key"][1])
        np.testing.assert_array_equal(kc[3, 1], a["key"][2])

    def test_rotary_packed_and_empty(self):
        a = self.setup_case()
        before_k, before_v = a["key_cache"].copy(), a["value_cache"].copy()
        theta = 10000.0
        inv = 1.0 / theta ** (np.arange(D // 2) * 2.0 / D)
        ang = np.arange(16)[:, None] * inv[None, :]
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        packed = np.concatenate([a["query"], a["key"], a["value"]], axis=1)
        args = {k: a[k] for k in ("key_cache", "value_cache", "cumulative_sequence_length",
                                  "past_seqlens", "block_table")}
        out = ops.ort_paged_attention(packed, None, None, cos_cache=cos, sin_cache=sin,
                                      num_heads=HQ, kv_num_heads=HKV, do_rotary=True, **args)
        np.testing.assert_allclose(out, self.reference(a, before_k, before_v, rotary=theta),
                                   atol=1e-4)
        empty = self.setup_case(past=(3, 5), new=(0, 0))
        out = ops.ort_paged_attention(**empty, num_heads=HQ, kv_num_heads=HKV)
        assert out.shape == (0, HQ * D)


class TestRagged:
    def test_matches_reference_padding_ignored(self):
        kv_pages = randn(6, BS, 2 * HKV, D)
        kv_lens = np.array([5, 3, 99], np.int32)            # row 2: padding
        page_indices = np.array([[0, 3], [5, 0], [9, 9]], np.int32)
        cu = np.array([0, 2, 3, 3], np.int32)
        q = randn(5, HQ, D)                                  # rows 3, 4: padding
        out = ops.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu, 2, sm_scale=0.3)
        assert out.shape == q.shape
        for s in range(2):
            k = gather(kv_pages[:, :, 0::2], page_indices[s], kv_lens[s])
            v = gather(kv_pages[:, :, 1::2], page_indices[s], kv_lens[s])
            np.testing.assert_allclose(out[cu[s]:cu[s + 1]], ref.attention(q[cu[s]:cu[s + 1]], k, v, 0.3),
                                       atol=ATOL)
        np.testing.assert_array_equal(out[3:], 0)

    @pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
    def test_fp8_pages_as_uint8(self, fmt):
        short = "e4m3fn" if fmt == "float8_e4m3fn" else "e5m2"
        pages = ref.fp8_bits(randn(4, BS, 2 * HKV, D) * 2, short)
        kv_lens, table = np.array([7], np.int32), np.array([[2, 1]], np.int32)
        cu, q = np.array([0, 3], np.int32), randn(3, HQ, D)
        out = ops.ragged_paged_attention(q, pages, kv_lens, table, cu, np.array([1], np.int32),
                                         sm_scale=0.25, k_scale=0.5, v_scale=2.0, kv_dtype=fmt)
        vals = ref.fp8_value(pages, short)
        k = gather(vals[:, :, 0::2], table[0], 7) * 0.5
        v = gather(vals[:, :, 1::2], table[0], 7) * 2.0
        np.testing.assert_allclose(out, ref.attention(q, k, v, 0.25), atol=1e-4)

    def test_bfloat16_pages_as_uint16(self):
        pages32 = randn(3, BS, 2 * HKV, D)
        pages = ref.bf16_bits(pages32)
        q = randn(2, HQ, D)
        args = (np.array([6], np.int32), np.array([[1, 0]], np.int32), np.array([0, 2], np.int32), 1)
        out = ops.ragged_paged_attention(q, pages, *args, kv_dtype="bfloat16", sliding_window=3)
        vals = ref.bf16_value(pages)
        k, v = gather(vals[:, :, 0::2], [1, 0], 6), gather(vals[:, :, 1::2], [1, 0], 6)
        np.testing.assert_allclose(out, ref.attention(q, k, v, 1.0, window_left=2), atol=1e-4)


class TestVllm:
    @pytest.mark.parametrize("layout", ["NHD", "HND"])
    def test_reshape_and_cache_in_place_then_decode(self, layout):
        shape = (6, BS, HKV, D) if layout == "NHD" else (6, HKV, BS, D)
        key_cache, value_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        views = (key_cache, value_cache)
        tables = np.array([[4, 1], [0, 5]], np.int32)
        seq_lens = np.array([6, 3], np.int32)
        slots = np.array([tables[s][p // BS] * BS + p % BS for s in range(2) for p in range(seq_lens[s])]
                         + [-1], np.int64)
        key, value = randn(len(slots), HKV, D), randn(len(slots), HKV, D)
        ops.reshape_and_cache(key, value, key_cache, value_cache, slots, layout=layout)
        assert views[0] is key_cache and np.shares_memory(views[0], key_cache)
        np.testing.assert_array_equal(gather(key_cache, tables[0], 6, layout), key[:6])
        np.testing.assert_array_equal(gather(value_cache, tables[1], 3, layout), value[6:9])

        query = randn(2, HQ, D)
        slopes = np.array([0.5, -0.25, 0.1, 0.0], np.float32)
        for alibi in (None, slopes):
            out = ops.paged_attention_decode(query, key_cache, value_cache, tables, seq_lens,
                                             num_kv_heads=HKV, scale=0.4, alibi_slopes=alibi,
                                             layout=layout)
            for s in range(2):
                k = gather(key_cache, tables[s], seq_lens[s], layout)
                v = gather(value_cache, tables[s], seq_lens[s], layout)
                np.testing.assert_allclose(out[s:s + 1], ref.attention(query[s:s + 1], k, v, 0.4,
                                                                       alibi_slopes=alibi), atol=ATOL)

    @pytest.mark.parametrize("layout", ["NHD", "HND"])
    @pytest.mark.parametrize("options", [{}, {"scale": 0.3, "sliding_window": 3},
                                         {"alibi_slopes": np.array([0.5, -0.25, 0.1, 0.0],
                                                                   np.float32)}])
    def test_prefix_prefill_over_cached_keys(self, layout, options):
        """vLLM forward_prefix: each sequence's queries are its last positions,
        causal over every key of the caches (the new ones written first)."""
        shape = (8, BS, HKV, D) if layout == "NHD" else (8, HKV, BS, D)
        key_cache, value_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        tables = np.array([[6, 1], [0, 5], [3, 7]], np.int32)
        seq_lens = np.array([7, 5, 3], np.int32)
        query_lens = [3, 5, 1]          # a prefix hit, a whole prompt, a decode row
        slots = np.array([tables[s][p // BS] * BS + p % BS
                          for s in range(3) for p in range(seq_lens[s])], np.int64)
        key, value = randn(len(slots), HKV, D), randn(len(slots), HKV, D)
        ops.reshape_and_cache(key, value, key_cache, value_cache, slots, layout=layout)
        starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
        query = randn(int(starts[-1]), HQ, D)
        out = ops.paged_attention_prefix(query, key_cache, value_cache, tables, starts, seq_lens,
                                         layout=layout, **options)
        assert out.shape == query.shape and out.dtype == np.float32
        scale = options.get("scale", 1 / math.sqrt(D))
        window = options.get("sliding_window")
        slopes = options.get("alibi_slopes")
        for s in range(3):
            k = gather(key_cache, tables[s], seq_lens[s], layout)
            v = gather(value_cache, tables[s], seq_lens[s], layout)
            expected = ref.attention(query[starts[s]:starts[s + 1]], k, v, scale,
                                     window_left=window - 1 if window else -1,
                                     alibi_slopes=slopes)
            np.testing.assert_allclose(out[starts[s]:starts[s + 1]], expected, atol=ATOL)

    def test_prefix_refuses_bad_lengths_naming_them(self):
        key_cache = value_cache = np.zeros((2, BS, HKV, D), np.float32)
        tables, starts = np.array([[0, 1]], np.int32), np.array([0, 3], np.int32)
        query = randn(3, HQ, D)
        with pytest.raises(ValueError, match=r"seq_lens\[0\] = 2 is less than its query length 3"):
            ops.paged_attention_prefix(query, key_cache, value_cache, tables, starts, [2])
        with pytest.raises(ValueError, match="max_query_len"):
            ops.paged_attention_prefix(query, key_cache, value_cache, tables, starts, [5],
                                       max_query_len=2)

    def test_fp8_cache_quantises_on_write(self):
        key_cache = np.zeros((3, BS, HKV, D), np.uint8)
        value_cache = np.zeros((3, BS, HKV, D), np.uint8)
        key, value = randn(5, HKV, D), randn(5, HKV, D)
        slots = np.arange(5, dtype=np.int64) + 2
        ops.reshape_and_cache(key, value, key_cache, value_cache, slots, kv_cache_dtype="fp8",
                              k_scale=0.5, v_scale=0.25)
        flat = key_cache.reshape(-1, HKV, D)
        np.testing.assert_array_equal(ref.fp8_value(flat[2:7], "e4m3fn"),
                                      ref.fp8_value(ref.fp8_bits(key / 0.5, "e4m3fn"), "e4m3fn"))
        query = randn(1, HQ, D)
        out = ops.paged_attention_decode(query, key_cache, value_cache, np.array([[0, 1]], np.int32),
                                         np.array([7], np.int32), num_kv_heads=HKV, scale=0.3,
                                         kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25)
        k = ref.fp8_value(key_cache.reshape(-1, HKV, D)[:7], "e4m3fn") * 0.5
        v = ref.fp8_value(value_cache.reshape(-1, HKV, D)[:7], "e4m3fn") * 0.25
        np.testing.assert_allclose(out, ref.attention(query, k, v, 0.3), atol=1e-4)

    def test_copy_and_swap_blocks(self):
        keys = [randn(5, BS, HKV, D) for _ in range(2)]
        values = [randn(5, BS, HKV, D) for _ in range(2)]
        expect_k = [k.copy() for k in keys]
        mapping = np.array([[0, 3], [2, 4]], np.int64)
        ops.copy_blocks(keys, values, mapping)
        for k, e in zip(keys, expect_k):
            e[[3, 4]] = e[[0, 2]]
            np.testing.assert_array_equal(k, e)
        dst = np.zeros((2, BS, HKV, D), np.float32)
        ops.swap_blocks(keys[0], dst, np.array([[4, 1]], np.int64))
        np.testing.assert_array_equal(dst[1], keys[0][4])
        np.testing.assert_array_equal(dst[0], 0)


def test_merge_states():
    v_a, v_b = randn(6, 3, D), randn(6, 3, D)
    s_a, s_b = randn(6, 3), randn(6, 3)
    s_a[0, 0] = -np.inf
    s_a[1, 1] = s_b[1, 1] = -np.inf
    v, s = ops.merge_states(v_a, s_a, v_b, s_b)
    ev, es = ref.merge(v_a, s_a, v_b, s_b)
    assert v.shape == v_a.shape and s.shape == s_a.shape
    assert s[1, 1] == -np.inf      # two empty states stay empty; their v carries no weight
    v[1, 1] = ev[1, 1] = 0
    np.testing.assert_allclose(v, ev, atol=1e-6)
    np.testing.assert_allclose(s, es, atol=1e-6)


class TestMla:
    """mla_decode_kvcache against the UNABSORBED formula in float64: per-head
    keys [W_UK c | k_pe] and values W_UV c materialised from the latent rows."""

    H, LATENT, ROPE, NOPE, V = 6, 24, 8, 10, 12

    def case(self, seq_lens=(5, 9, 1), dtype=np.float32):
        D = self.LATENT + self.ROPE
        blocks = 12
        cache = randn(blocks, BS, D).astype(dtype)
        table = rng.permutation(blocks)[: 3 * len(seq_lens)].reshape(len(seq_lens), 3).astype(np.int32)
        w_uk = rng.standard_normal((self.H, self.NOPE, self.LATENT)) / math.sqrt(self.LATENT)
        w_uv = rng.standard_normal((self.H, self.V, self.LATENT)) / math.sqrt(self.LATENT)
        q_nope = rng.standard_normal((len(seq_lens), self.H, self.NOPE))
        q_pe = rng.standard_normal((len(seq_lens), self.H, self.ROPE))
        return cache, table, np.array(seq_lens, np.int32), w_uk, w_uv, q_nope, q_pe

    def reference(self, cache, table, seq_lens, w_uk, w_uv, q_nope, q_pe, scale):
        out = np.zeros((len(seq_lens), self.H, self.V))
        for b, n in enumerate(seq_lens):
            rows = cache.astype(np.float64)[table[b]].reshape(-1, cache.shape[-1])[:n]
            c, k_pe = rows[:, : self.LATENT], rows[:, self.LATENT :]
            for h in range(self.H):
                keys = np.concatenate([c @ w_uk[h].T, k_pe], axis=1)
                values = c @ w_uv[h].T
                s = keys @ np.concatenate([q_nope[b, h], q_pe[b, h]]) * scale
                p = np.exp(s - s.max())
                out[b, h] = p @ values / p.sum()
        return out

    @pytest.mark.parametrize("dtype", [np.float32, np.float16])
    def test_absorbed_decode_matches_unabsorbed_attention(self, dtype):
        cache, table, seq_lens, w_uk, w_uv, q_nope, q_pe = self.case(dtype=dtype)
        scale = 1 / math.sqrt(self.NOPE + self.ROPE)
        absorbed = np.concatenate([np.einsum("bhn,hnl->bhl", q_nope, w_uk), q_pe], axis=2)
        latent_out = ops.mla_decode_kvcache(absorbed.astype(dtype), cache, table, seq_lens,
                                            v_head_dim=self.LATENT, scale=scale)
        assert latent_out.shape == (3, self.H, self.LATENT) and latent_out.dtype == dtype
        got = np.einsum("bhl,hvl->bhv", latent_out.astype(np.float64), w_uv)
        want = self.reference(cache, table, seq_lens, w_uk, w_uv, q_nope, q_pe, scale)
        tol = 2e-5 if dtype == np.float32 else 3e-3  # float16 queries and outputs round
        np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max())

    def test_refusals_name_the_argument(self):
        cache, table, seq_lens, *_ = self.case()
        q = randn(3, self.H, self.LATENT + self.ROPE)
        with pytest.raises(ValueError, match="v_head_dim"):
            ops.mla_decode_kvcache(q, cache, table, seq_lens, v_head_dim=cache.shape[-1] + 1,
                                   scale=0.1)
        with pytest.raises(ValueError, match="query"):
            ops.mla_decode_kvcache(q[:, :, :-1], cache, table, seq_lens, v_head_dim=8, scale=0.1)
        with pytest.raises(ValueError, match="seq_lens"):
            ops.mla_decode_kvcache(q, cache, table, np.array([5, 9, 99], np.int32), v_head_dim=8,
                                   scale=0.1)


def test_every_function_documents_shapes():
    for name in ops.__all__:
        doc = getattr(ops, name).__doc__
        assert doc and "[" in doc or "(" in doc, name
