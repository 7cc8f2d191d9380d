// vLLM's paged-attention ops (vllm.attention.ops.paged_attn.PagedAttention
// and the cache ops it calls) over the CPU kernels, with vLLM's conventions
// (docs/ops.md): explicit scale, ALiBi bias slope * (j - p), slot -1 skips a
// write, kv_cache_dtype "auto" / "fp8" / "fp8_e4m3" / "fp8_e5m2" with
// value = stored * k_scale (quantise on write: stored = value / k_scale),
// sliding_window = W keys. Every input is validated first; a failed call
// throws pagedattn::InvalidArgument and leaves every cache byte-identical.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "pagedattn/ops/tensor.h"

namespace pagedattn::ops::vllm {

// kFlash: [num_blocks, block_size, Hkv, D] (flash-attn / FlashInfer NHD).
// kCpu:   [num_blocks, Hkv, block_size, D] (vLLM's CPU backend, HND).
// (The CUDA-only split-x key layout is not supported.)
enum class CacheLayout : std::uint8_t { kFlash = 0, kCpu = 1 };

// One layer's K and V caches. Innermost axis contiguous; other strides free
// (e.g. halves of a [2, num_blocks, ...] tensor).
struct KVCaches {
  TensorView key_cache;
  TensorView value_cache;  // same shape and dtype as key_cache
  CacheLayout layout = CacheLayout::kFlash;
  std::string_view kv_cache_dtype = "auto";  // "auto": the activations' dtype
  float k_scale = 1.0f, v_scale = 1.0f;      // fp8 only
};

// S sequences, one new token each, already written to the caches.
struct ForwardDecodeParams {
  TensorView output;  // [S, Hq, D], query's dtype
  TensorView query;   // [S, Hq, D]
  KVCaches kv;
  IndexView block_tables;                  // [S, max_blocks] int32
  IndexView seq_lens;                      // [S] int32 keys per sequence (0 gives a zero row)
  std::int32_t max_seq_len = 0;            // >= every seq_lens entry
  std::int32_t num_kv_heads = 0;           // must equal the caches'
  float scale = 0.0f;                      // the logit scale, used as given
  std::optional<TensorView> alibi_slopes;  // [Hq] float32
};
void forward_decode(const ForwardDecodeParams& params);

// Multi-head latent attention decode (DeepSeek-V2/V3; vLLM's CPU
// mla_decode_kvcache): S sequences, one new token each, already in the
// cache. Each cache row is [latent | rope key] (D wide, one per token: no
// KV heads); V is its first v_head_dim elements, the latent. Queries come
// absorbed ([W_UK^T q_nope | q_pe] per head), outputs stay in the latent
// space (apply W_UV after).
struct MlaDecodeParams {
  TensorView output;    // [S, Hq, v_head_dim], query's dtype
  TensorView query;     // [S, Hq, D]
  TensorView kv_cache;  // [num_blocks, block_size, D]; rows contiguous, other strides free
  std::string_view kv_cache_dtype = "auto";  // "auto" (the query's dtype), "fp8", "fp8_e4m3",
                                             // "fp8_e5m2"
  float k_scale = 1.0f;                      // fp8: value = stored * k_scale
  IndexView block_tables;                    // [S, max_blocks] int32
  IndexView seq_lens;                        // [S] int32 keys per sequence (0 gives a zero row)
  float scale = 0.0f;  // the logit scale, used as given (DeepSeek: 1/sqrt(nope + rope dims))
};
void mla_decode_kvcache(const MlaDecodeParams& params);

// Prefill with a cached prefix: sequence b has query tokens
// [query_start_loc[b], query_start_loc[b+1]) at the end of its seq_lens[b]
// keys. All keys, the new ones included, are read from the caches, so
// write_to_paged_cache must run first (vLLM's backends do; with an fp8
// cache the new keys are therefore read quantised).
struct ForwardPrefixParams {
  TensorView output;  // [T, Hq, D], query's dtype
  TensorView query;   // [T, Hq, D]
  KVCaches kv;
  IndexView block_tables;                      // [S, max_blocks] int32
  IndexView query_start_loc;                   // [S + 1] int32, 0 .. T
  IndexView seq_lens;                          // [S] int32 keys per sequence (>= its query length)
  std::int32_t max_query_len = 0;              // >= every query length
  std::optional<float> scale;                  // none: 1/sqrt(D), as vLLM's prefix kernel
  std::optional<TensorView> alibi_slopes;      // [Hq] float32
  std::optional<std::int32_t> sliding_window;  // W >= 1: each query sees its last W keys
};
void forward_prefix(const ForwardPrefixParams& params);

// reshape_and_cache: token i of key/value goes to slot slot_mapping[i]
// (block * block_size + offset), -1 = skip; the first slot_mapping.shape[0]
// tokens are written (vLLM pads key/value for CUDA graphs).
struct WriteToPagedCacheParams {
  TensorView key;          // [N, Hkv, D]
  TensorView value;        // [N, Hkv, D]
  KVCaches kv;             // written
  IndexView slot_mapping;  // [n <= N] int64
};
void write_to_paged_cache(const WriteToPagedCacheParams& params);
inline void reshape_and_cache(const WriteToPagedCacheParams& params) {
  write_to_paged_cache(params);
}

// Block copies move bytes of any dtype. An int8 cache holds
// value = stored * scale with one float32 scale per (block, head, slot): its
// scales, [num_blocks, Hkv, block_size] float32 dense in either layout,
// must come with it and move with its blocks; other dtypes take none.

// Copies blocks src -> dst in every layer's K and V cache. Every layer and
// argument is validated before the first block moves.
struct CopyBlocksParams {
  std::span<const TensorView> key_caches;    // [layers] each in `layout`
  std::span<const TensorView> value_caches;  // [layers]
  CacheLayout layout = CacheLayout::kFlash;
  IndexView block_mapping;  // [n, 2] int64 (src, dst)
  // Empty when no layer is int8; else [layers], an empty view (rank 0) for
  // each layer that is not int8.
  std::span<const TensorView> key_scales = {};
  std::span<const TensorView> value_scales = {};
};
void copy_blocks(const CopyBlocksParams& params);

// Copies blocks of one cache tensor into another (device <-> host swap).
struct SwapBlocksParams {
  TensorView src;  // [num_blocks, ...] in `layout`
  TensorView dst;  // same shape except num_blocks; written
  CacheLayout layout = CacheLayout::kFlash;
  IndexView block_mapping;  // [n, 2] int64 (src block, dst block)
  // int8 only: src's [src blocks, Hkv, block_size] and dst's [dst blocks,
  // Hkv, block_size] float32 scales (dst_scales written).
  std::optional<TensorView> src_scales = std::nullopt;
  std::optional<TensorView> dst_scales = std::nullopt;
};
void swap_blocks(const SwapBlocksParams& params);

}  // namespace pagedattn::ops::vllm
