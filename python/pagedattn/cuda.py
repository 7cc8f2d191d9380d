"""pagedattn's CUDA backend on CUDA tensors (SM80 and newer), in place.

    device_count()       CUDA devices the runtime sees (0 without a GPU; never raises)
    no_device_reason()   why device_count() is 0 ("" when a device exists)
    device_info()        the current device's name, capability, SMs, memory
    BatchAttention       paged attention over a ragged batch, FlashInfer-like:
                           attn = BatchAttention(num_qo_heads, num_kv_heads, head_dim,
                                                 page_size, layout="NHD",
                                                 kv_dtype="bfloat16")
                           attn.plan(qo_indptr, kv_indptr, kv_indices,
                                     kv_last_page_len)       # host arrays, once a step
                           out = attn.run(q, k_cache, v_cache)  # CUDA tensors, per layer
                         q [T, Hq, D] -> out [T, Hq, Dv]; caches NHD
                         [num_pages, page_size, Hkv, D] or HND
                         [num_pages, Hkv, page_size, D]
    reshape_and_cache    vLLM cache write: key [N, Hkv, D], value [N, Hkv, Dv] ->
                         caches at slot_mapping [N] int64 (page * page_size + offset)
    copy_blocks          page copies within the device caches, (src, dst) host pairs
    swap_blocks          page copies between a CPU and a CUDA cache
    apply_rope           rotary embedding in place: x [T, H, D] at positions [T] int32
    merge_states         merge two partial states: v [..., D], s [...] float32

Tensors are any DLPack producer's (torch.Tensor on "cuda", CuPy, JAX), read
in place with their strides (the last axis contiguous); none is copied.
Each call takes `stream`: a cudaStream_t as an int
(torch.cuda.current_stream().cuda_stream) or a torch.cuda.Stream, or None,
the legacy default stream. The call exports its tensors with
`__dlpack__(stream=...)`, so their producer's pending work is ordered before
it, and enqueues its kernels on `stream` without waiting for them; the
tensors must stay alive until that work is done (as with any PyTorch op on
a side stream, record_stream them or keep them referenced). Tensors that
require grad must be detached. Index arrays the host reads (plan()'s page
table, block mappings) are lists, NumPy arrays or CPU tensors.

Importing this module raises ImportError where pagedattn was built without
the CUDA backend; it needs no GPU (device_count() is then 0) and never
imports torch.
"""

from . import _core

if not hasattr(_core, "cuda"):
    raise ImportError(
        "pagedattn was built without its CUDA backend (CMake found no CUDA compiler, or "
        "PAGEDATTN_CUDA=OFF): pagedattn.cuda is unavailable; rebuild with nvcc on PATH"
    )

_cuda = _core.cuda

device_count = _cuda.device_count
no_device_reason = _cuda.no_device_reason
device_info = _cuda.device_info
reshape_and_cache = _cuda.reshape_and_cache
copy_blocks = _cuda.copy_blocks
swap_blocks = _cuda.swap_blocks
apply_rope = _cuda.apply_rope


class BatchAttention(_cuda.BatchAttention):
    """Paged attention over a ragged batch on the GPU (see _core.cuda.BatchAttention).

    run() also allocates `out` (q's dtype and device, [T, Hq, v_head_dim])
    when it is omitted, and returns it.
    """

    def run(self, q, k_cache, v_cache, out=None, lse=None, **kwargs):
        """Attention of the planned batch on `stream`; returns out [T, Hq, v_head_dim].

        out=None allocates it like q (q.new_empty); the other arguments are
        _core.cuda.BatchAttention.run's: lse [T, Hq] float32 or None, and
        keywords k_scale, v_scale, k_token_scales, v_token_scales,
        alibi_slopes, sinks, stream.
        """
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], self.v_head_dim))
        return super().run(q, k_cache, v_cache, out, lse, **kwargs)


def merge_states(v_a, s_a, v_b, s_b, v_out=None, s_out=None, *, stream=None):
    """Merges two partial attention states on the GPU; returns (v_out, s_out).

    v_a, v_b [..., D] float32, s_a, s_b [...] float32 natural-log LSE (-inf:
    empty), contiguous CUDA tensors; v_out / s_out None are allocated like
    v_a / s_a (they may also be v_a / s_a themselves).
    v = (e^s_a v_a + e^s_b v_b) / (e^s_a + e^s_b), s = log(e^s_a + e^s_b).
    """
    if v_out is None:
        v_out = v_a.new_empty(v_a.shape)
    if s_out is None:
        s_out = s_a.new_empty(s_a.shape)
    _cuda.merge_states(v_a, s_a, v_b, s_b, v_out, s_out, stream=stream)
    return v_out, s_out


__all__ = [
    "BatchAttention",
    "apply_rope",
    "copy_blocks",
    "device_count",
    "device_info",
    "merge_states",
    "no_device_reason",
    "reshape_and_cache",
    "swap_blocks",
]
