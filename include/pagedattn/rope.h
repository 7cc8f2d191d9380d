// Rotary position embeddings (SEMANTICS.md): configuration, frequencies and
// the in-place kernel.
#pragma once

#include <cstdint>

#include "pagedattn/paged_kv.h"

namespace pagedattn {

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

// YaRN frequency scaling (Hugging Face's "yarn" rope_type, as Qwen 2.5 and
// Qwen3 long-context configs use it): each pair's frequency blends the
// unscaled one (fast-rotating pairs) with the one divided by `factor` (slow
// pairs) along a linear ramp between the correction dimensions of
// `beta_fast` and `beta_slow` rotations over the original context, and cos
// and sin are multiplied by `attention_factor`.
struct RopeYarnScaling {
  float factor = 0.0f;  // 0 = off; else > 1
  std::int32_t original_max_position = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float attention_factor = 0.0f;  // 0: 0.1 ln(factor) + 1
};

struct RopeConfig {
  RopeStyle style = RopeStyle::kNeox;
  std::int32_t rotary_dim = 0;  // R <= head_dim, even; 0 means head_dim
  float theta = 10000.0f;
  float scale = 1.0f;  // multiplies every frequency
  RopeLlama3Scaling llama3;
  RopeYarnScaling yarn;
  // [R/2] divisors of each pair's frequency, or null: llama.cpp's
  // rope_freqs tensor (Llama 3.1+ files store their scaling this way) or
  // Phi-3's LongRoPE factors.
  const float* freq_factors = nullptr;
  float attention_factor = 1.0f;  // cos and sin x this (LongRoPE), > 0
  // Optional caller cache instead of theta/scale: cos/sin [max_position][R/2].
  const float* cos_cache = nullptr;
  const float* sin_cache = nullptr;
  std::int32_t cache_max_position = 0;
};

// Frequency of pair t (0 <= t < R/2), after scaling (scale, llama3, yarn,
// then the freq_factors divisor).
double rope_inv_freq(const RopeConfig& config, std::int32_t rotary_dim, std::int32_t t);

// What cos and sin are multiplied by: attention_factor, times YaRN's.
double rope_attention_factor(const RopeConfig& config);

// cos and sin of pair t's angle at position pos: read from the config's
// cos/sin cache when it has one, else cos/sin(pos * inv_freq) in double,
// times YaRN's attention factor when YaRN is on.
void rope_cos_sin(const RopeConfig& config, std::int32_t rotary_dim, std::int64_t pos,
                  std::int32_t t, float& cos_out, float& sin_out);

// Rotates x [num_tokens][num_heads][head_dim] in place, token i at
// positions[i]. Dimensions >= rotary_dim pass through.
void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& config);

}  // namespace pagedattn
