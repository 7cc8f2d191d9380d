// Kernels that move K/V data: append through a slot mapping (quantising on
// write), RoPE, and page copy / swap. Each validates all its input first.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "pagedattn/attention.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn {

// --- append -------------------------------------------------------------------------

struct AppendParams {
  HeadTensor k;                             // [num_tokens][num_kv_heads][head_dim]
  HeadTensor v;                             // [num_tokens][num_kv_heads][v_head_dim]
  const std::int64_t* slot_mapping = nullptr;  // [num_tokens] page * page_size + offset; -1 skips
  std::int32_t num_tokens = 0;
  PagedKVStorage kv;                        // destination pages of one layer
};

// Writes each token's K/V rows to its slot, converting to kv.dtype with round
// to nearest even. fp8 stores value / scale (per head or per tensor),
// saturating at the format's max; int8 stores round(value / s) with
// s = max|row| / 127 per token and head, written to kv.{k,v}_token_scales.
// Slots must be unique (a duplicate would make the result order-dependent).
void append_paged_kv(const AppendParams& params);

// --- RoPE -----------------------------------------------------------------------------

enum class RopeStyle : std::uint8_t {
  kNeox = 0,  // half split: pairs (t, t + R/2)
  kGptJ = 1,  // interleaved: pairs (2t, 2t + 1)
};

// Llama-3 style frequency scaling (all four fields as in the model config).
struct RopeLlama3Scaling {
  float factor = 0.0f;  // 0 = off
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  std::int32_t original_max_position = 8192;
};

struct RopeConfig {
  RopeStyle style = RopeStyle::kNeox;
  std::int32_t rotary_dim = 0;  // R <= head_dim, even; 0 means head_dim
  float theta = 10000.0f;
  float scale = 1.0f;           // multiplies every frequency
  RopeLlama3Scaling llama3;
  // Optional caller cache instead of theta/scale: cos/sin [max_position][R/2].
  const float* cos_cache = nullptr;
  const float* sin_cache = nullptr;
  std::int32_t cache_max_position = 0;
};

// Frequency of pair t (0 <= t < R/2), after scaling.
double rope_inv_freq(const RopeConfig& config, std::int32_t rotary_dim, std::int32_t t);

// Rotates x [num_tokens][num_heads][head_dim] in place, token i at
// positions[i]. Dimensions >= rotary_dim pass through.
void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& config);

// --- page copy / swap -----------------------------------------------------------------

// Copies pages (K, V and int8 token scales) from `src` to `dst`, pairs
// (src_page, dst_page). The two storages must have the same page geometry
// and dtype; they may be the same storage (copy-on-write, vLLM copy_blocks)
// or a device/host pair (vLLM swap_blocks). Destinations must be distinct
// and, within one storage, no page may be both a source and a destination.
void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages);

}  // namespace pagedattn
