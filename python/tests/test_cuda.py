"""pagedattn.cuda: the CUDA backend on torch CUDA tensors (DLPack, in place).

Host tests (any machine with a package built with the CUDA backend): the
module imports without a GPU, device_count() is 0 there with a reason, CPU
tensors are refused naming the argument, BatchAttention validates its
arguments. GPU tests (skipped without a device, saying why) check
BatchAttention against a plain torch reference (softmax of q k^T over the
gathered pages, GQA, bottom-right causal), reshape_and_cache against
index_put, the block ops, RoPE, merge_states and the stream argument.
"""

import glob
import math
import zlib

import numpy as np
import pytest

import pagedattn
from pagedattn import _core

if not hasattr(_core, "cuda"):
    pytest.skip("pagedattn was built without its CUDA backend (CMake found no nvcc): "
                "pagedattn.cuda does not exist", allow_module_level=True)

import pagedattn.cuda as cuda  # noqa: E402

try:
    import torch
except ImportError:  # the host tests that need tensors skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def gpu_skip_reason():
    if torch is None:
        return "needs torch"
    if cuda.device_count() == 0:
        return f"no CUDA device: {cuda.no_device_reason()}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (a CPU build of torch?)"
    return None


needs_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
# Linux exposes a GPU as /dev/nvidia<N>; without any, there is none to see.
no_gpu_here = pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")),
                                 reason="this machine has an NVIDIA device node")

# --- host tests ------------------------------------------------------------------------------


def test_module_exports_its_names():
    for name in cuda.__all__:
        assert hasattr(cuda, name), name
    assert issubclass(cuda.BatchAttention, _core.cuda.BatchAttention)
    assert pagedattn.cuda is cuda


def test_device_count_and_reason_agree():
    count = cuda.device_count()
    reason = cuda.no_device_reason()
    assert isinstance(count, int) and count >= 0
    assert isinstance(reason, str)
    assert (reason == "") == (count > 0), (count, reason)


@no_gpu_here
def test_no_device_without_a_gpu():
    assert cuda.device_count() == 0
    assert cuda.no_device_reason().strip()
    with pytest.raises(pagedattn.UnsupportedError):
        cuda.device_info()


def cpu_cases():
    """(call name, callable, name of its first CUDA argument) on CPU tensors."""
    key = torch.zeros(2, 1, 8)
    cache = torch.zeros(4, 16, 1, 8)
    slots = torch.zeros(2, dtype=torch.int64)
    v = torch.zeros(3, 8)
    s = torch.zeros(3)
    return [
        ("reshape_and_cache", lambda: cuda.reshape_and_cache(key, key, cache, cache, slots), "key"),
        ("copy_blocks", lambda: cuda.copy_blocks(cache, cache, [(0, 1)]), "key_cache"),
        ("apply_rope", lambda: cuda.apply_rope(key, torch.zeros(2, dtype=torch.int32)), "x"),
        ("merge_states", lambda: cuda.merge_states(v, s, v, s, v, s), "v_a"),
        ("merge_states", lambda: _core.cuda.merge_states(v, s, v, s, v, s), "v_a"),
    ]


@needs_torch
@pytest.mark.parametrize("index", range(5))
def test_cpu_tensor_is_refused_naming_the_argument(index):
    call, fn, name = cpu_cases()[index]
    with pytest.raises(TypeError, match=rf"{call}: {name} must be a CUDA tensor"):
        fn()


def test_numpy_array_and_list_are_refused():
    with pytest.raises(TypeError, match=r"apply_rope: x must be a CUDA tensor"):
        cuda.apply_rope(np.zeros((2, 1, 8), np.float32), np.zeros(2, np.int32))
    with pytest.raises(TypeError, match=r"apply_rope: x must be a CUDA tensor.*got list"):
        cuda.apply_rope([1.0], [0])


@needs_torch
def test_swap_blocks_needs_one_host_and_one_device_cache():
    cache = torch.zeros(4, 16, 1, 8)
    with pytest.raises(ValueError, match=r"swap_blocks: one of src and dst must be a CPU tensor"):
        cuda.swap_blocks(cache, cache.clone(), [(0, 1)])


