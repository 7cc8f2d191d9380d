// Shared by the peer-operator suites: random data, the logical (unpaged)
// model of a batch and its expected output from the scalar reference, a
// RoPE written independently of rope.h, and comparisons.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/dtype.h"

namespace pagedattn::ops::test {

// Raw bytes of `count` elements of `dtype`, every element decoding to NaN
// where the type has one (so a read of an unused slot poisons the result).
std::vector<unsigned char> poisoned_buffer(std::size_t count, DType dtype);

// `count` randn values rounded to `dtype` (returned as the rounded floats)
// and written to `raw` when given.
std::vector<float> randn(std::mt19937& rng, std::size_t count, DType dtype = DType::kF32);

// The batch as the peer means it: per sequence, its new queries and every
// key/value it attends to (already rotated / dequantised), in logical order.
struct LogicalBatch {
  std::int32_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<std::int32_t> q_lens;
  std::vector<float> q;                  // [tokens][num_qo_heads][head_dim]
  std::vector<std::vector<float>> k, v;  // per sequence [kv_len][num_kv_heads][head_dim]
};

// paged_attention_reference over one dense page per sequence:
// [tokens][num_qo_heads][head_dim].
std::vector<float> reference_output(const LogicalBatch& batch, const AttentionOptions& options);

// Rotates x [tokens][heads][dim] in place with a cos/sin table [rows][rotary_dim / 2]:
// half-split pairs (i, i + R/2) or interleaved (2i, 2i + 1).
void rotate(std::vector<float>& x, std::int32_t heads, std::int32_t dim,
            const std::vector<std::int32_t>& positions, const std::vector<float>& cos,
            const std::vector<float>& sin, std::int32_t rotary_dim, bool interleaved);

// Decodes `count` elements of `dtype` from raw bytes.
std::vector<float> decode(const void* raw, DType dtype, std::size_t count);

// |a - b| <= atol + rtol |b| element-wise (NaN fails); reports the first few misses.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, float atol,
                  float rtol, const std::string& what);

// `call` throws pagedattn::InvalidArgument whose message holds every part,
// and leaves every buffer in `watched` (the caches) byte-identical.
void expect_invalid(const std::function<void()>& call, const std::vector<std::string_view>& parts,
                    const std::vector<const std::vector<unsigned char>*>& watched);

}  // namespace pagedattn::ops::test
