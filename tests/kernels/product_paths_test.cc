// Which product paths run by default (fp8 KV on bf16 / f16 products, prefill
// on bf16 products), how far they move results (against the attention of the
// unquantised K/V, or the stated bound of the bf16 prefill), and the
// once-per-process timing that decides where they run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "kernels/cpu/product_paths.h"
#include "kernels/validate.h"
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

// The bf16 prefill tiles' error, per output element, in two checks against
// double references of one (token, query head) row:
// - the bound docs/design.md ("Product paths") states against the exact
//   attention over the stored K/V:
//     |o_d - exact_d| <= sum_j p_j |v_jd| (F_j - 1),
//     F_j = e^(D_j + D) (1 + u)^(1 + [f16 V]) (1 + e_j) / (1 - e) (1 + g(2n + 8)),
//   p_j the exact softmax weights, u = 2^-8 (bf16's rounding), D_j = |scale|
//   sum_i |q_i k_ji| ((1 + u)^(1 + [f16 K]) - 1 + g(d + 2)) the score's
//   error (queries rounded, f16 K rounded, f32 sums), D = max_j D_j, e_j =
//   7.5e-5 + (|s_j| + 2 max|s|) 2^-23 the weights' degree-3 exp and its
//   fused shift, e = max_j e_j, n keys seen, d the head dim, g(k) = k 2^-24
//   / (1 - k 2^-24) for f32 sums;
// - the same bound against the attention of the rounded inputs (the
//   queries times the scale in f32, and f16 K/V, rounded to bf16 as the
//   kernel rounds them), where only
//   the weights' rounding and f32 arithmetic remain (no u in D_j, none for
//   V): about 2^-8 sum_j p_j |v_jd|, tight enough that rounding the queries
//   to fewer bits, or truncating them, fails it.
struct BoundedRow {
  std::vector<double> exact, bound;  // [v_head_dim]
};

double f32_sums(double terms) {
  const double unit = std::ldexp(1.0, -24);
  return terms * unit / (1.0 - terms * unit);
}

double to_bf16(double x) {
  return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
}

// Sequence b's stored K and V of one KV head, as doubles: [kv_len][dim];
// `rounded`: f16 values rounded to bf16 (other dtypes convert exactly).
struct StoredKV {
  std::vector<double> k, v;
};

StoredKV stored_kv(const AttentionParams& p, std::int32_t b, std::int32_t kv_head, bool rounded) {
  const PagedKVStorage& kv = p.kv;
  const auto value = [&](const void* data, std::int64_t at) {
    const double x = load_as_float(data, kv.dtype, std::size_t(at));
    return rounded ? to_bf16(x) : x;
  };
  StoredKV s;
  for (std::int64_t j = 0; j < p.table.kv_lens[b]; ++j) {
    const std::int32_t page = p.table.page_of_key(b, j), slot = p.table.offset_of_key(b, j);
    const std::int64_t k_off = kv.k_offset(page, kv_head, slot);
    const std::int64_t v_off = kv.v_offset(page, kv_head, slot);
    for (std::int32_t d = 0; d < kv.head_dim; ++d)
      s.k.push_back(value(kv.k_data, k_off + d) * kv.k_dequant(page, kv_head, slot));
    for (std::int32_t d = 0; d < kv.v_head_dim; ++d)
      s.v.push_back(value(kv.v_data, v_off + d) * kv.v_dequant(page, kv_head, slot));
  }
  return s;
}

