// RoPE on [tokens][heads][dim] tensors. Angles are formed in double (a float
// product p * inv_freq loses ~1e-3 rad at 32k positions), rotations in float.
#include <algorithm>
#include <cmath>

#include "core/row_parallel.h"
#include "pagedattn/errors.h"
#include "pagedattn/rope.h"

namespace pagedattn {
namespace {

constexpr double kPi = 3.14159265358979323846;

void validate_yarn(const RopeYarnScaling& y) {
  if (y.factor == 0.0f) return;
  require(y.factor > 1.0f && std::isfinite(y.factor) && y.original_max_position > 0 &&
              y.beta_fast > y.beta_slow && y.beta_slow > 0.0f && y.attention_factor >= 0.0f &&
              std::isfinite(y.attention_factor),
          "apply_rope: yarn scaling factor = ", y.factor,
          ", original_max_position = ", y.original_max_position, ", beta_fast = ", y.beta_fast,
          ", beta_slow = ", y.beta_slow, ", attention_factor = ", y.attention_factor,
          " is inconsistent");
}

// The dimension (of R) at which pairs make `rotations` turns over the
// original context (Hugging Face's find_correction_dim).
double yarn_correction_dim(double rotations, std::int32_t rotary_dim, double theta,
                           double original_max_position) {
  return rotary_dim * std::log(original_max_position / (rotations * 2.0 * kPi)) /
         (2.0 * std::log(theta));
}

// YaRN's blend of extrapolated (unscaled) and interpolated (divided by the
// factor) frequencies for pair t, as Hugging Face's _compute_yarn_parameters
// (with truncation of the correction range to whole dimensions).
double yarn_inv_freq(const RopeConfig& c, std::int32_t rotary_dim, std::int32_t t, double inv) {
  const RopeYarnScaling& y = c.yarn;
  const double original = y.original_max_position;
  double low = std::floor(yarn_correction_dim(y.beta_fast, rotary_dim, c.theta, original));
  double high = std::ceil(yarn_correction_dim(y.beta_slow, rotary_dim, c.theta, original));
  low = std::max(low, 0.0);
  high = std::min(high, double(rotary_dim - 1));
  if (low == high) high += 0.001;  // no division by zero
  const double ramp = std::clamp((t - low) / (high - low), 0.0, 1.0);
  const double extrapolation = 1.0 - ramp;  // share of the unscaled frequency
  return inv / y.factor * (1.0 - extrapolation) + inv * extrapolation;
}

void validate_rope(const HeadTensor& x, std::int32_t num_tokens, std::int32_t num_heads,
                   std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& c) {
  require(num_tokens >= 0 && num_heads >= 1 && head_dim >= 2,
          "apply_rope: num_tokens = ", num_tokens, ", num_heads = ", num_heads,
          ", head_dim = ", head_dim, " out of range");
  const std::int32_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  require(r >= 2 && r % 2 == 0 && r <= head_dim, "apply_rope: rotary_dim = ", c.rotary_dim,
          " must be even and in [2, head_dim = ", head_dim, "]");
  require(is_activation_dtype(x.dtype), "apply_rope: x.dtype = ", dtype_name(x.dtype),
          " must be float32, float16 or bfloat16");
  require(c.theta > 0.0f && c.scale > 0.0f && std::isfinite(c.theta) && std::isfinite(c.scale),
          "apply_rope: theta = ", c.theta, " and scale = ", c.scale, " must be finite and > 0");
  require(c.attention_factor > 0.0f && std::isfinite(c.attention_factor),
          "apply_rope: attention_factor = ", c.attention_factor, " must be finite and > 0");
  const RopeLlama3Scaling& l3 = c.llama3;
  require(l3.factor == 0.0f ||
              (l3.factor > 0.0f && l3.low_freq_factor > 0.0f &&
               l3.high_freq_factor > l3.low_freq_factor && l3.original_max_position > 0),
          "apply_rope: llama3 scaling factor = ", l3.factor,
          ", low_freq_factor = ", l3.low_freq_factor, ", high_freq_factor = ", l3.high_freq_factor,
          ", original_max_position = ", l3.original_max_position, " is inconsistent");
  validate_yarn(c.yarn);
  require((c.cos_cache == nullptr) == (c.sin_cache == nullptr),
          "apply_rope: give both cos_cache "
          "and sin_cache or neither");
  if (c.freq_factors)
    for (std::int32_t i = 0; i < r / 2; ++i)
      require(std::isfinite(c.freq_factors[i]) && c.freq_factors[i] > 0.0f,
              "apply_rope: freq_factors[", i, "] = ", c.freq_factors[i], " must be finite and > 0");
  if (num_tokens == 0) return;
  require(x.data && positions, "apply_rope: x.data and positions must be non-null");
  for (std::int32_t t = 0; t < num_tokens; ++t) {
    require(positions[t] >= 0, "apply_rope: positions[", t, "] = ", positions[t], " is negative");
    require(!c.cos_cache || positions[t] < c.cache_max_position, "apply_rope: positions[", t,
            "] = ", positions[t], " is beyond the cos/sin cache (", c.cache_max_position, " rows)");
  }
}

}  // namespace

namespace {

double llama3_inv_freq(const RopeLlama3Scaling& l3, double inv) {
  const double wavelen = 2.0 * kPi / inv;
  const double low_wavelen = l3.original_max_position / double(l3.low_freq_factor);
  const double high_wavelen = l3.original_max_position / double(l3.high_freq_factor);
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / l3.factor;
  const double smooth = (l3.original_max_position / wavelen - l3.low_freq_factor) /
                        (double(l3.high_freq_factor) - l3.low_freq_factor);
  return (1.0 - smooth) * inv / l3.factor + smooth * inv;
}

}  // namespace

double rope_inv_freq(const RopeConfig& c, std::int32_t rotary_dim, std::int32_t t) {
  double inv = double(c.scale) / std::pow(double(c.theta), 2.0 * t / rotary_dim);
  if (c.llama3.factor != 0.0f) inv = llama3_inv_freq(c.llama3, inv);
  if (c.yarn.factor != 0.0f) inv = yarn_inv_freq(c, rotary_dim, t, inv);
  if (c.freq_factors) inv /= double(c.freq_factors[t]);
  return inv;
}

double rope_attention_factor(const RopeConfig& c) {
  const RopeYarnScaling& y = c.yarn;
  const double yarn = y.factor == 0.0f            ? 1.0
                      : y.attention_factor > 0.0f ? double(y.attention_factor)
                                                  : 0.1 * std::log(double(y.factor)) + 1.0;
  return double(c.attention_factor) * yarn;
}

namespace {

// Where position pos's row starts in a caller's cos/sin cache
// ([max_position][R/2], RopeConfig::cos_cache).
std::int64_t cache_row(std::int64_t pos, std::int32_t rotary_dim) {
  return pos * (rotary_dim / 2);
}

}  // namespace

void rope_cos_sin(const RopeConfig& c, std::int32_t rotary_dim, std::int64_t pos, std::int32_t t,
                  float& cos_out, float& sin_out) {
  if (c.cos_cache) {
    const std::int64_t at = cache_row(pos, rotary_dim) + t;
    cos_out = c.cos_cache[at];
    sin_out = c.sin_cache[at];
    return;
  }
  const double angle = double(pos) * rope_inv_freq(c, rotary_dim, t);
  const double magnitude = rope_attention_factor(c);
  cos_out = static_cast<float>(magnitude * std::cos(angle));
  sin_out = static_cast<float>(magnitude * std::sin(angle));
}

namespace {

// Pairs [i0, i0 + n) of one head at `base` rotated by cs / sn (n values
// each). f32 heads on plain pointers, whose loops the compiler vectorises;
// other activation dtypes element by element.
void rotate_head(const HeadTensor& x, std::int64_t base, std::int32_t half, RopeStyle style,
                 std::int32_t i0, std::int32_t n, const float* cs, const float* sn) {
  if (x.dtype == DType::kF32) {
    float* head = static_cast<float*>(x.data) + base;
    if (style == RopeStyle::kNeox) {  // pair i: (i, i + half)
      float* __restrict a = head + i0;
      float* __restrict b = head + half + i0;
      for (std::int32_t i = 0; i < n; ++i) {
        const float u = a[i], v = b[i];
        a[i] = u * cs[i] - v * sn[i];
        b[i] = v * cs[i] + u * sn[i];
      }
    } else {  // pair i: (2i, 2i + 1)
      float* __restrict p = head + 2 * i0;
      for (std::int32_t i = 0; i < n; ++i) {
        const float u = p[2 * i], v = p[2 * i + 1];
        p[2 * i] = u * cs[i] - v * sn[i];
        p[2 * i + 1] = v * cs[i] + u * sn[i];
      }
    }
    return;
  }
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t pair = i0 + i;
    const std::int64_t ia = base + (style == RopeStyle::kNeox ? pair : 2 * pair);
    const std::int64_t ib = base + (style == RopeStyle::kNeox ? pair + half : 2 * pair + 1);
    const float a = load_as_float(x.data, x.dtype, std::size_t(ia));
    const float b = load_as_float(x.data, x.dtype, std::size_t(ib));
    store_from_float(x.data, x.dtype, std::size_t(ia), a * cs[i] - b * sn[i]);
    store_from_float(x.data, x.dtype, std::size_t(ib), b * cs[i] + a * sn[i]);
  }
}

}  // namespace