@needs_torch
@pytest.mark.parametrize("stream, error", [("s", TypeError), (1.5, TypeError), (-3, ValueError)])
def test_bad_stream_is_refused(stream, error):
    v, s = torch.zeros(3, 8), torch.zeros(3)
    with pytest.raises(error, match=r"merge_states: stream"):
        _core.cuda.merge_states(v, s, v, s, v, s, stream=stream)


def test_batch_attention_keeps_its_configuration():
    attn = cuda.BatchAttention(8, 2, 128, 16, layout="HND", kv_dtype="float16", window_left=7,
                               softcap=30.0, scale=0.1)
    assert (attn.num_qo_heads, attn.num_kv_heads) == (8, 2)
    assert (attn.head_dim, attn.v_head_dim) == (128, 128)
    assert (attn.page_size, attn.layout, attn.kv_dtype) == (16, "HND", "float16")
    assert attn.batch_size is None and attn.num_tokens is None and attn.workspace_bytes == 0
    assert cuda.BatchAttention(4, 1, 576, 1, v_head_dim=512).v_head_dim == 512


@pytest.mark.parametrize("kwargs, name", [
    (dict(layout="NDH"), "layout"),
    (dict(layout="nhd"), "layout"),
    (dict(kv_dtype="float32"), "kv_dtype"),
    (dict(kv_dtype="fp16"), "kv_dtype"),
    (dict(num_qo_heads=6), "num_qo_heads"),
    (dict(num_qo_heads=0), "num_qo_heads"),
    (dict(num_kv_heads=0), "num_kv_heads"),
    (dict(head_dim=0), "head_dim"),
    (dict(v_head_dim=0), "v_head_dim"),
    (dict(page_size=0), "page_size"),
    (dict(window_left=-2), "window_left"),
    (dict(softcap=-1.0), "softcap"),
    (dict(softcap=math.inf), "softcap"),
    (dict(scale=math.nan), "scale"),
])
def test_batch_attention_validates_its_arguments(kwargs, name):
    args = dict(num_qo_heads=8, num_kv_heads=4, head_dim=64, page_size=16)
    args.update(kwargs)
    positional = [args.pop(k) for k in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size")]
    with pytest.raises(ValueError, match=rf"BatchAttention: {name}") as error:
        cuda.BatchAttention(*positional, **args)
    assert isinstance(error.value, pagedattn.InvalidArgumentError)


def test_batch_attention_refuses_a_non_integer_head_count():
    with pytest.raises(TypeError, match=r"BatchAttention: head_dim must be an int"):
        cuda.BatchAttention(8, 4, 64.0, 16)


@pytest.mark.parametrize("args, kwargs, match", [
    (([0, 1], [0, 1], [0], [1]), dict(kv_lens=[1]), "exactly one of kv_last_page_len and kv_lens"),
    (([0, 1], [0, 1], [0]), {}, "exactly one of kv_last_page_len and kv_lens"),
    (([1, 2], [0, 1], [0], [1]), {}, r"qo_indptr\[0\] = 1 must be 0"),
    (([0, 2, 1], [0, 1, 2], [0, 1], [1, 1]), {}, r"qo_indptr decreases at \[2\]"),
    (([0, 1], [0, 1, 2], [0, 1], [1]), {}, "kv_indptr has 3 entries"),
    (([0, 1], [0, 3], [0, 1], [1]), {}, "kv_indices has 2 entries but kv_indptr"),
    (([0, 1], [0, 1], [0], [17]), {}, r"kv_last_page_len\[0\] = 17"),
    (([0, 1], [0, 1], [0], [1, 1]), {}, "kv_last_page_len has 2 entries"),
    (([0, 1], [0, 1], [0]), dict(kv_lens=[-1]), r"kv_lens\[0\] = -1"),
    (([0, 1], [0, 1], [0], [1]), dict(num_sms=-1), "num_sms"),
    (([0, 1], [0, 1], [[0]], [1]), {}, "kv_indices must be 1-D"),
])
def test_plan_validates_the_page_table_on_the_host(args, kwargs, match):
    attn = cuda.BatchAttention(4, 2, 64, 16)
    with pytest.raises(ValueError, match=match):
        attn.plan(*args, **kwargs)


@no_gpu_here
def test_plan_without_a_device_says_so():
    attn = cuda.BatchAttention(4, 2, 64, 16)
    with pytest.raises(pagedattn.UnsupportedError, match="no CUDA device"):
        attn.plan([0, 1], [0, 1], [0], [1])


@needs_torch
def test_run_before_plan_is_refused():
    attn = cuda.BatchAttention(4, 2, 64, 16)
    q = torch.zeros(1, 4, 64)
    cache = torch.zeros(1, 16, 2, 64)
    with pytest.raises(pagedattn.InvalidStateError, match="call plan"):
        attn.run(q, cache, cache)


# --- GPU tests: helpers -----------------------------------------------------------------------

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16} if torch is not None else {}
# Prefill products run on tensor cores in the K/V type (queries and softmax
# weights rounded to it): bf16 keeps 8 significant bits, f16 11.
TOLERANCE = {"bfloat16": 3e-2, "float16": 6e-3}


