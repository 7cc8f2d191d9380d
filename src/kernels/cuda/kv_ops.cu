// The K/V block ops on the device: append through a slot mapping (vLLM's
// reshape_and_cache, quantising on write bit for bit as the CPU append),
// page copies in device memory (copy_blocks) and host <-> device page moves
// (swap_blocks).
//
// Every argument is validated on the host before the first CUDA call, from
// the metadata alone: the slot mapping, fp8 per-head scales and NaN flags
// are device memory and are never read here (see the contracts below).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda {
namespace {

// --- CUDA errors --------------------------------------------------------------------

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "pagedattn::cuda", what);
}

// After a <<<>>> launch: a bad configuration shows up here.
void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

cudaStream_t as_cuda(Stream stream) {
  return static_cast<cudaStream_t>(stream);
}

// --- element conversions (device) ---------------------------------------------------
//
// Ports of dtype.h's scalar conversions, which the CPU append's vector code
// matches bit for bit: the device intrinsics agree with them on every number
// but not on every NaN payload, and the append must equal the CPU's bytes.

__device__ __forceinline__ float f16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f)  // infinity, or NaN made quiet
    return __uint_as_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  if (exp == 0) {  // zero or subnormal: mant x 2^-24, exact in f32
    const float magnitude = __fmul_rn(static_cast<float>(mant), 0x1p-24f);
    return __uint_as_float(sign | __float_as_uint(magnitude));
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest even; overflow to infinity; NaN stays NaN (quiet).
__device__ __forceinline__ std::uint16_t float_to_f16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u)
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (abs_bits >= 0x38800000u) {  // normal binary16 (>= 2^-14): drop 13 mantissa bits
    const std::uint32_t rounded = (abs_bits + 0xfffu + ((abs_bits >> 13) & 1u)) >> 13;
    return static_cast<std::uint16_t>(sign | (rounded - (112u << 10)));
  }
  const std::uint32_t exp = abs_bits >> 23;
  if (exp < 102) return sign;  // below 2^-25: rounds to zero
  // Subnormal result: round mant x 2^(exp - 150) / 2^-24 to an integer, ties to even.
  const std::uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // 14 .. 24
  std::uint32_t result = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (result & 1u) != 0)) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

// Round to nearest even; NaN stays NaN (quiet).
__device__ __forceinline__ std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// fp8 with kMant mantissa bits and bias kBias: round to nearest even,
// saturating at +-max finite (kMaxCode); NaN to kNanCode with its sign.
template <int kMant, int kBias, std::uint8_t kMaxCode, std::uint8_t kNanCode>
__device__ __forceinline__ std::uint8_t float_to_fp8(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | kNanCode;
  const float magnitude = __uint_as_float(abs_bits);
  const float min_normal = ldexpf(1.0f, 1 - kBias);
  std::uint32_t code;
  if (magnitude < min_normal) {
    // Subnormal: multiples of 2^(1 - bias - mant); rintf rounds to nearest even.
    code = static_cast<std::uint32_t>(rintf(ldexpf(magnitude, kBias - 1 + kMant)));
  } else {
    constexpr int kShift = 23 - kMant;
    const std::uint32_t rounded =
        (abs_bits + (1u << (kShift - 1)) - 1u + ((abs_bits >> kShift) & 1u)) >> kShift;
    code = rounded - (static_cast<std::uint32_t>(127 - kBias) << kMant);
  }
  return sign | static_cast<std::uint8_t>(code > kMaxCode ? kMaxCode : code);
}

