// Builds randomized paged-attention inputs: a page pool with shuffled page
// ids, NaN-poisoned unused slots, ragged queries, and runs the kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedattn/attention.h"

namespace pagedattn::testing {

struct CaseSpec {
  std::vector<std::int32_t> q_lens;
  std::vector<std::int32_t> kv_lens;
  std::int32_t page_size = 16;
  std::int32_t num_qo_heads = 8;
  std::int32_t num_kv_heads = 8;
  std::int32_t head_dim = 64;
  std::int32_t v_head_dim = 0;  // 0: head_dim
  DType q_dtype = DType::kF32;
  DType o_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  KVLayout layout = KVLayout::kHND;
  bool per_head_fp8_scales = false;
  AttentionOptions options;
  bool alibi = false;
  bool sinks = false;
  bool with_lse = true;
  int key_rope = 0;  // 0: none; 1: inline RoPE from theta; 2: from a cos/sin cache
  std::uint32_t seed = 1;
};

// Owns every buffer a paged_attention call needs.
class AttentionCase {
 public:
  explicit AttentionCase(const CaseSpec& spec);

  // Params writing to output buffer `which` (0 or 1).
  AttentionParams params(int which);
  // Output `which` as floats [tokens][heads][v_head_dim], and its LSE.
  std::vector<float> output(int which) const;
  const std::vector<float>& lse(int which) const { return lse_[which]; }

  // The same data rearranged into one page per sequence (page_size = the
  // longest kv_len), for paged-vs-contiguous comparisons.
  AttentionCase contiguous() const;

  std::int32_t num_tokens() const { return qo_indptr_.back(); }
  const CaseSpec& spec() const { return spec_; }

 private:
  AttentionCase() = default;
  void build_table(std::mt19937& rng);
  void fill_kv(std::mt19937& rng);
  float kv_value(std::mt19937& rng) const;

  CaseSpec spec_;
  std::vector<std::int32_t> qo_indptr_, kv_indptr_, kv_indices_, last_page_len_, kv_lens_;
  std::int64_t num_pages_ = 0;
  std::vector<unsigned char> k_, v_;
  std::vector<float> k_token_scales_, v_token_scales_, k_head_scales_, v_head_scales_;
  std::vector<unsigned char> q_;
  std::vector<unsigned char> o_[2];
  std::vector<float> lse_[2];
  std::vector<float> alibi_, sinks_;
  RopeConfig rope_;
  std::vector<float> rope_cos_, rope_sin_;
};

// Output tolerance per output dtype: the kernel and the reference see the
// same stored K/V and queries, so differences are fp32 accumulation order,
// the vectorised exp/tanh (a few ulp) and the final rounding of the output.
struct Tolerance {
  float abs, rel;
};
Tolerance output_tolerance(DType o);

// Output 1 (kernel) against output 0 (reference), and their LSE; failures
// are reported with `what`.
void expect_close(const AttentionCase& c, const std::string& what);

// Runs `body(target)` with Highway restricted to each compiled and supported
// target in turn, then restores dynamic dispatch.
void for_each_highway_target(const std::function<void(std::int64_t)>& body);

// One of `values`, drawn uniformly: random shapes pick from lists of sizes.
template <class... T>
auto pick_one(std::mt19937& rng, T... values) {
  const std::vector<std::common_type_t<T...>> v{values...};
  return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
}

}  // namespace pagedattn::testing