void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& c) {
  validate_rope(x, num_tokens, num_heads, head_dim, positions, c);
  const std::int32_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  const std::int32_t half = r / 2;
  constexpr std::int32_t kChunk = 64;  // pairs whose cos/sin sit on the stack at once
#pragma omp parallel for schedule(static) if (std::int64_t{num_tokens} * num_heads * head_dim >= \
                                              core::kRowParallelElements)
  for (std::int32_t t = 0; t < num_tokens; ++t) {
    const std::int32_t pos = positions[t];
    for (std::int32_t i0 = 0; i0 < half; i0 += kChunk) {
      const std::int32_t n = std::min(kChunk, half - i0);
      float cs_buffer[kChunk], sn_buffer[kChunk];
      const float* cs = cs_buffer;
      const float* sn = sn_buffer;
      if (c.cos_cache) {  // the cache's row of this position, in place
        cs = c.cos_cache + cache_row(pos, r) + i0;
        sn = c.sin_cache + cache_row(pos, r) + i0;
      } else {
        for (std::int32_t i = 0; i < n; ++i)
          rope_cos_sin(c, r, pos, i0 + i, cs_buffer[i], sn_buffer[i]);
      }
      for (std::int32_t h = 0; h < num_heads; ++h)
        rotate_head(x, t * x.token_stride + h * x.head_stride, half, c.style, i0, n, cs, sn);
    }
  }
}

}  // namespace pagedattn
