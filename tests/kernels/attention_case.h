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
#include "pagedattn/cpu_features.h"

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

// Every field of a spec on one line, for failure messages.
std::string describe_case(const CaseSpec& spec);

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

// Checked per output row (one token, one query head): max |kernel -
// reference| over the row <= `row` x max |reference| over the row, so a long
// sequence, whose outputs average many values and are small, is held to the
// same relative standard as a short one; the LSE to `lse` x max(1, |lse|).
struct RowTolerance {
  double row = 0.0;
  double lse = 0.0;
};

// The kernel's fp32 arithmetic and the rounding of the stored output. The
// reference and the kernel each round to the output type, so a value near a
// rounding midpoint can land one ulp apart: at most 2^-10 = 9.8e-4 of the row
// maximum for f16 and 2^-7 = 7.8e-3 for bf16.
double output_row_tolerance(DType o);

// The dot-product paths round their inputs. vdpbf16ps (AVX-512 with
// AVX512-BF16, AttentionPlanOptions::bf16_products: prefill over KV of 16
// bits or fewer, decode over bf16, f16 and fp8): queries, softmax weights and
// f16 K/V to bf16 (8 significant bits; bf16, fp8 and int8 K/V convert
// exactly). A numpy model of the query and weight rounding over 400 random
// rows (head dims 32-256, up to 1203 keys) gave at most 0.5% of the row
// maximum at the default scale 1/sqrt(d) and 2.1% at scale 0.3; this
// suite's cases reach 2.4% with the output's rounding (f16 K/V, scale 0.3
// included).
// vpdpbusd (int8 decode on AVX-512 with AVX512-VNNI, head dims multiples
// of 64, AttentionPlanOptions::int8_products): queries to int8 per row
// (absmax / 127) and each block's weights to u8 against its largest. The
// query rounding dominates and grows with the spread of the logits, about
// scale x sqrt(head_dim) for unit-variance q and k: a numpy model of both
// roundings over 4800 random rows (head dims 64-256, 1-4096 keys, spreads
// 0.5-4.8) gave at most 1.9% of the row maximum at the default scale
// (spread 1) and at most 2.1% per unit of spread above 1 (10% at scale
// 0.3, head dim 256; the weights alone stay below 0.9%); the kernel
// measured 0.7-1.2% of the largest output in bench-attention's decode
// shapes. The int8 allowance is kInt8DotRowTolerance x max(1, spread).
// f16 multiply-adds (e4m3 and f16 decode on AVX-512 with AVX512-FP16, head
// dims multiples of 32 up to 256, AttentionPlanOptions::f16_products):
// queries (x a power of two per row) and softmax weights to f16 (11
// significant bits), QK summed in f16 over up to head_dim / 2 products
// (four levels of a reduction tree included), PV over 16 keys. The suite's
// f16-products test (AttentionTargets.F16DecodeRunsOnF16ProductsWithinTolerance)
// measured at most 0.75% of the row maximum (f16 K/V, scale 0.3 included).
// The allowances sit above those (added to output_row_tolerance).
inline constexpr double kBf16DotRowTolerance = 3e-2;
inline constexpr double kInt8DotRowTolerance = 3e-2;
inline constexpr double kF16DotRowTolerance = 1.5e-2;
inline constexpr double kFp32LseTolerance = 5e-5;

// Which dot-product paths a plan allows (AttentionPlan::bf16_products,
// AttentionPlan::int8_products).
struct DotProducts {
  bool bf16 = false;
  bool int8 = false;
  bool f16 = false;
};

// The int8 allowance of a case: kInt8DotRowTolerance x max(1, the logit
// spread |scale| x sqrt(head_dim)).
double int8_dot_row_tolerance(const CaseSpec& spec);

// The dot-product allowance (0: none) for a case where the dispatched
// target has the features `used` and the plan allows the products `allowed`:
// the largest of the paths its rows may take.
double dot_row_tolerance(const CaseSpec& spec, const CpuFeatures& used, DotProducts allowed);

// The tolerance for a case with the dispatched target's features `used`:
// the dot-product allowance wherever the kernel may take that path.
RowTolerance tolerance_for(const CaseSpec& spec, const CpuFeatures& used, DotProducts allowed);

// Output 1 (kernel) against output 0 (reference), row by row, and their LSE.
void expect_rows_close(const AttentionCase& c, const RowTolerance& tol, const std::string& what);

// Row `row` of `got` against `want` (rows of `dim` values): its largest
// |got - want| and its largest |want|.
struct RowError {
  double err = 0.0, scale = 0.0;
};
RowError row_error(const std::vector<float>& want, const std::vector<float>& got, std::size_t row,
                   std::size_t dim);

// The largest error of `got` against `want` over the rows, each as a
// fraction of its row's largest |want| (rows of zeros skipped).
double largest_row_error(const std::vector<float>& want, const std::vector<float>& got,
                         std::size_t dim);
// The same for output 1 (kernel) against output 0 (reference).
double largest_row_error(const AttentionCase& c);

// Output 1 (kernel) against output 0 (reference), and their LSE; failures
// are reported with `what` (element-wise, at output_tolerance: plans with
// f32 products).
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
