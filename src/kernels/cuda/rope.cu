// apply_rope on the device, computing as the CPU apply_rope does: pair
// frequencies from rope_inv_freq (double, on the host), angles and their
// cos / sin in double rounded once to f32 (or read from the config's
// cos / sin cache), rotations in f32 with every product and sum rounded
// separately (no fused multiply-add, as the CPU build has none there).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dtype.cuh"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda {
namespace {

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "pagedattn::cuda", what);
}

// Pairs whose frequencies travel with the launch (rotary_dim <= 512).
constexpr std::int32_t kMaxPairs = 256;
constexpr int kRopeThreads = 128;

struct RopeArgs {
  HeadTensor x;                             // [num_tokens][num_heads][head_dim], device
  const std::int32_t* positions = nullptr;  // [num_tokens], device
  std::int32_t num_heads = 0;
  std::int32_t half = 0;  // rotary_dim / 2 pairs
  bool neox = true;       // pairs (i, i + half); else (2i, 2i + 1)
  // Without a cache: pair i's frequency, and what cos and sin are multiplied by.
  double inv_freq[kMaxPairs] = {};
  double magnitude = 1.0;
  // With one: [cache_max_position][half] f32, device.
  const float* cos_cache = nullptr;
  const float* sin_cache = nullptr;
  std::int32_t cache_max_position = 0;
};
static_assert(sizeof(RopeArgs) <= 4000, "kernel arguments must stay within 4 KiB");

