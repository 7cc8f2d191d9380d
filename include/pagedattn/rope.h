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

// cos and sin of pair t's angle at position pos: read from the config's
// cos/sin cache when it has one, else cos/sin(pos * inv_freq) in double.
void rope_cos_sin(const RopeConfig& config, std::int32_t rotary_dim, std::int64_t pos,
                  std::int32_t t, float& cos_out, float& sin_out);

// Rotates x [num_tokens][num_heads][head_dim] in place, token i at
// positions[i]. Dimensions >= rotary_dim pass through.
void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& config);

}  // namespace pagedattn