class PagedBatch:
    """A ragged batch in shuffled pages of NaN-poisoned caches (unused slots NaN)."""

    def __init__(self, q_lens, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype,
                 generator, v_head_dim=None, spare_pages=3):
        self.q_lens, self.kv_lens, self.page_size = list(q_lens), list(kv_lens), page_size
        self.layout = layout
        v_head_dim = v_head_dim or head_dim
        pages_per_seq = [-(-n // page_size) for n in kv_lens]
        num_pages = sum(pages_per_seq) + spare_pages
        order = torch.randperm(num_pages, generator=generator).tolist()
        self.kv_indptr = [0]
        self.kv_indices = []
        for n in pages_per_seq:
            self.kv_indices += order[self.kv_indptr[-1]:self.kv_indptr[-1] + n]
            self.kv_indptr.append(self.kv_indptr[-1] + n)
        self.qo_indptr = [0]
        for n in q_lens:
            self.qo_indptr.append(self.qo_indptr[-1] + n)
        self.kv_last_page_len = [n - (p - 1) * page_size if p else 0
                                 for n, p in zip(kv_lens, pages_per_seq)]
        # Dense per-sequence K/V [kv_len, Hkv, D] in the cache dtype.
        self.keys = [torch.randn(n, num_kv_heads, head_dim, generator=generator).to(dtype)
                     for n in kv_lens]
        self.values = [torch.randn(n, num_kv_heads, v_head_dim, generator=generator).to(dtype)
                       for n in kv_lens]
        nhd_k = torch.full((num_pages, page_size, num_kv_heads, head_dim), math.nan, dtype=dtype)
        nhd_v = torch.full((num_pages, page_size, num_kv_heads, v_head_dim), math.nan, dtype=dtype)
        for b, n in enumerate(kv_lens):
            pages = torch.tensor(self.page_ids(b), dtype=torch.int64)
            slots = torch.arange(n)
            nhd_k[pages[slots // page_size], slots % page_size] = self.keys[b]
            nhd_v[pages[slots // page_size], slots % page_size] = self.values[b]
        if layout == "HND":
            nhd_k, nhd_v = (c.permute(0, 2, 1, 3).contiguous() for c in (nhd_k, nhd_v))
        self.k_cache, self.v_cache = nhd_k.cuda(), nhd_v.cuda()

    def page_ids(self, b):
        return self.kv_indices[self.kv_indptr[b]:self.kv_indptr[b + 1]]


def reference_attention(q, batch, scale=None):
    """softmax(scale q k^T + causal mask) v per sequence in float64 (GQA: query head h
    reads KV head h // group); returns (out [T, Hq, Dv], lse [T, Hq])."""
    num_qo_heads = q.shape[1]
    outs, lses = [], []
    for b, (q_len, kv_len) in enumerate(zip(batch.q_lens, batch.kv_lens)):
        qb = q[batch.qo_indptr[b]:batch.qo_indptr[b + 1]].double().cpu()
        k, v = batch.keys[b].double(), batch.values[b].double()
        group = num_qo_heads // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = (scale or 1.0 / math.sqrt(q.shape[2])) * torch.einsum("ihd,jhd->hij", qb, k)
        visible = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
        s = s.masked_fill(~visible, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # [H, q_len]
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hij,jhd->ihd", p, v))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def gathered_keys(batch, b):
    """Sequence b's keys read back from the device cache through its page table."""
    pages = torch.tensor(batch.page_ids(b), dtype=torch.int64, device="cuda")
    k = batch.k_cache[pages]
    if batch.layout == "HND":
        k = k.permute(0, 2, 1, 3)
    return k.reshape(-1, *k.shape[2:])[:batch.kv_lens[b]]


# --- GPU tests ----------------------------------------------------------------------------------

CASES = {
    # name: (q_lens, kv_lens)
    "decode": ([1, 1, 1, 1, 1], [1, 17, 33, 100, 300]),
    "prefill": ([7, 1, 40, 0, 64], [7, 45, 40, 9, 200]),
}


@needs_gpu
@pytest.mark.parametrize("mode", sorted(CASES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
def test_batch_attention_matches_torch(mode, layout, kv_dtype):
    g = torch.Generator().manual_seed(zlib.crc32(f"{mode} {layout} {kv_dtype}".encode()))
    q_lens, kv_lens = CASES[mode]
    num_qo_heads, num_kv_heads, head_dim, page_size = 8, 2, 128, 16
    dtype = DTYPES[kv_dtype]
    batch = PagedBatch(q_lens, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype, g)
    for b in range(len(kv_lens)):  # the caches hold what the reference reads
        assert torch.equal(gathered_keys(batch, b).cpu(), batch.keys[b])
    q = torch.randn(sum(q_lens), num_qo_heads, head_dim, generator=g).to(dtype).cuda()
    attn = cuda.BatchAttention(num_qo_heads, num_kv_heads, head_dim, page_size, layout=layout,
                               kv_dtype=kv_dtype)
    attn.plan(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len)
    lse = torch.empty(sum(q_lens), num_qo_heads, dtype=torch.float32, device="cuda")
    out = attn.run(q, batch.k_cache, batch.v_cache, lse=lse)
    torch.cuda.synchronize()
    assert attn.batch_size == len(q_lens) and attn.num_tokens == sum(q_lens)
    ref_out, ref_lse = reference_attention(q, batch)
    tol = TOLERANCE[kv_dtype]
    assert out.dtype == dtype and out.shape == (sum(q_lens), num_qo_heads, head_dim)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=tol, rtol=tol)


@needs_gpu
@pytest.mark.parametrize("head_dim, v_head_dim, page_size", [(80, 80, 1), (96, 64, 7),
                                                             (64, 64, 256)])
def test_batch_attention_odd_shapes_and_kv_lens(head_dim, v_head_dim, page_size):
    g = torch.Generator().manual_seed(head_dim * 1000 + page_size)
    q_lens, kv_lens = [1, 3, 0, 20], [1, 50, 0, 20]
    batch = PagedBatch(q_lens, kv_lens, 1, head_dim, page_size, "NHD", torch.bfloat16, g,
                       v_head_dim=v_head_dim)
    q = torch.randn(sum(q_lens), 4, head_dim, generator=g).bfloat16().cuda()
    attn = cuda.BatchAttention(4, 1, head_dim, page_size, v_head_dim=v_head_dim)
    attn.plan(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, kv_lens=batch.kv_lens)
    out = attn.run(q, batch.k_cache, batch.v_cache)
    torch.cuda.synchronize()
    ref_out, _ = reference_attention(q, batch)
    assert out.shape == (sum(q_lens), 4, v_head_dim)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=3e-2, rtol=3e-2)


@needs_gpu
def test_batch_attention_on_strided_caches_and_plan_reuse():
    """K and V as the two halves of one [pages, 2, page_size, H, D] tensor (FlashInfer's
    layout, page stride 2 * page_size * H * D), and two layers on one plan."""
    g = torch.Generator().manual_seed(7)
    q_lens, kv_lens = [1, 1, 4], [30, 64, 12]
    batch = PagedBatch(q_lens, kv_lens, 2, 64, 16, "NHD", torch.bfloat16, g)
    q = torch.randn(sum(q_lens), 4, 64, generator=g).bfloat16().cuda()
    attn = cuda.BatchAttention(4, 2, 64, 16)
    attn.plan(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len)
    joint = torch.stack([batch.k_cache, batch.v_cache], dim=1)
    first = attn.run(q, joint[:, 0], joint[:, 1])
    second = attn.run(q * 2, batch.k_cache, batch.v_cache)
    torch.cuda.synchronize()
    torch.testing.assert_close(first.double().cpu(), reference_attention(q, batch)[0],
                               atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(second.double().cpu(), reference_attention(q * 2, batch)[0],
                               atol=3e-2, rtol=3e-2)


@needs_gpu
def test_batch_attention_on_a_side_stream():
    g = torch.Generator().manual_seed(11)
    q_lens, kv_lens = [1, 5], [40, 70]
    batch = PagedBatch(q_lens, kv_lens, 2, 128, 16, "NHD", torch.bfloat16, g)
    attn = cuda.BatchAttention(8, 2, 128, 16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the caches were filled there
    with torch.cuda.stream(side):
        q = torch.randn(sum(q_lens), 8, 128, generator=g).bfloat16().to("cuda", non_blocking=False)
        attn.plan(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len,
                  stream=side.cuda_stream)
        out = attn.run(q, batch.k_cache, batch.v_cache, stream=side.cuda_stream)
        again = attn.run(q, batch.k_cache, batch.v_cache, stream=side)  # a torch.cuda.Stream
    side.synchronize()
    ref = reference_attention(q, batch)[0]
    torch.testing.assert_close(out.double().cpu(), ref, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(again.double().cpu(), ref, atol=3e-2, rtol=3e-2)


@needs_gpu
def test_batch_attention_checks_run_shapes():
    attn = cuda.BatchAttention(8, 2, 64, 16)
    attn.plan([0, 1], [0, 1], [0], [5])
    cache = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(1, 8, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"BatchAttention.run: q has shape \[2, 8, 64\]"):
        attn.run(torch.zeros(2, 8, 64, dtype=torch.bfloat16, device="cuda"), cache, cache)
    with pytest.raises(ValueError, match=r"k_cache .* do not match"):
        attn.run(q, cache[:, :, :1], cache[:, :, :1])
    with pytest.raises(TypeError, match=r"k_cache has dtype float16 but kv_dtype is bfloat16"):
        attn.run(q, cache.half(), cache.half())
    with pytest.raises(TypeError, match=r"BatchAttention.run: q must be a CUDA tensor"):
        attn.run(q.cpu(), cache, cache)
    with pytest.raises(TypeError, match=r"qo_indptr must be a host array"):
        attn.plan(torch.tensor([0, 1], device="cuda"), [0, 1], [0], [5])


def slots_of(batch_pages, positions, page_size):
    return [batch_pages[p // page_size] * page_size + p % page_size for p in positions]


@needs_gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("key_dtype", ["bfloat16", "float32"])
def test_reshape_and_cache_matches_index_put(layout, key_dtype):
    g = torch.Generator().manual_seed(3)
    num_pages, page_size, heads, head_dim, tokens = 9, 16, 2, 72, 40
    shape = ((num_pages, page_size, heads, head_dim) if layout == "NHD"
             else (num_pages, heads, page_size, head_dim))
    k_cache = torch.randn(shape, generator=g).bfloat16().cuda()
    v_cache = torch.randn(shape, generator=g).bfloat16().cuda()
    key = torch.randn(tokens, heads, head_dim, generator=g).to(getattr(torch, key_dtype)).cuda()
    value = torch.randn(tokens, heads, head_dim, generator=g).to(key.dtype).cuda()
    slots = torch.randperm(num_pages * page_size, generator=g)[:tokens]
    slots[::7] = -1  # skipped
    slot_mapping = slots.cuda()
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    kept = slots >= 0
    page, offset = (slots[kept] // page_size).cuda(), (slots[kept] % page_size).cuda()
    for cache, new in ((expected_k, key), (expected_v, value)):
        view = cache if layout == "NHD" else cache.permute(0, 2, 1, 3)
        view.index_put_((page, offset), new[kept.cuda()].bfloat16())
    cuda.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, layout=layout,
                           stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@needs_gpu
def test_reshape_and_cache_checks_shapes():
    cache = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    key = torch.zeros(3, 2, 64, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(3, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match=r"reshape_and_cache: key has shape \[3, 2, 32\]"):
        cuda.reshape_and_cache(key[..., :32], key, cache, cache, slots)
    with pytest.raises(TypeError, match=r"slot_mapping has dtype int32, expected int64"):
        cuda.reshape_and_cache(key, key, cache, cache, slots.int())


@needs_gpu
def test_copy_and_swap_blocks():
    g = torch.Generator().manual_seed(5)
    k = torch.randn(6, 16, 2, 32, generator=g).bfloat16().cuda()
    v = torch.randn(6, 16, 2, 32, generator=g).bfloat16().cuda()
    k0, v0 = k.clone(), v.clone()
    cuda.copy_blocks(k, v, [(0, 3), (2, 5)])
    torch.cuda.synchronize()
    assert torch.equal(k[3], k0[0]) and torch.equal(v[5], v0[2]) and torch.equal(k[1], k0[1])

    host = torch.zeros(4, 16, 2, 32, dtype=torch.bfloat16).pin_memory()
    cuda.swap_blocks(k, host, np.array([[3, 0], [4, 2]]))
    torch.cuda.synchronize()
    assert torch.equal(host[0], k[3].cpu()) and torch.equal(host[2], k[4].cpu())
    cuda.swap_blocks(host, k, torch.tensor([[2, 1]]))
    torch.cuda.synchronize()
    assert torch.equal(k[1].cpu(), host[2])


@needs_gpu
def test_apply_rope_matches_torch():
    g = torch.Generator().manual_seed(9)
    tokens, heads, head_dim = 13, 3, 64
    x = torch.randn(tokens, heads, head_dim, generator=g).cuda()
    positions = torch.randint(0, 2048, (tokens,), generator=g, dtype=torch.int32)
    expected = x.clone().double()
    half = head_dim // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    angle = (positions.double()[:, None] * inv_freq[None, :]).cuda()[:, None, :]
    a, b = expected[..., :half].clone(), expected[..., half:].clone()
    expected[..., :half] = a * angle.cos() - b * angle.sin()
    expected[..., half:] = b * angle.cos() + a * angle.sin()
    cuda.apply_rope(x, positions.cuda())
    torch.cuda.synchronize()
    # cos / sin of angles up to 2048 in float: a few 1e-4.
    torch.testing.assert_close(x.double(), expected, atol=1e-3, rtol=1e-3)


@needs_gpu
def test_merge_states_matches_the_formula():
    g = torch.Generator().manual_seed(13)
    v_a, v_b = (torch.randn(5, 3, 16, generator=g).cuda() for _ in range(2))
    s_a, s_b = (torch.randn(5, 3, generator=g).cuda() for _ in range(2))
    s_b[0, 0] = -math.inf  # an empty state
    v, s = cuda.merge_states(v_a, s_a, v_b, s_b)
    torch.cuda.synchronize()
    expected_s = torch.logaddexp(s_a, s_b)
    wa, wb = torch.exp(s_a - expected_s)[..., None], torch.exp(s_b - expected_s)[..., None]
    torch.testing.assert_close(s, expected_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, wa * v_a + wb * v_b, atol=1e-5, rtol=1e-5)


@needs_gpu
def test_device_info_and_reason_with_a_device():
    info = cuda.device_info()
    assert info["sm_count"] > 0 and info["major"] >= 8
    assert cuda.no_device_reason() == ""


@needs_gpu
@pytest.mark.skipif(torch is None or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_tensor_on_another_device_is_refused():
    x = torch.zeros(2, 1, 8, device="cuda:1")
    with pytest.raises(ValueError, match=r"apply_rope: x is on CUDA device 1"):
        cuda.apply_rope(x, torch.zeros(2, dtype=torch.int32, device="cuda:0"))