// One CTA per token: its pairs' cos / sin into shared memory, then every
// head's pairs rotated in place.
template <DType kX>
__global__ void rope_kernel(const __grid_constant__ RopeArgs args) {
  __shared__ float cos_of[kMaxPairs], sin_of[kMaxPairs];
  const std::int64_t token = blockIdx.x;
  const std::int32_t pos = args.positions[token];
  // Outside the contract (the host cannot read positions): leave the token
  // as it is rather than read beyond the cache. Uniform within the CTA.
  if (pos < 0 || (args.cos_cache != nullptr && pos >= args.cache_max_position)) return;
  const std::int32_t half = args.half;
  for (std::int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    if (args.cos_cache != nullptr) {
      const std::int64_t at = std::int64_t{pos} * half + i;
      cos_of[i] = args.cos_cache[at];
      sin_of[i] = args.sin_cache[at];
    } else {  // rope_cos_sin: magnitude x cos / sin(pos x inv_freq) in double, then f32
      const double angle = __dmul_rn(static_cast<double>(pos), args.inv_freq[i]);
      double sine, cosine;
      sincos(angle, &sine, &cosine);
      cos_of[i] = __double2float_rn(__dmul_rn(args.magnitude, cosine));
      sin_of[i] = __double2float_rn(__dmul_rn(args.magnitude, sine));
    }
  }
  __syncthreads();
  const std::int64_t pairs = std::int64_t{args.num_heads} * half;
  const HeadTensor& x = args.x;
  for (std::int64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
    const std::int64_t h = e / half;
    const auto i = static_cast<std::int32_t>(e % half);
    const std::int64_t base = token * x.token_stride + h * x.head_stride;
    const std::int64_t ia = base + (args.neox ? i : 2 * i);
    const std::int64_t ib = base + (args.neox ? i + half : 2 * i + 1);
    const float a = detail::load_float<kX>(x.data, ia);
    const float b = detail::load_float<kX>(x.data, ib);
    const float c = cos_of[i], s = sin_of[i];
    detail::store_activation(x.data, kX, ia, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    detail::store_activation(x.data, kX, ib, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
}

template <DType kX>
void launch_rope(const RopeArgs& args, std::int32_t num_tokens, cudaStream_t stream) {
  rope_kernel<kX><<<static_cast<unsigned>(num_tokens), kRopeThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "rope_kernel launch");
}

// rope.cc's checks, less those of positions (device memory): positions
// must be >= 0, and below cache_max_position with a cache.
void validate_rope(const HeadTensor& x, std::int32_t num_tokens, std::int32_t num_heads,
                   std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& c) {
  constexpr const char* kCall = "cuda_apply_rope";
  require(num_tokens >= 0 && num_heads >= 1 && head_dim >= 2, kCall, ": num_tokens = ", num_tokens,
          ", num_heads = ", num_heads, ", head_dim = ", head_dim, " out of range");
  const std::int32_t r = c.rotary_dim == 0 ? head_dim : c.rotary_dim;
  require(r >= 2 && r % 2 == 0 && r <= head_dim, kCall, ": rotary_dim = ", c.rotary_dim,
          " must be even and in [2, head_dim = ", head_dim, "]");
  require<Unsupported>(r / 2 <= kMaxPairs, kCall, ": rotary_dim = ", r, " is above ", 2 * kMaxPairs,
                       ", the most the CUDA kernel rotates");
  require(is_activation_dtype(x.dtype), kCall, ": x.dtype = ", dtype_name(x.dtype), " (",
          static_cast<int>(x.dtype), ") must be float32, float16 or bfloat16");
  require(c.style == RopeStyle::kNeox || c.style == RopeStyle::kGptJ, kCall,
          ": style = ", static_cast<int>(c.style), " is neither Neox (0) nor GPT-J (1)");
  require(c.theta > 0.0f && c.scale > 0.0f && std::isfinite(c.theta) && std::isfinite(c.scale),
          kCall, ": theta = ", c.theta, " and scale = ", c.scale, " must be finite and > 0");
  require(c.attention_factor > 0.0f && std::isfinite(c.attention_factor), kCall,
          ": attention_factor = ", c.attention_factor, " must be finite and > 0");
  const RopeLlama3Scaling& l3 = c.llama3;
  require(l3.factor == 0.0f ||
              (l3.factor > 0.0f && l3.low_freq_factor > 0.0f &&
               l3.high_freq_factor > l3.low_freq_factor && l3.original_max_position > 0),
          kCall, ": llama3 scaling factor = ", l3.factor,
          ", low_freq_factor = ", l3.low_freq_factor, ", high_freq_factor = ", l3.high_freq_factor,
          ", original_max_position = ", l3.original_max_position, " is inconsistent");
  const RopeYarnScaling& y = c.yarn;
  require(y.factor == 0.0f ||
              (y.factor > 1.0f && std::isfinite(y.factor) && y.original_max_position > 0 &&
               y.beta_fast > y.beta_slow && y.beta_slow > 0.0f && y.attention_factor >= 0.0f &&
               std::isfinite(y.attention_factor)),
          kCall, ": yarn scaling factor = ", y.factor,
          ", original_max_position = ", y.original_max_position, ", beta_fast = ", y.beta_fast,
          ", beta_slow = ", y.beta_slow, ", attention_factor = ", y.attention_factor,
          " is inconsistent");
  require((c.cos_cache == nullptr) == (c.sin_cache == nullptr), kCall,
          ": give both cos_cache and sin_cache or neither");
  if (c.freq_factors)  // host memory
    for (std::int32_t i = 0; i < r / 2; ++i)
      require(std::isfinite(c.freq_factors[i]) && c.freq_factors[i] > 0.0f, kCall,
              ": freq_factors[", i, "] = ", c.freq_factors[i], " must be finite and > 0");
  if (num_tokens == 0) return;
  require(x.data && positions, kCall, ": x.data and positions must be non-null (got ", x.data, ", ",
          positions, ")");
  require(!c.cos_cache || c.cache_max_position >= 1, kCall,
          ": cache_max_position = ", c.cache_max_position, " leaves the cos/sin cache empty");
}

}  // namespace

// Tokens whose position breaks the contract (negative, or at or beyond the
// cache's rows) are left unrotated.
void cuda_apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                     std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& config,
                     Stream stream) {
  validate_rope(x, num_tokens, num_heads, head_dim, positions, config);
  if (num_tokens == 0) return;
  const std::int32_t r = config.rotary_dim == 0 ? head_dim : config.rotary_dim;
  RopeArgs args;
  args.x = x;
  args.positions = positions;
  args.num_heads = num_heads;
  args.half = r / 2;
  args.neox = config.style == RopeStyle::kNeox;
  args.cos_cache = config.cos_cache;
  args.sin_cache = config.sin_cache;
  args.cache_max_position = config.cache_max_position;
  if (config.cos_cache == nullptr) {
    for (std::int32_t i = 0; i < args.half; ++i) args.inv_freq[i] = rope_inv_freq(config, r, i);
    args.magnitude = rope_attention_factor(config);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (x.dtype) {
    case DType::kF16:
      return launch_rope<DType::kF16>(args, num_tokens, s);
    case DType::kBF16:
      return launch_rope<DType::kBF16>(args, num_tokens, s);
    default:
      return launch_rope<DType::kF32>(args, num_tokens, s);
  }
}

}  // namespace pagedattn::cuda
