"""Peer-compatible operators over pagedattn's CPU kernels.

    ort_paged_attention     ONNX Runtime com.microsoft.PagedAttention
    ragged_paged_attention  torch_xla ragged_paged_attention
    paged_attention_decode  vLLM PagedAttention.forward_decode
    paged_attention_prefix  vLLM PagedAttention.forward_prefix (prefill over a cached prefix)
    mla_decode_kvcache      vLLM's CPU MLA decode (DeepSeek latent rows: [latent | rope key])
    reshape_and_cache       vLLM cache write (in place)
    copy_blocks             vLLM block copies (in place)
    swap_blocks             vLLM block swap (in place)
    merge_states            merge two partial softmax states

Each function's docstring gives the shapes; docs/ops.md the conventions.
Arrays are NumPy arrays, buffer-protocol objects or DLPack producers (torch
CPU tensors, bfloat16 included), used in place with their strides.
"""

from ._core.ops import (
    copy_blocks,
    merge_states,
    mla_decode_kvcache,
    ort_paged_attention,
    paged_attention_decode,
    paged_attention_prefix,
    ragged_paged_attention,
    reshape_and_cache,
    swap_blocks,
)

__all__ = [
    "copy_blocks",
    "merge_states",
    "mla_decode_kvcache",
    "ort_paged_attention",
    "paged_attention_decode",
    "paged_attention_prefix",
    "ragged_paged_attention",
    "reshape_and_cache",
    "swap_blocks",
]
