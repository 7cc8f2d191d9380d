"""KVCache.begin_forward's BatchPlan and KVCache.layer_storage: zero-copy
views checked against the cache's own page lists, and used with
pagedattn.ops (vLLM decode, torch_xla ragged) to reproduce KVCache.attention."""
import gc

import numpy as np
import pytest

import pagedattn
from pagedattn import ops

import numpy_reference as ref

HQ, HKV, D = 4, 2, 8


def make_cache(layout="HND", dtype="float32", page_size=4, num_pages=32, **options):
    return pagedattn.KVCache(num_layers=2, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                             page_size=page_size, num_pages=num_pages, dtype=dtype,
                             layout=layout, **options)


def qkv(rng, tokens):
    return (rng.standard_normal((tokens, HQ, D)).astype(np.float32),
            rng.standard_normal((tokens, HKV, D)).astype(np.float32),
            rng.standard_normal((tokens, HKV, D)).astype(np.float32))


def run_step(cache, rng, seq_ids, lengths):
    """One step through KVCache.attention on every layer; returns (plan, outs, qs)."""
    plan = cache.begin_forward(seq_ids, lengths)
    outs, qs = [], []
    for layer in range(2):
        q, k, v = qkv(rng, plan.num_tokens)
        outs.append(cache.attention(layer, q, k, v))
        qs.append(q)
    cache.end_forward()
    return plan, outs, qs


