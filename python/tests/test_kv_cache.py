"""KVCache driven through the TVM KV-cache scenarios (prefill, decode, remove,
fork incl. positioned forks, pop_n, sliding window), against a NumPy model
of every sequence's retained K/V and a float64 attention reference."""

import math

import numpy as np
import pytest

import pagedattn
import numpy_reference as ref

LAYERS, HQ, HKV, D, PAGE = 2, 4, 2, 16, 4

# Tolerances (absolute, on randn data with |out| <~ 2): float32 storage and
# inputs differ from float64 by accumulation order only; float16 / bfloat16
# storage is modelled exactly (values rounded like the cache) but the kernel
# accumulates in float32 and its output is rounded to the input dtype.
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1e-4}
INPUT_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


def stored(x, dtype):
    """x rounded as the cache stores it (float64 result)."""
    if dtype == "float16":
        return np.asarray(x, np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return ref.bf16_value(ref.bf16_bits(np.asarray(x, np.float32))).astype(np.float64)
    return np.asarray(x, np.float32).astype(np.float64)


class Model:
    """What the cache should hold: per sequence, K and V [layers, len, Hkv, D]."""

    def __init__(self, cache, dtype, rope_mode="none", rope_theta=10000.0, rope_scale=1.0,
                 tol=None):
        self.cache, self.dtype, self.rope_mode = cache, dtype, rope_mode
        self.tol = TOL[dtype] if tol is None else tol
        self.theta, self.scale = rope_theta, rope_scale
        self.k, self.v, self.window = {}, {}, {}
        self.rng = np.random.default_rng(7)

    def add(self, sid):
        self.cache.add_sequence(sid)
        self.k[sid] = np.zeros((LAYERS, 0, HKV, D))
        self.v[sid] = np.zeros((LAYERS, 0, HKV, D))

    def remove(self, sid):
        self.cache.remove_sequence(sid)
        del self.k[sid], self.v[sid]
        self.window.pop(sid, None)

    def fork(self, parent, child, pos=-1):
        self.cache.fork_sequence(parent, child, pos)
        n = self.k[parent].shape[1] if pos == -1 else pos
        self.k[child], self.v[child] = self.k[parent][:, :n].copy(), self.v[parent][:, :n].copy()

    def pop_n(self, sid, n):
        self.cache.pop_n(sid, n)
        keep = self.k[sid].shape[1] - n
        self.k[sid], self.v[sid] = self.k[sid][:, :keep], self.v[sid][:, :keep]

    def enable_window(self, sid, size, sink):
        self.cache.enable_sliding_window(sid, size, sink)
        self.window[sid] = (size, sink)

    def step(self, seq_ids, lengths, fused=False):
        """One forward over every layer; checks outputs and the stored K/V."""
        cache, dt = self.cache, INPUT_DTYPE[self.dtype]
        cache.begin_forward(seq_ids, lengths)
        total = sum(lengths)
        new_k = np.zeros((LAYERS, total, HKV, D))
        new_v = np.zeros((LAYERS, total, HKV, D))
        for layer in range(LAYERS):
            q = self.rng.standard_normal((total, HQ, D)).astype(dt)
            k = self.rng.standard_normal((total, HKV, D)).astype(dt)
            v = self.rng.standard_normal((total, HKV, D)).astype(dt)
            if fused:
                out = cache.attention_with_fused_qkv(layer, np.concatenate([q, k, v], axis=1))
            else:
                out = cache.attention(layer, q, k, v)
            assert out.dtype == dt and out.shape == (total, HQ, D)
            offset = 0
            for sid, n in zip(seq_ids, lengths):
                past = self.k[sid].shape[1]
                pos = np.arange(past, past + n)
                qs, ks = q[offset:offset + n], k[offset:offset + n]
                if self.rope_mode != "none":
                    qs = ref.rope(qs, pos, self.theta, self.scale)
                if self.rope_mode == "normal":
                    ks = ref.rope(ks, pos, self.theta, self.scale)
                new_k[layer, offset:offset + n] = stored(ks, self.dtype)
                new_v[layer, offset:offset + n] = stored(v[offset:offset + n], self.dtype)
                keys = np.concatenate([self.k[sid][layer], new_k[layer, offset:offset + n]])
                vals = np.concatenate([self.v[sid][layer], new_v[layer, offset:offset + n]])
                if self.rope_mode == "inline":
                    keys = ref.rope(keys, np.arange(keys.shape[0]), self.theta, self.scale)
                expect = ref.attention(qs, keys, vals, 1 / math.sqrt(D))
                np.testing.assert_allclose(out[offset:offset + n].astype(np.float64), expect,
                                           atol=self.tol, rtol=0)
                offset += n
        cache.end_forward()
        offset = 0
        for sid, n in zip(seq_ids, lengths):
            self.k[sid] = np.concatenate([self.k[sid], new_k[:, offset:offset + n]], axis=1)
            self.v[sid] = np.concatenate([self.v[sid], new_v[:, offset:offset + n]], axis=1)
            offset += n
            if sid in self.window:  # TVM retention: sinks + the most recent tokens
                size, sink = self.window[sid]
                length = self.k[sid].shape[1]
                if length > size:
                    keep = np.r_[0:sink, length - (size - sink):length]
                    self.k[sid], self.v[sid] = self.k[sid][:, keep], self.v[sid][:, keep]
        self.check()

    def check(self):
        cache = self.cache
        cache.check_invariants()
        assert cache.total_sequence_length == sum(k.shape[1] for k in self.k.values())
        for sid in self.k:
            length = self.k[sid].shape[1]
            assert cache.sequence_length(sid) == length
            k, v = cache.get_kv(sid, 0, length)
            assert k.dtype == np.float32 and k.shape == (LAYERS, length, HKV, D)
            np.testing.assert_allclose(k, self.k[sid], atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(v, self.v[sid], atol=1e-5, rtol=1e-5)


def make(dtype="float32", layout="HND", num_pages=64, **kw):
    # f32 products unless a test asks otherwise: TOL is the f32 kernels'.
    kw.setdefault("exact_products", True)
    return pagedattn.KVCache(LAYERS, HQ, HKV, D, PAGE, num_pages, dtype=dtype, layout=layout, **kw)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_prefill_decode_remove(dtype, layout):
    cache = make(dtype, layout)
    assert cache.num_free_pages == 64 and cache.empty()
    m = Model(cache, dtype)
    for sid in (0, 1, 2):
        m.add(sid)
    m.step([0, 1, 2], [7, 1, 9])             # prefill, ragged
    assert cache.num_free_pages == 64 - (2 + 1 + 3)  # ceil(len / page_size) each
    for _ in range(5):
        m.step([2, 0, 1], [1, 1, 1])         # decode in another order
    m.step([1, 0], [6, 0])                   # chunked prefill beside an idle sequence
    m.remove(1)
    m.step([0, 2], [1, 1])
    m.remove(0)
    m.remove(2)
    assert cache.empty() and cache.num_free_pages == 64


# The bf16 allowance of tests/kernels/attention_case.h (3% of a row's largest
# output) on outputs of magnitude up to about 2.
BF16_PRODUCTS_TOL = 0.06


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_products_by_default_and_exact(dtype):
    # By default prefill may take bf16 products (where the one-time timing
    # finds them faster here); exact_products=True keeps f32 and the f32
    # tolerance.
    for exact in (False, True):
        cache = make(dtype, exact_products=exact)
        assert cache.config["exact_products"] == exact
        m = Model(cache, dtype, tol=None if exact else BF16_PRODUCTS_TOL)
        m.add(0)
        m.add(1)
        m.step([0, 1], [37, 12])   # prefill rows: 2 query heads per KV head x 37 and 12 tokens
        m.step([0, 1], [1, 20])    # a decode beside a chunk


def test_fork_positioned_and_pop_n():
    cache = make()
    m = Model(cache, "float32")
    m.add(0)
    m.step([0], [10])
    m.fork(0, 1)            # all tokens: full pages shared, partial page copied
    m.fork(0, 2, 5)         # positioned: first 5 tokens
    m.fork(2, 3, 2)         # fork of a fork
    m.step([0, 1, 2, 3], [1, 2, 3, 4])
    m.pop_n(1, 5)           # rollback into shared pages
    m.pop_n(0, 1)
    m.step([1, 0], [3, 1])
    for sid in (3, 2, 1, 0):
        m.remove(sid)
    assert cache.empty()


def test_sliding_window_with_sinks():
    cache = make(support_sliding_window=True)
    m = Model(cache, "float32")
    m.add(0)
    m.add(1)
    m.enable_window(0, 8, 2)
    m.step([0, 1], [11, 3])  # trimmed at end_forward: 2 sinks + 6 recent
    assert cache.sequence_length(0) == 8
    for _ in range(6):
        m.step([0, 1], [1, 1])
    m.fork(1, 2)             # a window-free sequence forks normally; the child has no window
    m.step([2, 0], [5, 2])
    m.fork(0, 3)             # a windowed one too: the child inherits no window,
    m.step([3, 0], [12, 1])  # so it keeps all 8 + 12 tokens while 0 stays at 8
    assert cache.sequence_length(3) == 20 and cache.sequence_length(0) == 8
    with pytest.raises(ValueError, match="forked from a windowed"):
        cache.enable_sliding_window(3, 8, 2)


@pytest.mark.parametrize("mode", ["normal", "inline"])
def test_rope_modes(mode):
    cache = make(rope_mode=mode, rope_theta=500.0, rope_scale=0.5)
    m = Model(cache, "float32", mode, 500.0, 0.5)
    m.add(0)
    m.add(1)
    m.step([0, 1], [6, 3])
    m.step([0, 1], [1, 2], fused=True)
    m.pop_n(0, 2)
    m.step([1, 0], [1, 1])


def test_set_kv_then_attend():
    cache = make()
    m = Model(cache, "float32")
    m.add(0)
    m.step([0], [6])
    rng = np.random.default_rng(3)
    k = rng.standard_normal((LAYERS, 3, HKV, D)).astype(np.float32)
    v = rng.standard_normal((LAYERS, 3, HKV, D)).astype(np.float32)
    cache.set_kv(0, 2, 5, k, v)
    m.k[0][:, 2:5], m.v[0][:, 2:5] = k, v
    m.check()
    m.step([0], [2])


def test_fresh_cache_properties_and_help():
    cache = make(num_pages=10)
    assert cache.num_free_pages == 10 and cache.total_sequence_length == 0 and cache.empty()
    doc = pagedattn.KVCache.__doc__
    for word in ("begin_forward", "[T, Hq, D]", "OutOfPagesError", "rope_mode"):
        assert word in doc
    for name in ("attention", "get_kv", "begin_forward", "fork_sequence"):
        assert getattr(pagedattn.KVCache, name).__doc__


def test_token_tree_attention_and_commit():
    """TVM's 7-node binary tree after a 5-token prefix (normal RoPE: K rotated
    at committed length + depth), checked node by node against attention over
    the prefix plus the node's ancestors; then the path 0 -> 2 -> 5 is
    committed and a decode step runs on top of it."""
    cache = make(rope_mode="normal")
    m = Model(cache, "float32", rope_mode="normal")
    m.add(0)
    m.step([0], [5])
    parents = [-1, 0, 0, 1, 1, 2, 2]
    depth = [0, 1, 1, 2, 2, 2, 2]
    past = 5
    cache.begin_forward([0], [7], token_tree_parents=parents)
    assert cache.token_tree_size(0) == 7
    rng = np.random.default_rng(3)
    tree_k = np.zeros((LAYERS, 7, HKV, D))
    tree_v = np.zeros((LAYERS, 7, HKV, D))
    for layer in range(LAYERS):
        q, k, v = (rng.standard_normal((7, h, D)).astype(np.float32) for h in (HQ, HKV, HKV))
        out = cache.attention(layer, q, k, v)
        pos = past + np.array(depth)
        tree_k[layer] = ref.rope(k, pos).astype(np.float32)
        tree_v[layer] = v
        qr = ref.rope(q, pos)
        for node in range(7):
            path, a = [], node
            while a != -1:
                path.append(a)
                a = parents[a]
            path.sort()
            keys = np.concatenate([m.k[0][layer], tree_k[layer, path]])
            vals = np.concatenate([m.v[0][layer], tree_v[layer, path]])
            expect = ref.attention(qr[node:node + 1], keys, vals, 1 / math.sqrt(D))
            np.testing.assert_allclose(out[node:node + 1], expect, atol=TOL["float32"], rtol=0)
    cache.end_forward()
    with pytest.raises(pagedattn.InvalidStateError, match="tree"):
        cache.begin_forward([0], [1])
    cache.commit_accepted_token_tree_nodes([0], [5])
    assert cache.token_tree_size(0) == 0
    m.k[0] = np.concatenate([m.k[0], tree_k[:, [0, 2, 5]]], axis=1)
    m.v[0] = np.concatenate([m.v[0], tree_v[:, [0, 2, 5]]], axis=1)
    m.check()
    with pytest.raises(pagedattn.InvalidStateError):
        cache.commit_accepted_token_tree_nodes([0], [0])  # no open tree
    m.step([0], [1])  # decode at position 8 on the committed path


def test_mla_cache_attends_with_the_latent_as_values():
    """attention_kind="mla": one [latent | rope] row per token, V = its first
    v_head_dim elements; prefill, decode, fork and swap-free steps against a
    float64 reference that takes V from the stored rows."""
    latent, width, heads = 12, 16, 6
    cache = pagedattn.KVCache(2, heads, 1, width, 4, 32, dtype="bfloat16", v_head_dim=latent,
                              attention_kind="mla")
    assert cache.config["attention_kind"] == "mla"
    rng = np.random.default_rng(5)
    rows = {}
    cache.add_sequence(0)
    for n in (7, 1, 1):
        cache.begin_forward([0], [n])
        for layer in range(2):
            q = rng.standard_normal((n, heads, width)).astype(np.float32)
            k = rng.standard_normal((n, 1, width)).astype(np.float32)
            out = cache.attention(layer, q, k)
            assert out.shape == (n, heads, latent)
            stored_rows = np.concatenate([rows.get(layer, np.zeros((0, 1, width))),
                                          stored(k, "bfloat16")])
            rows[layer] = stored_rows
            keys = stored_rows
            vals = stored_rows[:, :, :latent]
            expect = ref.attention(q, keys, vals, 1 / math.sqrt(width))
            np.testing.assert_allclose(out.astype(np.float64), expect, atol=TOL["bfloat16"],
                                       rtol=0)
        cache.end_forward()
    k, v = cache.get_kv(0, 0, 9)
    np.testing.assert_array_equal(v, k[..., :latent])
    cache.fork_sequence(0, 1, 5)
    cache.check_invariants()
    with pytest.raises(ValueError, match="v must be None"):
        cache.set_kv(1, 0, 2, k[:, :2], v[:, :2])
    ones = np.ones((2, 1, 1, width), np.float32)
    cache.set_kv(1, 4, 5, ones)  # the fork's own copy of the partial page
    k1, v1 = cache.get_kv(1, 4, 5)
    np.testing.assert_array_equal(k1, ones)
    np.testing.assert_array_equal(v1, ones[..., :latent])
    with pytest.raises(ValueError, match="attention_kind"):
        pagedattn.KVCache(1, 2, 1, 8, 4, 8, attention_kind="latent")
    with pytest.raises(ValueError, match="num_kv_heads = 2"):
        pagedattn.KVCache(1, 2, 2, 8, 4, 8, attention_kind="mla")
