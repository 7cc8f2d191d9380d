// GGUF / ggml tensor element types and their exact dequantisation to f32.
//
// Every type of the format is known by id, name and block geometry (so any
// GGUF file parses); dequantisation is implemented for F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q4_K, Q5_K and Q6_K. The results equal the `gguf` Python
// package's gguf.quants.dequantize bit for bit (same f32 operations in the
// same order, no fused multiply-add), checked by python/tests/test_gguf.py.
#pragma once

#include <cstdint>
#include <string_view>

namespace pagedattn {

// ggml_type ids as stored in a GGUF tensor info.
enum class GgufType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

// Geometry of one type: `block_size` elements are stored in `block_bytes`
// bytes (1 and sizeof(element) for the plain types).
struct GgufTypeInfo {
  GgufType type;
  std::string_view name;  // "F32", "Q4_K", ... (the gguf package's names)
  std::int64_t block_size;
  std::int64_t block_bytes;
  bool dequantizable;  // dequantize_row supports it
};

// The info of a raw type id; nullptr for an id this build does not know.
const GgufTypeInfo* find_gguf_type(std::uint32_t type_id) noexcept;

// The info of a known type (every enumerator above is known).
const GgufTypeInfo& gguf_type_info(GgufType type);

// Parses a name ("Q4_K", "f16", case-insensitive); throws InvalidArgument.
GgufType parse_gguf_type(std::string_view name);

// Bytes of a row of `n` elements; throws InvalidArgument when n < 0 or n is
// not a multiple of the type's block size.
std::int64_t gguf_row_bytes(GgufType type, std::int64_t n);

// dst[0, n) = the `n` elements stored at src (gguf_row_bytes(type, n)
// bytes, any alignment). Throws Unsupported for a type without
// dequantisation and InvalidArgument for a bad n, before reading anything.
void dequantize_row(GgufType type, const void* src, float* dst, std::int64_t n);

}  // namespace pagedattn