def expected_plan(cache, seq_ids, old_lengths, lengths, page_size):
    """The plan built from the cache's page lists (taken inside the step)."""
    qo, kv_indptr, indices, last, kv_lens, positions, slots = [0], [0], [], [], [], [], []
    for sid, old, n in zip(seq_ids, old_lengths, lengths):
        pages = cache.sequence_pages(sid)
        total = old + n
        qo.append(qo[-1] + n)
        kv_indptr.append(kv_indptr[-1] + len(pages))
        indices += pages
        last.append(total - (len(pages) - 1) * page_size if pages else 0)
        kv_lens.append(total)
        for p in range(old, total):
            positions.append(p)
            slots.append(pages[p // page_size] * page_size + p % page_size)
    return dict(qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=indices, kv_last_page_len=last,
                kv_lens=kv_lens, positions=positions, slot_mapping=slots)


def test_plan_arrays_equal_the_cache_page_lists_and_are_read_only_views():
    rng = np.random.default_rng(0)
    cache = make_cache()
    for sid in (7, 3):
        cache.add_sequence(sid)
    run_step(cache, rng, [7, 3], [5, 2])
    cache.fork_sequence(7, 9, 3)
    seq_ids, lengths = [9, 3, 7], [2, 6, 1]
    old = [cache.sequence_length(s) for s in seq_ids]
    plan = cache.begin_forward(seq_ids, lengths)
    expected = expected_plan(cache, seq_ids, old, lengths, 4)
    assert plan.batch_size == 3 and plan.num_tokens == 9 and plan.page_size == 4
    assert not plan.has_gaps and not plan.has_tree
    assert plan.seq_ids.dtype == np.int64 and plan.seq_ids.tolist() == seq_ids
    for name, values in expected.items():
        array = getattr(plan, name)
        assert array.tolist() == values, name
        assert array.dtype == (np.int64 if name == "slot_mapping" else np.int32), name
        assert not array.flags.writeable, name
        with pytest.raises(ValueError):
            array[...] = 0
    # Every access is a view of the same snapshot, not a copy.
    assert np.shares_memory(plan.kv_indices, plan.kv_indices)
    assert plan.kv_indices.__array_interface__["data"][0] == \
        plan.kv_indices.__array_interface__["data"][0]
    assert cache.plan().kv_indices.tolist() == expected["kv_indices"]
    table = plan.block_table(pad=-1)
    for b, sid in enumerate(seq_ids):
        pages = cache.sequence_pages(sid)
        assert table[b, :len(pages)].tolist() == pages
        assert (table[b, len(pages):] == -1).all()

    # The views stay valid after the step ended and the plan object is gone.
    kv_indices, slots = plan.kv_indices, plan.slot_mapping
    cache.cancel_forward()
    del plan
    gc.collect()
    assert kv_indices.tolist() == expected["kv_indices"]
    assert slots.tolist() == expected["slot_mapping"]


def test_token_tree_plan_arrays():
    cache = make_cache()
    cache.add_sequence(0)
    plan = cache.begin_forward([0], [3], token_tree_parents=[-1, 0, 0])
    assert plan.has_tree
    assert plan.tree_begin.tolist() == [0]
    assert plan.tree_node_indptr.tolist() == [0, 3]
    assert plan.positions.tolist() == [0, 1, 1]
    assert plan.tree_positions.tolist() == [0, 1, 1]
    # Node 0 is the ancestor of both children: its DFS interval holds theirs.
    enter, exit_ = plan.tree_enter.tolist(), plan.tree_exit.tolist()
    assert enter[0] <= enter[1] <= exit_[0] and enter[0] <= enter[2] <= exit_[0]
    assert not (enter[1] <= enter[2] <= exit_[1])
    cache.cancel_forward()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_storage_views_show_the_pages_attention_wrote(layout):
    rng = np.random.default_rng(1)
    cache = make_cache(layout)
    cache.add_sequence(0)
    plan = cache.begin_forward([0], [6])
    written = []
    for layer in range(2):
        q, k, v = qkv(rng, 6)
        cache.attention(layer, q, k, v)
        written.append((k, v))
    cache.end_forward()
    for layer, (k, v) in enumerate(written):
        st = cache.layer_storage(layer)
        assert st.layout == layout and st.dtype == "float32" and st.page_size == 4
        shape = (32, HKV, 4, D) if layout == "HND" else (32, 4, HKV, D)
        assert st.k.shape == shape and st.v.shape == shape
        assert st.k_scales is None and st.k_head_scales is None
        for t, slot in enumerate(plan.slot_mapping):
            page, offset = divmod(int(slot), 4)
            got_k = st.k[page, :, offset] if layout == "HND" else st.k[page, offset]
            got_v = st.v[page, :, offset] if layout == "HND" else st.v[page, offset]
            np.testing.assert_array_equal(got_k, k[t])
            np.testing.assert_array_equal(got_v, v[t])


def test_storage_views_keep_the_cache_alive_and_are_writable():
    cache = make_cache("NHD")
    cache.add_sequence(0)
    cache.begin_forward([0], [3])
    storage = [cache.layer_storage(layer) for layer in range(2)]
    slots = cache.plan().slot_mapping
    rng = np.random.default_rng(2)
    ks = rng.standard_normal((2, 3, HKV, D)).astype(np.float32)
    vs = rng.standard_normal((2, 3, HKV, D)).astype(np.float32)
    for layer, st in enumerate(storage):
        # Our own "kernel": vLLM's reshape_and_cache into the views.
        ops.reshape_and_cache(ks[layer], vs[layer], st.k, st.v, slots, layout="NHD")
        cache.mark_layer_appended(layer)
    cache.end_forward()
    k, v = cache.get_kv(0, 0, 3)
    np.testing.assert_array_equal(k, ks)
    np.testing.assert_array_equal(v, vs)
    view = storage[0].k
    del cache, storage
    gc.collect()
    page, offset = divmod(int(slots[0]), 4)
    np.testing.assert_array_equal(view[page, offset], ks[0, 0])


def test_a_step_not_marked_is_refused():
    cache = make_cache()
    cache.add_sequence(0)
    cache.begin_forward([0], [2])
    cache.mark_layer_appended(0)
    with pytest.raises(pagedattn.InvalidStateError):
        cache.end_forward()
    cache.mark_layer_appended(1)
    cache.end_forward()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_vllm_decode_over_the_views_equals_cache_attention(layout):
    rng = np.random.default_rng(3)
    cache = make_cache(layout)
    ids = [0, 1, 2]
    for sid in ids:
        cache.add_sequence(sid)
    run_step(cache, rng, ids, [5, 9, 1])
    plan, outs, qs = run_step(cache, rng, ids, [1, 1, 1])
    for layer in range(2):
        st = cache.layer_storage(layer)
        out = ops.paged_attention_decode(qs[layer], st.k, st.v, plan.block_table(), plan.kv_lens,
                                         num_kv_heads=HKV, scale=D ** -0.5, layout=layout)
        np.testing.assert_allclose(out, outs[layer], rtol=1e-5, atol=1e-6)


def test_ragged_paged_attention_over_the_views_equals_cache_attention():
    rng = np.random.default_rng(4)
    cache = make_cache("NHD")
    ids = [0, 1]
    for sid in ids:
        cache.add_sequence(sid)
    run_step(cache, rng, ids, [6, 2])
    plan, outs, qs = run_step(cache, rng, ids, [3, 1])  # a prefill chunk beside a decode
    for layer in range(2):
        st = cache.layer_storage(layer)
        # torch_xla interleaves K and V heads in one page array: a copy here.
        kv_pages = np.empty(st.k.shape[:2] + (2 * HKV, D), np.float32)
        kv_pages[:, :, 0::2], kv_pages[:, :, 1::2] = st.k, st.v
        out = ops.ragged_paged_attention(qs[layer], kv_pages, plan.kv_lens, plan.block_table(),
                                         plan.qo_indptr, plan.batch_size, sm_scale=D ** -0.5)
        np.testing.assert_allclose(out, outs[layer], rtol=1e-5, atol=1e-6)


def reference_logits(q, k, scale, softcap=0.0, alibi=None):
    """[n, Hq, L] logits of one sequence whose n queries are its last n keys."""
    n, length = q.shape[0], k.shape[0]
    group = HQ // HKV
    s = np.einsum("nhd,lhd->nhl", q.astype(np.float64),
                  np.repeat(k.astype(np.float64), group, axis=1)) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if alibi is not None:
        p = np.arange(length - n, length)
        s += alibi[None, :, None] * (np.arange(length)[None, None, :] - p[:, None, None])
    return s


@pytest.mark.parametrize("options", [
    dict(causal=False),
    dict(window_left=2),
    dict(softcap=2.0),
    dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
    dict(sinks=[0.5, -1.0, 2.0, 0.0]),
])
def test_attention_options_match_the_numpy_reference(options):
    rng = np.random.default_rng(5)
    cache = make_cache()
    cache.add_sequence(0)
    cache.begin_forward([0], [7])
    q, k, v = qkv(rng, 7)
    out, lse = cache.attention(0, q, k, v, return_lse=True, **options)
    ref_options = {key: np.asarray(value) if isinstance(value, list) else value
                   for key, value in options.items()}
    expected = ref.attention(q, k, v, D ** -0.5, **ref_options)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert lse.shape == (7, HQ) and lse.dtype == np.float32
    if "sinks" not in options and "window_left" not in options:
        s = reference_logits(q, k, D ** -0.5, options.get("softcap", 0.0),
                             ref_options.get("alibi_slopes"))
        if options.get("causal", True):
            s = np.where(np.arange(7)[None, None, :] <= np.arange(7)[:, None, None], s, -np.inf)
        m = s.max(axis=2)
        expected_lse = m + np.log(np.exp(s - m[..., None]).sum(axis=2))
        np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)
    cache.attention(1, q, k, v)
    cache.end_forward()


def test_attention_option_errors_name_the_argument():
    cache = make_cache()
    cache.add_sequence(0)
    cache.begin_forward([0], [1])
    q, k, v = qkv(np.random.default_rng(6), 1)
    digest = cache.state_digest()
    with pytest.raises(ValueError, match="alibi_slopes"):
        cache.attention(0, q, k, v, alibi_slopes=[1.0, 2.0])
    with pytest.raises(ValueError, match="sinks"):
        cache.attention(0, q, k, v, sinks=np.zeros((2, 2)))
    assert cache.state_digest() == digest
    cache.cancel_forward()


def test_queries_and_the_config():
    cache = make_cache(num_pages=0, memory_budget_bytes=10_000)
    assert cache.num_pages == 10_000 // cache.bytes_per_page
    assert cache.config["num_pages"] == cache.num_pages
    assert cache.config["memory_budget_bytes"] == 10_000
    cache.add_sequence(4)
    cache.add_sequence(2)
    assert cache.sequence_ids() == [2, 4] and cache.num_sequences == 2
    assert cache.has_sequence(4) and not cache.has_sequence(5)
    assert cache.pages_needed([4, 2], [5, 4]) == 3
    assert cache.can_append([4], [4 * cache.num_pages])
    assert not cache.can_append([4], [4 * cache.num_pages + 1])
    assert not cache.in_forward
    digest = cache.state_digest()
    cache.begin_forward([4], [3])
    assert cache.in_forward
    assert len(cache.sequence_pages(4)) == 1
    assert cache.page_refcount(cache.sequence_pages(4)[0]) == 1
    cache.cancel_forward()
    assert cache.state_digest() == digest


def test_rope_and_fp8_options_reach_the_config():
    cache = make_cache(dtype="float8_e4m3fn", rope_mode="normal", k_scale=[0.5, 2.0], v_scale=0.25,
                       rotary_dim=4, rope_interleaved=True,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192},
                       fixed_kv_chunk=64)
    c = cache.config
    assert c["k_head_scales"] == [0.5, 2.0] and c["v_scale"] == 0.25
    assert c["rotary_dim"] == 4 and c["rope_interleaved"] and c["fixed_kv_chunk"] == 64
    assert not c["exact_products"]
    assert make_cache(exact_products=True).config["exact_products"]
    st = cache.layer_storage(0)
    assert st.k_head_scales.tolist() == [0.5, 2.0] and st.v_head_scales is None
    assert st.v_scale == 0.25 and st.k.itemsize == 1
    with pytest.raises(ValueError, match="rope_scaling"):
        make_cache(rope_scaling={"rope_type": "yarn"})


