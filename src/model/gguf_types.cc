// The ggml type table and dequantisation to f32.
//
// Block layouts (all little-endian; "f16" is an IEEE half scale):
//   Q4_0  (32 elems, 18 B): f16 d | 16 B nibbles. Byte j holds element j
//         (low nibble) and j + 16 (high nibble); x = d * (q - 8).
//   Q4_1  (32, 20 B): f16 d | f16 m | 16 B nibbles (as Q4_0); x = d * q + m.
//   Q5_0  (32, 22 B): f16 d | u32 qh | 16 B nibbles (as Q4_0); bit j of qh
//         is bit 4 of element j; x = d * (q - 16).
//   Q5_1  (32, 24 B): f16 d | f16 m | u32 qh | 16 B nibbles; x = d * q + m.
//   Q8_0  (32, 34 B): f16 d | 32 x int8 q; x = d * q.
//   Q4_K  (256, 144 B): f16 d | f16 dmin | 12 B packed 6-bit scales and mins
//         for 8 sub-blocks of 32 | 128 B nibbles: bytes [32i, 32i + 32) hold
//         sub-block 2i (low nibbles) and 2i + 1 (high nibbles);
//         x = (d * sc) * q - (dmin * m).
//   Q5_K  (256, 176 B): as Q4_K with 32 B of high bits between the scales
//         and the nibbles: bit j of qh[l] is bit 4 of element l of
//         sub-block j.
//   Q6_K  (256, 210 B): 128 B low nibbles | 64 B 2-bit highs | 16 x int8
//         scales (one per 16 elements) | f16 d; x = (d * scale) * (q - 32).
//         Element 128 h + 32 g + l (h < 2, g < 4, l < 32) takes the low
//         (g < 2) or high nibble of ql[64 h + 32 (g % 2) + l] and bits
//         2g, 2g + 1 of qh[32 h + l].
// The f32 operations and their order follow the gguf package's numpy code;
// this file is compiled with -ffp-contract=off so no multiply-add is fused.
#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <string>

#include "pagedattn/errors.h"
#include "pagedattn/gguf_types.h"

namespace pagedattn {
namespace {

constexpr std::int64_t kQK = 32;    // elements per block of the 32-wide formats
constexpr std::int64_t kQKK = 256;  // elements per K-quant super-block

constexpr std::array<GgufTypeInfo, 32> kTypes = {{
    {GgufType::kF32, "F32", 1, 4, true},
    {GgufType::kF16, "F16", 1, 2, true},
    {GgufType::kQ4_0, "Q4_0", 32, 18, true},
    {GgufType::kQ4_1, "Q4_1", 32, 20, true},
    {GgufType::kQ5_0, "Q5_0", 32, 22, true},
    {GgufType::kQ5_1, "Q5_1", 32, 24, true},
    {GgufType::kQ8_0, "Q8_0", 32, 34, true},
    {GgufType::kQ8_1, "Q8_1", 32, 40, false},
    {GgufType::kQ2_K, "Q2_K", 256, 84, false},
    {GgufType::kQ3_K, "Q3_K", 256, 110, false},
    {GgufType::kQ4_K, "Q4_K", 256, 144, true},
    {GgufType::kQ5_K, "Q5_K", 256, 176, true},
    {GgufType::kQ6_K, "Q6_K", 256, 210, true},
    {GgufType::kQ8_K, "Q8_K", 256, 292, false},
    {GgufType::kIQ2_XXS, "IQ2_XXS", 256, 66, false},
    {GgufType::kIQ2_XS, "IQ2_XS", 256, 74, false},
    {GgufType::kIQ3_XXS, "IQ3_XXS", 256, 98, false},
    {GgufType::kIQ1_S, "IQ1_S", 256, 50, false},
    {GgufType::kIQ4_NL, "IQ4_NL", 32, 18, false},
    {GgufType::kIQ3_S, "IQ3_S", 256, 110, false},
    {GgufType::kIQ2_S, "IQ2_S", 256, 82, false},
    {GgufType::kIQ4_XS, "IQ4_XS", 256, 136, false},
    {GgufType::kI8, "I8", 1, 1, false},
    {GgufType::kI16, "I16", 1, 2, false},
    {GgufType::kI32, "I32", 1, 4, false},
    {GgufType::kI64, "I64", 1, 8, false},
    {GgufType::kF64, "F64", 1, 8, false},
    {GgufType::kIQ1_M, "IQ1_M", 256, 56, false},
    {GgufType::kBF16, "BF16", 1, 2, true},
    {GgufType::kTQ1_0, "TQ1_0", 256, 54, false},
    {GgufType::kTQ2_0, "TQ2_0", 256, 66, false},
    {GgufType::kMXFP4, "MXFP4", 32, 17, false},
}};

// IEEE half -> float, exact, NaN payloads kept (as numpy's conversion).
// Branch-free (selects), so loops over it vectorise.
inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = h & 0x7fffu;
  const std::uint32_t exponent = magnitude >> 10;
  // Normal: rebias the exponent by 127 - 15 = 112; inf / NaN: all ones.
  const std::uint32_t rebiased = (magnitude << 13) + (112u << 23);
  const std::uint32_t special = (magnitude << 13) | 0x7f800000u;
  // Zero / subnormal: mantissa * 2^-24 is exact in f32.
  const std::uint32_t small =
      std::bit_cast<std::uint32_t>(static_cast<float>(magnitude) * 0x1p-24f);
  const std::uint32_t bits = exponent == 0 ? small : (exponent == 0x1f ? special : rebiased);
  return std::bit_cast<float>(sign | bits);
}

static_assert(std::endian::native == std::endian::little, "GGUF data is little-endian");

inline std::uint16_t load_u16(const std::uint8_t* p) noexcept {
  std::uint16_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}
inline float load_half(const std::uint8_t* p) noexcept {
  return half_to_float(load_u16(p));
}

void dequantize_f32(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

void dequantize_f16(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = load_half(src + 2 * i);
}

void dequantize_bf16(const std::uint8_t* __restrict src, float* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_u16(src + 2 * i)) << 16);
}