// The row of query `token`, head `head` (at key position q_pos, causal) over
// `kv`, its sequence's K/V of the head's KV head; `rounded`: the queries
// rounded to bf16 and `kv` rounded (stored_kv), so only the weights'
// rounding is left to bound.
BoundedRow bf16_prefill_bound(const AttentionParams& p, const StoredKV& kv, std::int32_t token,
                              std::int32_t head, std::int64_t q_pos, bool rounded) {
  const double u = std::ldexp(1.0, -8);
  const int rounded_k = rounded ? 0 : p.kv.dtype == DType::kF16 ? 2 : 1;
  const int rounded_v = !rounded && p.kv.dtype == DType::kF16 ? 1 : 0;
  // The kernel scales the queries in f32 and rounds the products to bf16.
  const float f32_scale = kernels::resolved_scale(p);
  const double scale = rounded ? 1.0 : double(f32_scale);
  const std::size_t dk = std::size_t(p.kv.head_dim), dv = std::size_t(p.kv.v_head_dim);
  const std::int64_t q_off = token * p.q.token_stride + head * p.q.head_stride;
  std::vector<double> q(dk);
  for (std::size_t d = 0; d < dk; ++d) {
    const float x = load_as_float(p.q.data, p.q.dtype, std::size_t(q_off) + d);
    q[d] = rounded ? to_bf16(x * f32_scale) : double(x);
  }
  const std::size_t n = std::size_t(q_pos) + 1;  // the keys it sees
  std::vector<double> s(n), delta(n), w(n);
  const double rounding = std::pow(1.0 + u, rounded_k) - 1.0 + f32_sums(double(dk) + 2.0);
  double m = -INFINITY, max_abs = 0.0, score_error = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    double dot = 0.0, abs_dot = 0.0;
    for (std::size_t d = 0; d < dk; ++d) {
      dot += q[d] * kv.k[j * dk + d];
      abs_dot += std::fabs(q[d] * kv.k[j * dk + d]);
    }
    s[j] = scale * dot;
    delta[j] = std::fabs(scale) * abs_dot * rounding;
    m = std::max(m, s[j]);
    max_abs = std::max(max_abs, std::fabs(s[j]));
    score_error = std::max(score_error, delta[j]);
  }
  double denom = 0.0;
  for (std::size_t j = 0; j < n; ++j) denom += w[j] = std::exp(s[j] - m);
  const double sums = 1.0 + f32_sums(2.0 * double(n) + 8.0);
  const double exp_error = 7.5e-5 + 3.0 * max_abs * std::ldexp(1.0, -23);
  BoundedRow r{std::vector<double>(dv, 0.0), std::vector<double>(dv, 0.0)};
  for (std::size_t j = 0; j < n; ++j) {
    const double pj = w[j] / denom;
    const double e_j = 7.5e-5 + (std::fabs(s[j]) + 2.0 * max_abs) * std::ldexp(1.0, -23);
    const double factor = std::exp(delta[j] + score_error) * std::pow(1.0 + u, 1 + rounded_v) *
                          (1.0 + e_j) / (1.0 - exp_error) * sums;
    for (std::size_t d = 0; d < dv; ++d) {
      r.exact[d] += pj * kv.v[j * dv + d];
      r.bound[d] += pj * std::fabs(kv.v[j * dv + d]) * (factor - 1.0);
    }
  }
  return r;
}

// A random prefill batch (queries = keys, more than 8 rows per KV head) over
// `kv` KV.
CaseSpec random_prefill_case(std::uint32_t seed, DType kv) {
  CaseSpec s = random_case(seed, true);
  for (std::size_t b = 0; b < s.kv_lens.size(); ++b)
    s.q_lens[b] = s.kv_lens[b] = std::max(s.kv_lens[b], 17);
  s.kv_dtype = kv;
  if (seed % 3 == 0) s.options.scale = 0.3f;  // a wide spread of logits (else 1 / sqrt(d))
  return s;
}

