// Which product paths run by default (fp8 KV on bf16 / f16 products), how
// far they move results (against the attention of the unquantised K/V), and
// the once-per-process timing that decides where they run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "kernels/cpu/product_paths.h"
#include "pagedattn/cpu_features.h"

namespace pagedattn::testing {
namespace {
namespace product_paths_test {  // this file's own names in a unity batch

// How far the fast paths may move an fp8 case's outputs from its f32
// products: the bf16 allowance (the f16 path's is smaller).
constexpr double kFp8FastRoundingTolerance = kBf16DotRowTolerance;

// A random decode (one query per sequence) or prefill (queries = keys) batch.
CaseSpec random_case(std::uint32_t seed, bool prefill) {
  std::mt19937 rng(seed);
  CaseSpec s;
  const std::int32_t batch = prefill ? pick_one(rng, 1, 2) : pick_one(rng, 1, 3, 5);
  for (std::int32_t b = 0; b < batch; ++b) {
    const std::int32_t kv_len = std::uniform_int_distribution<std::int32_t>(1, 300)(rng);
    s.kv_lens.push_back(kv_len);
    s.q_lens.push_back(prefill ? kv_len : 1);
  }
  s.num_kv_heads = pick_one(rng, 1, 2);
  s.num_qo_heads = s.num_kv_heads * pick_one(rng, 1, 4, 8);
  s.head_dim = pick_one(rng, 64, 128, 96);
  s.page_size = pick_one(rng, 16, 5);
  s.seed = seed;
  return s;
}

TEST(ProductPaths, Fp8FastProductsStayWithinTheFp8CachesError) {
  const CpuFeatures used = dispatched_features();
  if (!(used.avx512f && (used.avx512_bf16 || used.avx512_fp16)))
    GTEST_SKIP() << "no AVX512-BF16 or AVX512-FP16 at the dispatched target: fp8 KV stays on "
                    "f32 products";
  double worst_ratio = 0.0, worst_rounding = 0.0;
  for (std::uint32_t seed = 1; seed <= 24; ++seed)
    for (DType kv : {DType::kFP8E4M3, DType::kFP8E5M2}) {
      CaseSpec spec = random_case(seed, seed % 2 == 0);
      const std::string what = describe_case(spec) + " " + std::string(dtype_name(kv));
      SCOPED_TRACE(what);
      // The same random values unquantised: the attention a user means.
      AttentionCase exact(spec);
      paged_attention_reference(exact.params(0));
      spec.kv_dtype = kv;
      AttentionCase c(spec);
      AttentionRunner(AttentionPlanOptions{.fp8_fast_products = false}).run(c.params(0));
      AttentionRunner(AttentionPlanOptions{.measured_products = false}).run(c.params(1));
      const auto dim = static_cast<std::size_t>(spec.head_dim);
      const double f32_error = largest_row_error(exact.output(0), c.output(0), dim);
      const double fast_error = largest_row_error(exact.output(0), c.output(1), dim);
      const double rounding = largest_row_error(c.output(0), c.output(1), dim);
      EXPECT_LE(fast_error, 1.1 * f32_error) << "f32 products: " << f32_error;
      EXPECT_LE(rounding, kFp8FastRoundingTolerance);
      worst_ratio = std::max(worst_ratio, fast_error / f32_error);
      worst_rounding = std::max(worst_rounding, rounding);
    }
  RecordProperty("worst_error_ratio", std::to_string(worst_ratio));
  RecordProperty("worst_rounding", std::to_string(worst_rounding));
}

TEST(ProductPaths, ExactProductsAndDeterministicPlansKeepF32ForFp8) {
  CaseSpec spec = random_case(7, false);
  spec.kv_dtype = DType::kFP8E4M3;
  AttentionCase c(spec);
  paged_attention_reference(c.params(0));
  AttentionRunner(AttentionPlanOptions{.fp8_fast_products = false}).run(c.params(1));
  expect_close(c, "fp8_fast_products = false");
  AttentionRunner deterministic(
      AttentionPlanOptions{.fixed_kv_chunk = 32, .measured_products = false});
  deterministic.run(c.params(1));
  EXPECT_FALSE(deterministic.last_plan().fp8_fast_products);
  expect_close(c, "fixed_kv_chunk = 32");
}

// The timing builds a batch of its own for every KV dtype and shape kind
// (MLA's shared rows, int8's token scales); a second question is answered
// from the record.
TEST(ProductPaths, TimingRunsForEveryKVDtypeAndAnswersFromItsRecordAfter) {
  using kernels::ProductPath;
  using kernels::ProductShape;
  const ProductShape shapes[] = {
      {DType::kFP8E4M3, KVLayout::kNHD, 128, 128, 4, false},
      {DType::kFP8E5M2, KVLayout::kHND, 64, 64, 1, false},
      {DType::kBF16, KVLayout::kHND, 128, 128, 8, false},
      {DType::kF16, KVLayout::kNHD, 96, 96, 2, false},
      {DType::kINT8, KVLayout::kHND, 128, 128, 4, false},
      {DType::kFP8E4M3, KVLayout::kHND, 576, 512, 16, true},
  };
  for (const ProductShape& s : shapes)
    for (ProductPath path : {ProductPath::kBf16Prefill, ProductPath::kBf16Decode,
                             ProductPath::kF16Decode, ProductPath::kInt8Decode}) {
      const bool first = kernels::product_path_pays(s, path);
      EXPECT_EQ(kernels::product_path_pays(s, path), first)
          << dtype_name(s.kv_dtype) << " path " << int(path);
    }
}

}  // namespace product_paths_test
}  // namespace
}  // namespace pagedattn::testing