void dequantize_q4_0(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 18, dst += kQK) {
    const float d = load_half(src);
    const std::uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) dst[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    for (int j = 0; j < 16; ++j) dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// The 5-bit quants of a Q5_0 / Q5_1 block: nibbles as Q4_0, the fifth bit
// of element j in bit j of the little-endian u32 qh.
inline void q5_quants(const std::uint8_t* qh_bytes, const std::uint8_t* qs, int q[32]) noexcept {
  std::uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
  }
}

void dequantize_q5_0(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  int q[32];
  for (std::int64_t b = 0; b < blocks; ++b, src += 22, dst += kQK) {
    const float d = load_half(src);
    q5_quants(src + 2, src + 6, q);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j] - 16);
  }
}

void dequantize_q5_1(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  int q[32];
  for (std::int64_t b = 0; b < blocks; ++b, src += 24, dst += kQK) {
    const float d = load_half(src), m = load_half(src + 2);
    q5_quants(src + 4, src + 8, q);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j]) + m;
  }
}

void dequantize_q4_1(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 20, dst += kQK) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const std::uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) dst[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    for (int j = 0; j < 16; ++j) dst[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void dequantize_q8_0(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 34, dst += kQK) {
    const float d = load_half(src);
    for (int j = 0; j < 32; ++j)
      dst[j] = d * static_cast<float>(static_cast<std::int8_t>(src[2 + j]));
  }
}

// The 6-bit scale and min of sub-block j (< 8) from the 12 packed bytes of a
// Q4_K / Q5_K super-block: j < 4 in the low 6 bits of bytes j and j + 4;
// j >= 4 split between a nibble of byte j + 4 and the top 2 bits of bytes
// j - 4 and j.
inline void k_scale_min(const std::uint8_t* s, int j, std::uint8_t& scale, std::uint8_t& min) {
  if (j < 4) {
    scale = s[j] & 0x3f;
    min = s[j + 4] & 0x3f;
  } else {
    scale = static_cast<std::uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30));
    min = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30));
  }
}

void dequantize_q4_k(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 144, dst += kQKK) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const std::uint8_t* scales = src + 4;
    const std::uint8_t* qs = src + 16;
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, m;
      k_scale_min(scales, j, sc, m);
      const float scale = d * static_cast<float>(sc);
      const float offset = dmin * static_cast<float>(m);
      const std::uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      float* out = dst + 32 * j;
      for (int l = 0; l < 32; ++l)
        out[l] = scale * static_cast<float>((q[l] >> shift) & 0x0f) - offset;
    }
  }
}