def test_rope_options_match_the_numpy_reference():
    rng = np.random.default_rng(8)
    cache = make_cache(rope_mode="normal", rotary_dim=4, rope_interleaved=True)
    cache.add_sequence(0)
    cache.begin_forward([0], [5])
    q, k, v = qkv(rng, 5)
    out = cache.attention(0, q, k, v)
    cache.attention(1, q, k, v)
    cache.end_forward()
    positions = np.arange(5)
    rq = ref.rope(q, positions, interleaved=True, rotary_dim=4)
    rk = ref.rope(k, positions, interleaved=True, rotary_dim=4)
    np.testing.assert_allclose(out, ref.attention(rq, rk, v, D ** -0.5), rtol=1e-4, atol=1e-5)


def test_int8_storage_has_per_token_scales():
    cache = make_cache(dtype="int8")
    cache.add_sequence(0)
    run_step(cache, np.random.default_rng(7), [0], [3])
    st = cache.layer_storage(1)
    assert st.k.dtype == np.int8 and st.k_scales.shape == (32, HKV, 4)
    # A page's scales sit in its K page, after the K block: one page stride.
    assert st.k_scales.strides == (st.k.strides[0], 4 * 4, 4) == st.v_scales.strides
    page = cache.sequence_pages(0)[0]
    k, _ = cache.get_kv(0, 0, 3)
    # Dequantised storage (stored * scale) is what get_kv reads.
    dequantised = st.k[page, :, :3].astype(np.float32) * st.k_scales[page, :, :3, None]
    np.testing.assert_allclose(dequantised.transpose(1, 0, 2), k[1], rtol=1e-6)


