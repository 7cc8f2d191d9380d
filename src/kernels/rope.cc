// RoPE on [tokens][heads][dim] tensors. Angles are formed in double (a float
// product p * inv_freq loses ~1e-3 rad at 32k positions), rotations in float.
#include <algorithm>
#include <cmath>

#include "pagedattn/errors.h"
#include "pagedattn/rope.h"

namespace pagedattn {
namespace {

constexpr double kPi = 3.14159265358979323846;

void validate_rope(const HeadTensor& x, std::int32_t num_tokens, std::int32_t num_heads,
                   std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& c) {
  require(num_tokens >= 0 && num_heads >= 1 && head_dim >= 2, "apply_rope: num_tokens = ",
          num_tokens, ", num_heads = ", num_heads, ", head_dim = ", head_dim, " out of range");
  const std::int32_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  require(r >= 2 && r % 2 == 0 && r <= head_dim, "apply_rope: rotary_dim = ", c.rotary_dim,
          " must be even and in [2, head_dim = ", head_dim, "]");
  require(is_activation_dtype(x.dtype),
          "apply_rope: x.dtype = ", dtype_name(x.dtype), " must be float32, float16 or bfloat16");
  require(c.theta > 0.0f && c.scale > 0.0f && std::isfinite(c.theta) && std::isfinite(c.scale),
          "apply_rope: theta = ", c.theta, " and scale = ", c.scale, " must be finite and > 0");
  const RopeLlama3Scaling& l3 = c.llama3;
  require(l3.factor == 0.0f || (l3.factor > 0.0f && l3.low_freq_factor > 0.0f &&
                                l3.high_freq_factor > l3.low_freq_factor &&
                                l3.original_max_position > 0),
          "apply_rope: llama3 scaling factor = ", l3.factor, ", low_freq_factor = ",
          l3.low_freq_factor, ", high_freq_factor = ", l3.high_freq_factor,
          ", original_max_position = ", l3.original_max_position, " is inconsistent");
  require((c.cos_cache == nullptr) == (c.sin_cache == nullptr), "apply_rope: give both cos_cache "
          "and sin_cache or neither");
  if (num_tokens == 0) return;
  require(x.data && positions, "apply_rope: x.data and positions must be non-null");
  for (std::int32_t t = 0; t < num_tokens; ++t) {
    require(positions[t] >= 0, "apply_rope: positions[", t, "] = ", positions[t], " is negative");
    require(!c.cos_cache || positions[t] < c.cache_max_position, "apply_rope: positions[", t,
            "] = ", positions[t], " is beyond the cos/sin cache (", c.cache_max_position, " rows)");
  }
}

}  // namespace

double rope_inv_freq(const RopeConfig& c, std::int32_t rotary_dim, std::int32_t t) {
  double inv = double(c.scale) / std::pow(double(c.theta), 2.0 * t / rotary_dim);
  const RopeLlama3Scaling& l3 = c.llama3;
  if (l3.factor == 0.0f) return inv;
  const double wavelen = 2.0 * kPi / inv;
  const double low_wavelen = l3.original_max_position / double(l3.low_freq_factor);
  const double high_wavelen = l3.original_max_position / double(l3.high_freq_factor);
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / l3.factor;
  const double smooth = (l3.original_max_position / wavelen - l3.low_freq_factor) /
                        (double(l3.high_freq_factor) - l3.low_freq_factor);
  return (1.0 - smooth) * inv / l3.factor + smooth * inv;
}

void rope_cos_sin(const RopeConfig& c, std::int32_t rotary_dim, std::int64_t pos, std::int32_t t,
                  float& cos_out, float& sin_out) {
  if (c.cos_cache) {
    const std::int64_t at = pos * (rotary_dim / 2) + t;
    cos_out = c.cos_cache[at];
    sin_out = c.sin_cache[at];
    return;
  }
  const double angle = double(pos) * rope_inv_freq(c, rotary_dim, t);
  cos_out = static_cast<float>(std::cos(angle));
  sin_out = static_cast<float>(std::sin(angle));
}

void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& c) {
  validate_rope(x, num_tokens, num_heads, head_dim, positions, c);
  const std::int32_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  const std::int32_t half = r / 2;
  constexpr std::int32_t kChunk = 64;  // pairs whose cos/sin sit on the stack at once
#pragma omp parallel for schedule(static) if (std::int64_t{num_tokens} * num_heads * head_dim > (1 << 16))
  for (std::int32_t t = 0; t < num_tokens; ++t) {
    const std::int32_t pos = positions[t];
    for (std::int32_t i0 = 0; i0 < half; i0 += kChunk) {
      const std::int32_t n = std::min(kChunk, half - i0);
      float cs[kChunk], sn[kChunk];
      for (std::int32_t i = 0; i < n; ++i) rope_cos_sin(c, r, pos, i0 + i, cs[i], sn[i]);
      for (std::int32_t h = 0; h < num_heads; ++h) {
        const std::int64_t base = t * x.token_stride + h * x.head_stride;
        for (std::int32_t i = 0; i < n; ++i) {
          const std::int32_t p = i0 + i;
          const std::int64_t ia = base + (c.style == RopeStyle::kNeox ? p : 2 * p);
          const std::int64_t ib = base + (c.style == RopeStyle::kNeox ? p + half : 2 * p + 1);
          const float a = load_as_float(x.data, x.dtype, std::size_t(ia));
          const float b = load_as_float(x.data, x.dtype, std::size_t(ib));
          store_from_float(x.data, x.dtype, std::size_t(ia), a * cs[i] - b * sn[i]);
          store_from_float(x.data, x.dtype, std::size_t(ib), b * cs[i] + a * sn[i]);
        }
      }
    }
  }
}

}  // namespace pagedattn