void dequantize_q5_k(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 176, dst += kQKK) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const std::uint8_t* scales = src + 4;
    const std::uint8_t* qh = src + 16;
    const std::uint8_t* qs = src + 48;
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, m;
      k_scale_min(scales, j, sc, m);
      const float scale = d * static_cast<float>(sc);
      const float offset = dmin * static_cast<float>(m);
      const std::uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      float* out = dst + 32 * j;
      for (int l = 0; l < 32; ++l) {
        const int value = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
        out[l] = scale * static_cast<float>(value) - offset;
      }
    }
  }
}

void dequantize_q6_k(const std::uint8_t* __restrict src, float* __restrict dst,
                     std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 210, dst += kQKK) {
    const std::uint8_t* ql = src;
    const std::uint8_t* qh = src + 128;
    const std::uint8_t* scales = src + 192;
    const float d = load_half(src + 208);
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 4; ++g) {
        const std::uint8_t* low = ql + 64 * h + 32 * (g % 2);
        const int low_shift = 4 * (g / 2);
        const std::uint8_t* high = qh + 32 * h;
        float* out = dst + 128 * h + 32 * g;
        // 32 elements = two groups of 16, each with its own scale.
        for (int half = 0; half < 2; ++half) {
          const int element = 128 * h + 32 * g + 16 * half;
          const float scale =
              d * static_cast<float>(static_cast<std::int8_t>(scales[element / 16]));
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int value = ((low[l] >> low_shift) & 0x0f) | (((high[l] >> (2 * g)) & 3) << 4);
            out[l] = scale * static_cast<float>(value - 32);
          }
        }
      }
    }
  }
}

}  // namespace

const GgufTypeInfo* find_gguf_type(std::uint32_t type_id) noexcept {
  for (const GgufTypeInfo& info : kTypes)
    if (static_cast<std::uint32_t>(info.type) == type_id) return &info;
  return nullptr;
}

const GgufTypeInfo& gguf_type_info(GgufType type) {
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
  require(info != nullptr, "gguf_type_info: type id ", static_cast<std::uint32_t>(type),
          " is not a known ggml type");
  return *info;
}

GgufType parse_gguf_type(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const GgufTypeInfo& info : kTypes)
    if (info.name == upper) return info.type;
  throw InvalidArgument(detail::concat("parse_gguf_type: '", name, "' is not a ggml type name"));
}

std::int64_t gguf_row_bytes(GgufType type, std::int64_t n) {
  const GgufTypeInfo& info = gguf_type_info(type);
  require(n >= 0 && n % info.block_size == 0, "gguf_row_bytes: n = ", n,
          " is not a non-negative multiple of the ", info.name, " block size ", info.block_size);
  return n / info.block_size * info.block_bytes;
}

void dequantize_row(GgufType type, const void* src, float* dst, std::int64_t n) {
  const GgufTypeInfo& info = gguf_type_info(type);
  require<Unsupported>(info.dequantizable, "dequantize_row: type ", info.name,
                       " has no dequantisation in pagedattn (supported: F32, F16, BF16, Q8_0, "
                       "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  require(n >= 0 && n % info.block_size == 0, "dequantize_row: n = ", n,
          " is not a non-negative multiple of the ", info.name, " block size ", info.block_size);
  require(n == 0 || (src != nullptr && dst != nullptr), "dequantize_row: null src or dst");
  const auto* bytes = static_cast<const std::uint8_t*>(src);
  const std::int64_t blocks = n / info.block_size;
  switch (type) {
    case GgufType::kF32:
      return dequantize_f32(bytes, dst, n);
    case GgufType::kF16:
      return dequantize_f16(bytes, dst, n);
    case GgufType::kBF16:
      return dequantize_bf16(bytes, dst, n);
    case GgufType::kQ4_0:
      return dequantize_q4_0(bytes, dst, blocks);
    case GgufType::kQ4_1:
      return dequantize_q4_1(bytes, dst, blocks);
    case GgufType::kQ5_0:
      return dequantize_q5_0(bytes, dst, blocks);
    case GgufType::kQ5_1:
      return dequantize_q5_1(bytes, dst, blocks);
    case GgufType::kQ8_0:
      return dequantize_q8_0(bytes, dst, blocks);
    case GgufType::kQ4_K:
      return dequantize_q4_k(bytes, dst, blocks);
    case GgufType::kQ5_K:
      return dequantize_q5_k(bytes, dst, blocks);
    case GgufType::kQ6_K:
      return dequantize_q6_k(bytes, dst, blocks);
    default:
      throw InternalError(detail::concat("dequantize_row: ", info.name, " marked dequantizable"));
  }
}

}  // namespace pagedattn