// Round to nearest even, clamp to [-127, 127]; NaN to 0.
__device__ __forceinline__ std::int8_t float_to_int8(float value) {
  if (!(value == value)) return 0;
  const float r = rintf(value);
  return static_cast<std::int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

// An activation element (f32, f16, bf16) as f32, exactly.
__device__ __forceinline__ float load_activation_exact(const void* base, DType type,
                                                       std::int64_t index) {
  switch (type) {
    case DType::kF16:
      return f16_bits_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

// f32 to the storage code of kStore (without its scale).
template <DType kStore>
__device__ __forceinline__ auto encode(float value) {
  if constexpr (kStore == DType::kF32) {
    return value;
  } else if constexpr (kStore == DType::kF16) {
    return float_to_f16_bits(value);
  } else if constexpr (kStore == DType::kBF16) {
    return float_to_bf16_bits(value);
  } else if constexpr (kStore == DType::kFP8E4M3) {
    return float_to_fp8<3, 7, 0x7e, 0x7f>(value);
  } else if constexpr (kStore == DType::kFP8E5M2) {
    return float_to_fp8<2, 15, 0x7b, 0x7e>(value);
  } else {
    return float_to_int8(value);
  }
}

template <DType kStore>
using Code = decltype(encode<kStore>(0.0f));

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// --- append (device) ----------------------------------------------------------------

constexpr int kWarp = 32;
constexpr int kAppendMaxWarps = 8;

// One token's K (or V) row of one head, read from an activation tensor.
struct SourceRow {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t at = 0;  // element index of the row's first element
};

// Writes one row of `dim` elements with the lanes of one warp, as the CPU's
// write_row: float storage converts (or copies the bits when the types
// match), fp8 multiplies by 1 / fp8_scale, int8 derives the row's scale
// max|x| / 127, stores it to *int8_scale and multiplies by its reciprocal.
// Returns whether this lane stored an e4m3 NaN code.
template <DType kStore>
__device__ bool write_row(SourceRow src, std::int32_t dim, void* dst_data, std::int64_t dst_at,
                          float fp8_scale, float* int8_scale, int lane) {
  using CodeT = Code<kStore>;
  CodeT* out = static_cast<CodeT*>(dst_data) + dst_at;
  if constexpr (!is_quantized(kStore)) {
    if (src.dtype == kStore) {  // the CPU's memcpy: bits as they are, NaN payloads included
      const CodeT* in = static_cast<const CodeT*>(src.data) + src.at;
      for (std::int32_t d = lane; d < dim; d += kWarp) out[d] = in[d];
    } else {
      for (std::int32_t d = lane; d < dim; d += kWarp)
        out[d] = encode<kStore>(load_activation_exact(src.data, src.dtype, src.at + d));
    }
    return false;
  } else {
    float multiplier;
    if constexpr (kStore == DType::kINT8) {
      float abs_max = 0.0f;  // order-free for rows without NaN, as the CPU's vector maximum
      for (std::int32_t d = lane; d < dim; d += kWarp)
        abs_max = fmaxf(abs_max, fabsf(load_activation_exact(src.data, src.dtype, src.at + d)));
      const float scale = __fdiv_rn(warp_max(abs_max), 127.0f);
      if (lane == 0) *int8_scale = scale;
      multiplier = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
    } else {
      multiplier = __fdiv_rn(1.0f, fp8_scale);
    }
    bool nan_code = false;
    for (std::int32_t d = lane; d < dim; d += kWarp) {
      const float value = load_activation_exact(src.data, src.dtype, src.at + d);
      const CodeT code = encode<kStore>(__fmul_rn(value, multiplier));
      out[d] = code;
      if constexpr (kStore == DType::kFP8E4M3) nan_code |= (code & 0x7fu) == 0x7fu;
    }
    return nan_code;
  }
}

struct AppendArgs {
  HeadTensor k;  // [num_tokens][num_kv_heads][head_dim], device
  HeadTensor v;  // [num_tokens][num_kv_heads][v_head_dim], device; unused for MLA
  const std::int64_t* slot_mapping = nullptr;  // [num_tokens], device
  PagedKVStorage kv;
  std::int64_t num_slots = 0;  // kv.num_pages * kv.page_size
};

// One CTA per token; its warps take the token's rows (K rows of every head,
// then V rows unless V lies in K), one warp a row.
template <DType kStore>
__global__ void append_kernel(const __grid_constant__ AppendArgs args) {
  const std::int64_t token = blockIdx.x;
  const std::int64_t slot = args.slot_mapping[token];
  if (slot < 0 || slot >= args.num_slots) return;  // -1 skips; out of range: defensively
  const PagedKVStorage& kv = args.kv;
  const std::int64_t page = slot / kv.page_size, offset = slot % kv.page_size;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  const std::int32_t rows = kv.v_in_k ? kv.num_kv_heads : 2 * kv.num_kv_heads;
  bool nan_code = false;
  for (std::int32_t row = warp; row < rows; row += warps) {  // uniform within a warp
    const bool is_v = row >= kv.num_kv_heads;
    const std::int32_t h = is_v ? row - kv.num_kv_heads : row;
    const HeadTensor& x = is_v ? args.v : args.k;
    const SourceRow src{x.data, x.dtype, token * x.token_stride + h * x.head_stride};
    const std::int64_t scale_at = kv.token_scale_index(page, h, offset);
    if (is_v) {
      const float fp8_scale =
          is_fp8(kStore) ? (kv.v_head_scales ? kv.v_head_scales[h] : kv.v_scale) : 1.0f;
      nan_code |=
          write_row<kStore>(src, kv.v_head_dim, kv.v_data, kv.v_offset(page, h, offset), fp8_scale,
                            kStore == DType::kINT8 ? kv.v_token_scales + scale_at : nullptr, lane);
    } else {
      const float fp8_scale =
          is_fp8(kStore) ? (kv.k_head_scales ? kv.k_head_scales[h] : kv.k_scale) : 1.0f;
      nan_code |=
          write_row<kStore>(src, kv.head_dim, kv.k_data, kv.k_offset(page, h, offset), fp8_scale,
                            kStore == DType::kINT8 ? kv.k_token_scales + scale_at : nullptr, lane);
    }
  }
  // Every writer of a NaN code stores the same 1: no ordering is needed.
  if (kStore == DType::kFP8E4M3 && nan_code && kv.page_may_hold_nan != nullptr)
    kv.page_may_hold_nan[page] = 1;
}

template <DType kStore>
void launch_append(const AppendArgs& args, std::int32_t num_tokens, cudaStream_t stream) {
  const std::int32_t rows = args.kv.v_in_k ? args.kv.num_kv_heads : 2 * args.kv.num_kv_heads;
  const int warps = std::clamp(rows, 1, kAppendMaxWarps);
  append_kernel<kStore><<<static_cast<unsigned>(num_tokens), warps * kWarp, 0, stream>>>(args);
  check_launch("append_kernel launch");
}

// --- validation (host, metadata only) -------------------------------------------------

bool known_dtype(DType t) {
  return dtype_size(t) != 0;
}

std::string dtype_text(DType t) {
  return std::string(dtype_name(t)) + " (" + std::to_string(static_cast<int>(t)) + ")";
}

// The fields the kernels index with: a storage the CPU kernels accept passes.
void validate_storage_shape(const PagedKVStorage& kv, const char* call, const char* name) {
  require(known_dtype(kv.dtype), call, ": ", name, ".dtype = ", dtype_text(kv.dtype),
          " is not a storage dtype");
  require(kv.layout == KVLayout::kHND || kv.layout == KVLayout::kNHD, call, ": ", name,
          ".layout = ", static_cast<int>(kv.layout), " is neither HND (0) nor NHD (1)");
  require(kv.page_size >= 1 && kv.num_kv_heads >= 1 && kv.head_dim >= 1 && kv.v_head_dim >= 0 &&
              kv.num_pages >= 0,
          call, ": ", name, " has page_size = ", kv.page_size, ", num_kv_heads = ", kv.num_kv_heads,
          ", head_dim = ", kv.head_dim, ", v_head_dim = ", kv.v_head_dim,
          ", num_pages = ", kv.num_pages, "; page_size, num_kv_heads and head_dim must be >= 1");
}

// append.cc's checks, less those that read device memory: the slot mapping
// (range and uniqueness are the caller's contract) and fp8 per-head scales.
void validate_append(const AppendParams& p) {
  constexpr const char* kCall = "cuda_append_paged_kv";
  const PagedKVStorage& kv = p.kv;
  require(p.num_tokens >= 0, kCall, ": num_tokens = ", p.num_tokens, " must be >= 0");
  if (p.num_tokens == 0) return;
  require(p.slot_mapping && p.k.data && (p.v.data || kv.v_in_k) && kv.k_data && kv.v_data, kCall,
          ": slot_mapping, k.data, v.data, kv.k_data and kv.v_data must be non-null (got ",
          p.slot_mapping, ", ", p.k.data, ", ", p.v.data, ", ", kv.k_data, ", ", kv.v_data, ")");
  require(!kv.v_in_k || p.v.data == nullptr, kCall,
          ": v.data must be null for a storage whose V lies in K (MLA)");
  validate_storage_shape(kv, kCall, "kv");
  require(is_activation_dtype(p.k.dtype) && (kv.v_in_k || is_activation_dtype(p.v.dtype)), kCall,
          ": k.dtype = ", dtype_text(p.k.dtype), " and v.dtype = ", dtype_text(p.v.dtype),
          " must be float32, float16 or bfloat16");
  require(kv.dtype != DType::kINT8 || (kv.k_token_scales && kv.v_token_scales), kCall,
          ": int8 storage needs kv.k_token_scales and kv.v_token_scales");
  if (!is_fp8(kv.dtype)) return;
  const auto usable = [](float s) { return s > 0.0f && std::isfinite(s); };
  require(kv.k_head_scales || usable(kv.k_scale), kCall, ": kv.k_scale = ", kv.k_scale,
          " must be finite and > 0");
  require(kv.v_head_scales || usable(kv.v_scale), kCall, ": kv.v_scale = ", kv.v_scale,
          " must be finite and > 0");
}

template <class T>
void require_same(const char* call, const char* field, const T& src, const T& dst) {
  require(src == dst, call, ": src.", field, " = ", src, " and dst.", field, " = ", dst, " differ");
}

// page_copy.cc's checks (every one reads host memory only: the pairs).
void validate_copy(const PagedKVStorage& src, const PagedKVStorage& dst,
                   std::span<const std::pair<std::int64_t, std::int64_t>> pairs, const char* call) {
  validate_storage_shape(src, call, "src");
  require_same(call, "dtype", dtype_text(src.dtype), dtype_text(dst.dtype));
  require_same(call, "layout", static_cast<int>(src.layout), static_cast<int>(dst.layout));
  require_same(call, "page_size", src.page_size, dst.page_size);
  require_same(call, "num_kv_heads", src.num_kv_heads, dst.num_kv_heads);
  require_same(call, "head_dim", src.head_dim, dst.head_dim);
  require_same(call, "v_head_dim", src.v_head_dim, dst.v_head_dim);
  require_same(call, "k_page_stride", src.k_page_stride, dst.k_page_stride);
  require_same(call, "v_page_stride", src.v_page_stride, dst.v_page_stride);
  require_same(call, "v_in_k", src.v_in_k, dst.v_in_k);
  require(src.k_data && src.v_data && dst.k_data && dst.v_data, call,
          ": storage data pointers must be non-null (src ", src.k_data, ", ", src.v_data, "; dst ",
          dst.k_data, ", ", dst.v_data, ")");
  require(src.dtype != DType::kINT8 || (src.k_token_scales && dst.k_token_scales &&
                                        src.v_token_scales && dst.v_token_scales),
          call, ": int8 storages need token scales on both sides");
  std::vector<std::int64_t> dsts, srcs;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto [s, d] = pairs[i];
    require(s >= 0 && s < src.num_pages, call, ": pair ", i, " source page ", s, " is outside [0, ",
            src.num_pages, ")");
    require(d >= 0 && d < dst.num_pages, call, ": pair ", i, " destination page ", d,
            " is outside [0, ", dst.num_pages, ")");
    dsts.push_back(d);
    srcs.push_back(s);
  }
  std::sort(dsts.begin(), dsts.end());
  const auto dup = std::adjacent_find(dsts.begin(), dsts.end());
  require(dup == dsts.end(), call, ": destination page ", dup == dsts.end() ? 0 : *dup,
          " appears more than once");
  if (src.k_data != dst.k_data) return;
  std::sort(srcs.begin(), srcs.end());
  for (std::int64_t d : dsts)
    require(!std::binary_search(srcs.begin(), srcs.end(), d), call, ": page ", d,
            " is both a source and a destination");
}

// Whether `s` keeps NaN flags (e4m3 with a flag array).
__host__ __device__ bool keeps_nan_flags(const PagedKVStorage& s) {
  return s.dtype == DType::kFP8E4M3 && s.page_may_hold_nan != nullptr;
}

// --- copy_pages (device) ----------------------------------------------------------------

constexpr int kCopyThreads = 256;
// Pairs per launch, passed by value: the arguments stay within the 4 KiB
// every driver accepts, and no device buffer or host staging is needed.
constexpr int kPairsPerLaunch = 128;

struct CopyPagesArgs {
  PagedKVStorage src, dst;  // device memory
  std::int64_t src_pages[kPairsPerLaunch];
  std::int64_t dst_pages[kPairsPerLaunch];
  // The destination keeps NaN flags and the source none: each copied page's
  // flag is whether its rows hold an e4m3 NaN code (the CPU's scan).
  bool scan_for_nan = false;
};
static_assert(sizeof(CopyPagesArgs) <= 4000, "kernel arguments must stay within 4 KiB");

template <class Word>
__device__ void copy_words(void* dst, const void* src, std::int64_t bytes) {
  auto* out = static_cast<Word*>(dst);
  const auto* in = static_cast<const Word*>(src);
  const std::int64_t words = bytes / static_cast<std::int64_t>(sizeof(Word));
  for (std::int64_t i = threadIdx.x; i < words; i += blockDim.x) out[i] = in[i];
}

// The CTA copies `bytes` bytes, in 16-, 4- or 1-byte words as the addresses
// and the size allow.
__device__ void block_copy(void* dst, const void* src, std::int64_t bytes) {
  const std::uint64_t alignment = reinterpret_cast<std::uintptr_t>(dst) |
                                  reinterpret_cast<std::uintptr_t>(src) |
                                  static_cast<std::uint64_t>(bytes);
  if (alignment % 16 == 0) {
    copy_words<uint4>(dst, src, bytes);
  } else if (alignment % 4 == 0) {
    copy_words<std::uint32_t>(dst, src, bytes);
  } else {
    copy_words<std::uint8_t>(dst, src, bytes);
  }
}

// Whether any e4m3 byte this thread reads of the page's rows (every head
// and slot, `dim` codes each; strides in elements = bytes) is a NaN code.
__device__ bool thread_sees_e4m3_nan(const void* data, std::int64_t page_at,
                                     std::int64_t head_stride, std::int64_t token_stride,
                                     std::int32_t heads, std::int32_t page_size, std::int32_t dim) {
  const auto* bytes = static_cast<const std::uint8_t*>(data) + page_at;
  const std::int64_t codes = std::int64_t{heads} * page_size * dim;
  bool found = false;
  for (std::int64_t e = threadIdx.x; e < codes; e += blockDim.x) {
    const std::int64_t row = e / dim, d = e % dim;
    const std::int64_t h = row / page_size, slot = row % page_size;
    found |= (bytes[h * head_stride + slot * token_stride + d] & 0x7fu) == 0x7fu;
  }
  return found;
}

// `base` moved by `bytes`.
__device__ void* at_byte(void* base, std::int64_t bytes) {
  return static_cast<std::byte*>(base) + bytes;
}

// One CTA per pair: the page's K and V bytes (page stride each), its int8
// token scales and its NaN flag, as the CPU copy_pages.
__global__ void copy_pages_kernel(const __grid_constant__ CopyPagesArgs args) {
  const PagedKVStorage& src = args.src;
  const PagedKVStorage& dst = args.dst;
  const std::int64_t s = args.src_pages[blockIdx.x], d = args.dst_pages[blockIdx.x];
  const auto es = static_cast<std::int64_t>(dtype_size(src.dtype));
  block_copy(at_byte(dst.k_data, dst.k_offset(d, 0, 0) * es),
             at_byte(src.k_data, src.k_offset(s, 0, 0) * es), src.k_page_stride * es);
  if (!src.v_in_k)  // MLA: the row is K and V, one scale per row
    block_copy(at_byte(dst.v_data, dst.v_offset(d, 0, 0) * es),
               at_byte(src.v_data, src.v_offset(s, 0, 0) * es), src.v_page_stride * es);
  if (src.dtype == DType::kINT8) {
    const auto scale_bytes =
        std::int64_t{src.num_kv_heads} * src.page_size * static_cast<std::int64_t>(sizeof(float));
    block_copy(dst.k_token_scales + dst.token_scale_index(d, 0, 0),
               src.k_token_scales + src.token_scale_index(s, 0, 0), scale_bytes);
    if (!src.v_in_k)
      block_copy(dst.v_token_scales + dst.token_scale_index(d, 0, 0),
                 src.v_token_scales + src.token_scale_index(s, 0, 0), scale_bytes);
  }
  if (!keeps_nan_flags(dst)) return;  // uniform: kernel arguments only
  if (!args.scan_for_nan) {
    if (threadIdx.x == 0) dst.page_may_hold_nan[d] = src.page_may_hold_nan[s];
    return;
  }
  bool nan =
      thread_sees_e4m3_nan(src.k_data, src.k_offset(s, 0, 0), src.k_head_stride, src.k_token_stride,
                           src.num_kv_heads, src.page_size, src.head_dim);
  if (!src.v_in_k)
    nan |=
        thread_sees_e4m3_nan(src.v_data, src.v_offset(s, 0, 0), src.v_head_stride,
                             src.v_token_stride, src.num_kv_heads, src.page_size, src.v_head_dim);
  nan = __syncthreads_or(nan) != 0;
  if (threadIdx.x == 0) dst.page_may_hold_nan[d] = nan ? 1 : 0;
}

// --- swap_pages (host) -------------------------------------------------------------------

// Pages [src, src + count) go to [dst, dst + count).
struct PageRun {
  std::int64_t src = 0, dst = 0, count = 0;
};

// The pairs in destination order, consecutive pages joined into runs.
std::vector<PageRun> page_runs(std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted(pairs.begin(), pairs.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<PageRun> runs;
  for (const auto& [s, d] : sorted) {
    if (!runs.empty() && runs.back().src + runs.back().count == s &&
        runs.back().dst + runs.back().count == d) {
      ++runs.back().count;
    } else {
      runs.push_back({s, d, 1});
    }
  }
  return runs;
}

// Host NaN flags set to 1 in stream order, after the page copies before them.
struct HostFlagUpdate {
  std::uint8_t* flags = nullptr;
  std::vector<PageRun> runs;
};

void CUDART_CB mark_host_flags(void* data) {
  const std::unique_ptr<HostFlagUpdate> update(static_cast<HostFlagUpdate*>(data));
  for (const PageRun& run : update->runs)
    std::fill_n(update->flags + run.dst, run.count, std::uint8_t{1});
}

// Whether the copy of whole K pages already moves every int8 token scale:
// both sides keep them inside their K pages, at the same place
// (PagedKVCache's storage).
bool token_scales_ride_with_k(const PagedKVStorage& src, const PagedKVStorage& dst) {
  const auto at = [](const PagedKVStorage& s, const float* scales) {
    return reinterpret_cast<std::uintptr_t>(scales) - reinterpret_cast<std::uintptr_t>(s.k_data);
  };
  return src.token_scales_in_k_pages() && dst.token_scales_in_k_pages() &&
         at(src, src.k_token_scales) == at(dst, dst.k_token_scales) &&
         at(src, src.v_token_scales) == at(dst, dst.v_token_scales);
}

// Enqueues the copies of one run: K, V, int8 token scales, NaN flags where
// both sides keep them (else on the host-to-device side a conservative 1).
void swap_run(const PagedKVStorage& src, const PagedKVStorage& dst, const PageRun& run,
              cudaMemcpyKind kind, cudaStream_t stream) {
  const auto es = static_cast<std::int64_t>(dtype_size(src.dtype));
  const auto copy = [&](void* to, std::int64_t to_at, const void* from, std::int64_t from_at,
                        std::int64_t bytes, const char* what) {
    check_cuda(cudaMemcpyAsync(static_cast<std::byte*>(to) + to_at,
                               static_cast<const std::byte*>(from) + from_at,
                               static_cast<std::size_t>(bytes), kind, stream),
               what);
  };
  copy(dst.k_data, dst.k_offset(run.dst, 0, 0) * es, src.k_data, src.k_offset(run.src, 0, 0) * es,
       run.count * src.k_page_stride * es, "cudaMemcpyAsync of K pages");
  if (!src.v_in_k)
    copy(dst.v_data, dst.v_offset(run.dst, 0, 0) * es, src.v_data, src.v_offset(run.src, 0, 0) * es,
         run.count * src.v_page_stride * es, "cudaMemcpyAsync of V pages");
  if (src.dtype == DType::kINT8 && !token_scales_ride_with_k(src, dst)) {
    // One copy per run where both sides' scale arrays are dense, else one per page.
    const std::int64_t per_page = std::int64_t{src.num_kv_heads} * src.page_size;
    const bool dense =
        src.token_scale_page_step() == per_page && dst.token_scale_page_step() == per_page;
    const std::int64_t pages_per_copy = dense ? run.count : 1;
    const std::int64_t bytes = pages_per_copy * per_page * static_cast<std::int64_t>(sizeof(float));
    const auto sf = static_cast<std::int64_t>(sizeof(float));
    for (std::int64_t i = 0; i < run.count; i += pages_per_copy) {
      copy(dst.k_token_scales, dst.token_scale_index(run.dst + i, 0, 0) * sf, src.k_token_scales,
           src.token_scale_index(run.src + i, 0, 0) * sf, bytes,
           "cudaMemcpyAsync of K token scales");
      if (!src.v_in_k)
        copy(dst.v_token_scales, dst.token_scale_index(run.dst + i, 0, 0) * sf, src.v_token_scales,
             src.token_scale_index(run.src + i, 0, 0) * sf, bytes,
             "cudaMemcpyAsync of V token scales");
    }
  }
  if (!keeps_nan_flags(dst)) return;
  if (keeps_nan_flags(src)) {
    copy(dst.page_may_hold_nan, run.dst, src.page_may_hold_nan, run.src, run.count,
         "cudaMemcpyAsync of NaN flags");
  } else if (kind == cudaMemcpyHostToDevice) {
    check_cuda(cudaMemsetAsync(dst.page_may_hold_nan + run.dst, 1,
                               static_cast<std::size_t>(run.count), stream),
               "cudaMemsetAsync of NaN flags");
  }  // device to host without source flags: mark_host_flags, after every run
}

}  // namespace

// --- public entry points ----------------------------------------------------------------

// Slots must be unique and each -1 or in [0, num_pages * page_size): the
// mapping is device memory, so this is the caller's contract, not checked
// here (the CPU append checks it). The kernel skips -1 and, defensively,
// any other slot outside that range. fp8 per-head scales (device memory)
// must be finite and > 0; the per-tensor ones are checked.
void cuda_append_paged_kv(const AppendParams& params, Stream stream) {
  validate_append(params);
  if (params.num_tokens == 0) return;
  AppendArgs args;
  args.k = params.k;
  args.v = params.v;
  args.slot_mapping = params.slot_mapping;
  args.kv = params.kv;
  args.num_slots = params.kv.num_pages * params.kv.page_size;
  const cudaStream_t s = as_cuda(stream);
  switch (params.kv.dtype) {
    case DType::kF32:
      return launch_append<DType::kF32>(args, params.num_tokens, s);
    case DType::kF16:
      return launch_append<DType::kF16>(args, params.num_tokens, s);
    case DType::kBF16:
      return launch_append<DType::kBF16>(args, params.num_tokens, s);
    case DType::kFP8E4M3:
      return launch_append<DType::kFP8E4M3>(args, params.num_tokens, s);
    case DType::kFP8E5M2:
      return launch_append<DType::kFP8E5M2>(args, params.num_tokens, s);
    case DType::kINT8:
      return launch_append<DType::kINT8>(args, params.num_tokens, s);
  }
}

// An e4m3 destination that keeps NaN flags gets the source page's flag, or,
// where the source keeps none, whether the source page's rows hold a NaN
// code (scanned on the device), as the CPU copy_pages.
void cuda_copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                     std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                     Stream stream) {
  validate_copy(src, dst, src_dst_pages, "cuda_copy_pages");
  CopyPagesArgs args;
  args.src = src;
  args.dst = dst;
  args.scan_for_nan = keeps_nan_flags(dst) && !keeps_nan_flags(src);
  for (std::size_t first = 0; first < src_dst_pages.size(); first += kPairsPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kPairsPerLaunch, src_dst_pages.size() - first);
    for (std::size_t i = 0; i < count; ++i) {
      args.src_pages[i] = src_dst_pages[first + i].first;
      args.dst_pages[i] = src_dst_pages[first + i].second;
    }
    copy_pages_kernel<<<static_cast<unsigned>(count), kCopyThreads, 0, as_cuda(stream)>>>(args);
    check_launch("copy_pages_kernel launch");
  }
}