TEST(ProductPaths, Bf16PrefillStaysWithinItsStatedBound) {
  const CpuFeatures used = dispatched_features();
  if (!(used.avx512f && used.avx512_bf16))
    GTEST_SKIP() << "no AVX512-BF16 at the dispatched target: prefill stays on f32 products";
  double worst[2] = {0.0, 0.0};
  for (std::uint32_t seed = 1; seed <= 9; ++seed)
    for (DType kv : {DType::kF16, DType::kBF16, DType::kINT8}) {
      const CaseSpec spec = random_prefill_case(seed, kv);
      SCOPED_TRACE(describe_case(spec));
      AttentionCase c(spec);
      AttentionRunner(AttentionPlanOptions{.fast_prefill_products = false}).run(c.params(0));
      AttentionParams fast = c.params(1);
      AttentionRunner(AttentionPlanOptions{.measured_products = false}).run(fast);
      const std::vector<float> f32 = c.output(0), got = c.output(1);
      const auto dv = std::size_t(spec.head_dim);
      double moved = 0.0;
      for (std::size_t i = 0; i < got.size(); ++i)
        moved = std::max(moved, std::fabs(double(got[i]) - double(f32[i])));
      EXPECT_GT(moved, 0.0) << "the bf16 tiles did not run";
      const PagedKVTable& t = fast.table;
      const std::int32_t group = spec.num_qo_heads / spec.num_kv_heads;
      StoredKV group_kv;
      for (const bool rounded : {false, true})
        for (std::int32_t b = 0; b < t.batch_size; ++b)
          for (std::int32_t h = 0; h < fast.num_qo_heads; ++h) {
            if (h % group == 0) group_kv = stored_kv(fast, b, h / group, rounded);
            for (std::int32_t i = 0; i < t.q_len(b); ++i) {
              const std::int32_t token = t.qo_indptr[b] + i;
              const std::int64_t q_pos = std::int64_t{t.kv_lens[b]} - t.q_len(b) + i;
              const BoundedRow r = bf16_prefill_bound(fast, group_kv, token, h, q_pos, rounded);
              const std::size_t row = std::size_t(token) * std::size_t(fast.num_qo_heads) + h;
              for (std::size_t d = 0; d < dv; ++d) {
                const double err = std::fabs(double(got[row * dv + d]) - r.exact[d]);
                ASSERT_LE(err, r.bound[d]) << (rounded ? "against the rounded inputs: " : "")
                                           << "token " << token << " head " << h << " dim " << d;
                if (r.bound[d] > 0.0) worst[rounded] = std::max(worst[rounded], err / r.bound[d]);
              }
            }
          }
    }
  RecordProperty("worst_error_over_bound", std::to_string(worst[0]));
  RecordProperty("worst_error_over_bound_of_rounded_inputs", std::to_string(worst[1]));
}

// By default prefill takes the bf16 tiles exactly where the timing found
// them faster; decode rows of a few heads per KV head, exact_products-style
// plans (fast_prefill_products off) and deterministic plans keep f32.
TEST(ProductPaths, DefaultPrefillFollowsTheTimingAndDecodeKeepsF32) {
  const CpuFeatures used = dispatched_features();
  for (const bool prefill : {true, false}) {
    CaseSpec spec = prefill ? random_prefill_case(5, DType::kF16) : random_case(5, false);
    spec.kv_dtype = DType::kF16;
    SCOPED_TRACE(describe_case(spec));
    AttentionCase c(spec);
    AttentionRunner(AttentionPlanOptions{.fast_prefill_products = false}).run(c.params(0));
    const std::vector<float> f32 = c.output(0);
    AttentionRunner(AttentionPlanOptions{.measured_products = false}).run(c.params(1));
    const std::vector<float> fast = c.output(1);
    AttentionRunner().run(c.params(1));
    const kernels::ProductShape shape{DType::kF16,
                                      spec.layout,
                                      spec.head_dim,
                                      spec.head_dim,
                                      spec.num_qo_heads / spec.num_kv_heads,
                                      false};
    const bool taken = prefill && used.avx512f && used.avx512_bf16 &&
                       kernels::product_path_pays(shape, kernels::ProductPath::kBf16Prefill);
    EXPECT_EQ(c.output(1), taken ? fast : f32) << (taken ? "bf16 tiles" : "f32 products");
    AttentionRunner deterministic(
        AttentionPlanOptions{.fixed_kv_chunk = 32, .measured_products = false});
    deterministic.run(c.params(1));
    EXPECT_FALSE(deterministic.last_plan().fast_prefill_products);
  }
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

// Inside a parallel region (a team's step) a shape not yet timed is not
// timed: the timing's own regions would wait on the team's other threads,
// which wait on it. The answer is f32; outside, the shape is timed as usual.
TEST(ProductPaths, AShapeMetInsideATeamKeepsF32WithoutTiming) {
  using kernels::ProductPath;
  const kernels::ProductShape fresh{DType::kBF16, KVLayout::kNHD, 40, 40, 3, false};
  int inside = 0;
#pragma omp parallel num_threads(2) reduction(+ : inside)
  inside += kernels::product_path_pays(fresh, ProductPath::kBf16Prefill) ? 1 : 0;
  EXPECT_EQ(inside, 0);
  const bool outside = kernels::product_path_pays(fresh, ProductPath::kBf16Prefill);
  EXPECT_EQ(kernels::product_path_pays(fresh, ProductPath::kBf16Prefill), outside);
}

}  // namespace product_paths_test
}  // namespace
}  // namespace pagedattn::testing