def test_index_arrays_accept_lists_and_convert_int64():
    rng = np.random.default_rng(9)
    cache = make_cache("NHD")
    cache.add_sequence(0)
    plan, outs, qs = run_step(cache, rng, [0], [5])
    st = cache.layer_storage(0)
    q = qs[0][-1:]
    expected = ops.paged_attention_decode(q, st.k, st.v, plan.block_table(), plan.kv_lens,
                                          num_kv_heads=HKV, scale=0.3)
    table = plan.block_table().tolist()
    for tables, lens in [(table, [5]), (np.array(table, np.int64), np.array([5], np.int64))]:
        got = ops.paged_attention_decode(q, st.k, st.v, tables, lens, num_kv_heads=HKV, scale=0.3)
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"seq_lens holds 4294967296"):
        ops.paged_attention_decode(q, st.k, st.v, table, np.array([2 ** 32], np.int64),
                                   num_kv_heads=HKV, scale=0.3)
    with pytest.raises(TypeError, match="block_tables"):
        ops.paged_attention_decode(q, st.k, st.v, np.zeros((1, 2), np.float32), [5],
                                   num_kv_heads=HKV, scale=0.3)


def test_sliding_window_plans_carry_the_sink_and_gap():
    rng = np.random.default_rng(10)
    cache = make_cache(support_sliding_window=True)
    cache.add_sequence(0)
    cache.enable_sliding_window(0, window_size=6, attn_sink_size=2)
    for _ in range(3):
        run_step(cache, rng, [0], [4])
    plan = cache.begin_forward([0], [1])
    assert plan.has_gaps
    assert plan.kv_sink_lens.tolist() == [2]
    assert plan.kv_lens.tolist() == [7] and plan.kv_gap_lens[0] > 0
    # Key j >= sink sits at slot j + gap of the sequence's pages.
    slot = plan.kv_lens[0] - 1 + plan.kv_gap_lens[0]
    pages = cache.sequence_pages(0)
    assert plan.slot_mapping[0] == pages[slot // 4] * 4 + slot % 4
    assert cache.num_step_tokens == 1
    cache.cancel_forward()


def test_fused_qkv_takes_the_options_too():
    rng = np.random.default_rng(11)
    cache = make_cache()
    cache.add_sequence(0)
    cache.begin_forward([0], [3])
    q, k, v = qkv(rng, 3)
    fused = np.concatenate([q, k, v], axis=1)
    out, lse = cache.attention_with_fused_qkv(0, fused, softcap=5.0, return_lse=True)
    expected = ref.attention(q, k, v, D ** -0.5, softcap=5.0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert lse.shape == (3, HQ)
    cache.attention(1, q, k, v)
    cache.end_forward()
    assert cache.storage_bytes == cache.bytes_per_page * cache.num_pages
    assert not cache.has_open_token_tree(0)
