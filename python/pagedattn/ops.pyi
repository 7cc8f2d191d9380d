"""Type stubs of pagedattn.ops (peer-compatible operators). Index arguments
accept lists and integer arrays of any dtype (converted, range checked)."""
from __future__ import annotations
import collections.abc
import numpy
import typing
__all__: list[str] = ['copy_blocks', 'merge_states', 'ort_paged_attention', 'paged_attention_decode', 'ragged_paged_attention', 'reshape_and_cache', 'swap_blocks']
def copy_blocks(key_caches: collections.abc.Sequence[typing.Any], value_caches: collections.abc.Sequence[typing.Any], block_mapping: typing.Any, *, key_scales: collections.abc.Sequence[typing.Any] | None = None, value_scales: collections.abc.Sequence[typing.Any] | None = None, layout: str = 'NHD') -> None:
    """
    vLLM copy_blocks: copies blocks src -> dst in every layer's caches, in place.
    
    key_caches, value_caches: lists of per-layer arrays [num_blocks, ...] (rank 4,
    blocks contiguous, any dtype); block_mapping (N, 2) int64 rows (src, dst).
    int8 caches need their scales: key_scales, value_scales lists (one entry
    per layer, None for a layer that is not int8) of [num_blocks, Hkv,
    block_size] float32 arrays, copied with the blocks; layout "NHD" [num_blocks,
    block_size, Hkv, D] or "HND" [num_blocks, Hkv, block_size, D] says which
    axis is which. Every layer is checked before any block moves.
    """
def merge_states(v_a: typing.Any, s_a: typing.Any, v_b: typing.Any, s_b: typing.Any) -> tuple[numpy.ndarray, numpy.ndarray]:
    """
    Merges two partial attention states. Returns (v, s).
    
    v_a, v_b [..., D] float32 normalised outputs; s_a, s_b [...] float32
    natural-log LSE (-inf marks an empty state), v's shape without its last
    axis. v = (e^s_a v_a + e^s_b v_b) / (e^s_a + e^s_b), s = log(e^s_a + e^s_b).
    """
def ort_paged_attention(query: typing.Any, key: typing.Any, value: typing.Any, key_cache: typing.Any, value_cache: typing.Any, cumulative_sequence_length: typing.Any, past_seqlens: typing.Any, block_table: typing.Any, cos_cache: typing.Any = None, sin_cache: typing.Any = None, *, num_heads: typing.Any, kv_num_heads: typing.Any, scale: float = 0.0, softcap: float = 0.0, local_window_size: typing.Any = -1, do_rotary: bool = False, rotary_interleaved: bool = False, slot_mapping: typing.Any = None, head_sink: typing.Any = None) -> numpy.ndarray:
    """
    ONNX Runtime com.microsoft.PagedAttention. Returns output (T, Hq*D).
    
    query (T, Hq*D), or packed QKV (T, (Hq + 2 Hkv)*D) with key = value = None;
    key, value (T, Hkv*D); key_cache, value_cache (num_blocks, block_size, Hkv*D)
    or (num_blocks, block_size, Hkv, D), C-contiguous, written in place;
    cumulative_sequence_length (B+1) int32; past_seqlens (B) int32 (tokens
    already cached); block_table (B, max_blocks) int32; cos_cache, sin_cache
    (max_position, R/2) with do_rotary (R = rotary_dim = 2 * cos_cache.shape[1]);
    slot_mapping (T) int32/int64 (-1 skips); head_sink (Hq). Float inputs share
    the query's dtype (float32, float16, ml_dtypes.bfloat16); output too.
    scale 0: 1/sqrt(D); softcap 0: off; local_window_size L >= 1: the last L
    keys, the query's own included (current ORT; -1: off; 0 is refused).
    T = 0 gives a (0, Hq*D) output.
    """
def paged_attention_decode(query: typing.Any, key_cache: typing.Any, value_cache: typing.Any, block_tables: typing.Any, seq_lens: typing.Any, *, num_kv_heads: typing.Any, scale: float, alibi_slopes: typing.Any = None, kv_cache_dtype: str = 'auto', k_scale: float = 1.0, v_scale: float = 1.0, layout: str = 'NHD') -> numpy.ndarray:
    """
    vLLM PagedAttention.forward_decode. Returns out [S, Hq, D] in query's dtype.
    
    query [S, Hq, D] (one new token per sequence, already in the caches);
    key_cache, value_cache [num_blocks, block_size, Hkv, D] (layout "NHD") or
    [num_blocks, Hkv, block_size, D] ("HND"); block_tables [S, max_blocks] int32;
    seq_lens [S] int32 (keys per sequence); alibi_slopes [Hq] float32 (bias
    slope * (j - p)). scale is used as given. kv_cache_dtype "auto" (the query's
    dtype), "fp8" / "fp8_e4m3" (e4m3fn) or "fp8_e5m2" with uint8 (or ml_dtypes)
    caches, value = stored * k_scale / v_scale.
    """
def ragged_paged_attention(q: typing.Any, kv_pages: typing.Any, kv_lens: typing.Any, page_indices: typing.Any, cu_q_lens: typing.Any, num_seqs: typing.Any, *, sm_scale: float = 1.0, sliding_window: typing.Any = None, soft_cap: float | None = None, k_scale: float | None = None, v_scale: float | None = None, kv_dtype: str | None = None) -> numpy.ndarray:
    """
    torch_xla ragged_paged_attention. Returns out [T, Hq, D] in q's dtype.
    
    q [T, Hq, D] (rows past cu_q_lens[num_seqs] are padding; their output is 0);
    kv_pages [P, page_size, 2 Hkv, D] with K heads at even, V heads at odd
    indices; kv_lens [S] int32; page_indices [S, pages_per_seq] int32;
    cu_q_lens [S+1] int32; num_seqs: int32[1] (or an int). Entries past num_seqs
    are padding and ignored. kv_dtype: "bfloat16", "float8_e4m3fn", "float8_e5m2"
    for uint16 / uint8 pages; omit for float32/float16 (or ml_dtypes) pages.
    sm_scale defaults to 1.0; sliding_window W shows W keys; soft_cap != 0;
    k_scale, v_scale for float8 pages (value = stored * scale).
    """
def reshape_and_cache(key: typing.Any, value: typing.Any, key_cache: typing.Any, value_cache: typing.Any, slot_mapping: typing.Any, *, kv_cache_dtype: str = 'auto', k_scale: float = 1.0, v_scale: float = 1.0, layout: str = 'NHD') -> None:
    """
    vLLM reshape_and_cache: writes key/value into the caches in place.
    
    key, value [N, Hkv, D]; key_cache, value_cache as in paged_attention_decode
    (layout "NHD" or "HND"); slot_mapping [n <= N] int64, token i goes to slot
    block * block_size + offset, -1 skips. With kv_cache_dtype "fp8*" values
    are stored as round(x / k_scale) (saturating).
    """
def swap_blocks(src: typing.Any, dst: typing.Any, block_mapping: typing.Any, *, src_scales: typing.Any = None, dst_scales: typing.Any = None, layout: str = 'NHD') -> None:
    """
    vLLM swap_blocks: copies blocks of src into dst (written in place).
    
    src [num_src_blocks, ...], dst [num_dst_blocks, ...] (rank 4, same block
    shape and dtype); block_mapping (N, 2) int64 rows (src block, dst block).
    int8 caches need src_scales [num_src_blocks, Hkv, block_size] and
    dst_scales [num_dst_blocks, Hkv, block_size] float32 (dst_scales written);
    layout "NHD" or "HND" as in copy_blocks.
    """