// Runs of consecutive pages (in destination order, consecutive on both
// sides) move in one cudaMemcpyAsync per array. An e4m3 destination that
// keeps NaN flags gets the source's flags; where the source keeps none the
// destination pages are marked as possibly holding NaN codes (1), which is
// always safe: scanning would need the bytes in stream order on the host.
void cuda_swap_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                     std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                     SwapDirection direction, Stream stream) {
  validate_copy(src, dst, src_dst_pages, "cuda_swap_pages");
  require(direction == SwapDirection::kHostToDevice || direction == SwapDirection::kDeviceToHost,
          "cuda_swap_pages: direction = ", static_cast<int>(direction),
          " is neither host-to-device (0) nor device-to-host (1)");
  if (src_dst_pages.empty()) return;
  const cudaMemcpyKind kind =
      direction == SwapDirection::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  const std::vector<PageRun> runs = page_runs(src_dst_pages);
  for (const PageRun& run : runs) swap_run(src, dst, run, kind, as_cuda(stream));
  if (kind != cudaMemcpyDeviceToHost || !keeps_nan_flags(dst) || keeps_nan_flags(src)) return;
  auto update = std::make_unique<HostFlagUpdate>();
  update->flags = dst.page_may_hold_nan;
  update->runs = runs;
  check_cuda(cudaLaunchHostFunc(as_cuda(stream), mark_host_flags, update.get()),
             "cudaLaunchHostFunc marking NaN flags");
  update.release();  // mark_host_flags owns it now
}

}  // namespace pagedattn::cuda
