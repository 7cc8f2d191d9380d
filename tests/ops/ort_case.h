// A randomized ORT PagedAttention call with every buffer it needs, and the
// logical batch the reference sees: shuffled block ids, padded block tables
// whose unused entries are out of range, NaN in every unwritten cache slot.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ops_test_support.h"
#include "pagedattn/ops/ort.h"

namespace pagedattn::ops::test {

struct OrtSpec {
  std::vector<std::pair<std::int32_t, std::int32_t>> seqs;  // (new tokens, total tokens)
  std::int32_t num_heads = 6, kv_num_heads = 3, head_size = 32, block_size = 16;
  DType dtype = DType::kF32;
  bool rotary = false, interleaved = false, half_rotary = false;
  bool packed = false, four_d_cache = false, head_sink = false;
  bool slot_mapping = false;  // explicit slots; token `skip_token` gets -1
  std::int32_t skip_token = -1;
  std::int32_t local_window_size = -1;
  float softcap = 0.0f, scale = 0.0f;
  std::uint32_t seed = 1;
};

class OrtCase {
 public:
  explicit OrtCase(const OrtSpec& spec);

  ort::PagedAttentionParams params();
  // The reference's options for this spec (ORT conventions translated by the test).
  AttentionOptions options() const;
  std::vector<float> expected() const { return reference_output(logical_, options()); }
  std::vector<float> output() const;
  // K (or V) rows of the new tokens as stored in the cache, [tokens][Hkv][D],
  // and what they should be.
  std::vector<float> stored_new(bool value) const;
  const std::vector<float>& expected_new(bool value) const { return value ? new_v_ : new_k_; }

  const OrtSpec& spec() const { return spec_; }
  std::int32_t tokens() const { return tokens_; }
  std::vector<unsigned char> key_cache, value_cache;  // public: tests snapshot them
  std::vector<std::int32_t> cu, past, block_table;
  std::vector<std::int64_t> slots;
  std::vector<unsigned char> query, key, value, out, cos, sin, sink;
  std::int64_t num_blocks = 0;
  std::int32_t max_blocks = 0;

 private:
  std::int64_t slot_of(std::int32_t b, std::int32_t pos) const;
  void write_cache(std::int64_t slot, const float* k_row, const float* v_row);

  OrtSpec spec_;
  std::int32_t tokens_ = 0;
  LogicalBatch logical_;
  std::vector<float> sink_values_;
  std::vector<float> new_k_, new_v_;  // [tokens][Hkv][D] as the cache must hold them
};

}  // namespace pagedattn::ops::test
