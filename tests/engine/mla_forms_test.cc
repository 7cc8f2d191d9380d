// The two forms of the model's latent attention (mla_attention.h): the
// expanded form (per-head keys and values from the cached rows, then
// multi-head attention) gives the absorbed form's values on the same steps,
// for every cache dtype and layout, over a prefill in two chunks of two
// sequences and a decode step; the absorbed form's values do not depend on
// the thread count; mla_form picks the form by its cost.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "engine/mla_attention.h"
#include "kernels/rope_table.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::engine {
namespace {

constexpr std::int32_t kHidden = 48, kHeads = 4, kLatent = 32, kNope = 24, kRope = 8, kV = 16;

WeightMatrix random_matrix(std::mt19937& rng, std::int32_t out, std::int32_t in) {
  std::normal_distribution<float> value(0.0f, 1.0f / std::sqrt(float(in)));
  std::vector<float> w(std::size_t(out) * std::size_t(in));
  for (float& v : w) v = value(rng);
  return WeightMatrix::f32(std::move(w), out, in);
}

MlaShape shape(std::int32_t q_lora_rank) {
  MlaShape s;
  s.hidden = kHidden, s.heads = kHeads, s.q_lora_rank = q_lora_rank, s.kv_lora_rank = kLatent;
  s.nope = kNope, s.rope = kRope, s.v_head_dim = kV;
  return s;
}

MlaLayerWeights weights(const MlaShape& s, std::mt19937& rng) {
  MlaLayerWeights w;
  const std::int32_t query_in = s.q_lora_rank > 0 ? s.q_lora_rank : s.query_width();
  w.input = StackedMatrix(random_matrix(rng, query_in, s.hidden));
  w.input.append(random_matrix(rng, s.kv_lora_rank + s.rope, s.hidden));
  if (s.q_lora_rank > 0) {
    w.q_a_norm.assign(std::size_t(s.q_lora_rank), 1.0f);
    w.q_b = random_matrix(rng, s.query_width(), s.q_lora_rank);
  }
  w.kv_a_norm.assign(std::size_t(s.kv_lora_rank), 1.0f);
  for (std::int32_t h = 0; h < s.heads; ++h) {
    w.k_absorb.push_back(random_matrix(rng, s.kv_lora_rank, s.nope));
    w.v_up.push_back(random_matrix(rng, s.v_head_dim, s.kv_lora_rank));
  }
  return w;
}

PagedKVCache latent_cache(const MlaShape& s, DType dtype, AttentionKind kind) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.num_qo_heads = s.heads;
  k.num_kv_heads = 1;
  k.head_dim = s.kv_lora_rank + s.rope;
  k.v_head_dim = s.kv_lora_rank;
  k.attention_kind = kind;
  k.page_size = 16;
  k.num_pages = 32;
  k.kv_dtype = dtype;
  // The absorbed form on f32 products over fp8 too, as the expanded form
  // computes: the test compares the forms, not the product paths.
  k.attention_plan.fp8_fast_products = false;
  k.attention_plan.fast_prefill_products = false;
  return PagedKVCache(k);
}

// One forward step of sequences {0, 1} with `lengths` new tokens each.
struct Step {
  std::vector<std::int64_t> lengths;
};

// Every step's values [tokens][heads x v] in one form.
std::vector<std::vector<float>> run(const MlaShape& s, const MlaLayerWeights& w, DType dtype,
                                    AttentionKind kind, const std::vector<Step>& steps,
                                    const std::vector<float>& x, MlaForm form,
                                    bool deterministic = false) {
  PagedKVCache cache = latent_cache(s, dtype, kind);
  cache.add_sequence(0);
  cache.add_sequence(1);
  RopeConfig base;
  base.rotary_dim = kRope;
  base.style = RopeStyle::kGptJ;
  kernels::RopeTable table;
  const RopeConfig& rope = table.covering(base, kRope, 512);
  AttentionOptions options;
  options.scale = 0.2f;
  MlaScratch m;
  LinearScratch ls;
  std::vector<std::vector<float>> out;
  std::size_t row = 0;
  for (const Step& step : steps) {
    const BatchPlan& plan = cache.begin_forward(std::vector<SeqId>{0, 1}, step.lengths);
    const std::int32_t tokens = plan.num_tokens();
    std::vector<float> values(std::size_t(tokens) * s.heads * s.v_head_dim);
    mla_attention(s, w, x.data() + row * s.hidden, tokens, 0, plan.positions.data(), rope, options,
                  cache, values.data(), deterministic, form, m, ls);
    cache.end_forward();
    row += std::size_t(tokens);
    out.push_back(std::move(values));
  }
  return out;
}

TEST(MlaForms, ExpandedGivesTheAbsorbedValues) {
  // Chunk 1: 20 and 7 tokens; chunk 2: 18 and 40 (context from the cache,
  // across pages); then a decode step of both.
  const std::vector<Step> steps = {{{20, 7}}, {{18, 40}}, {{1, 1}}};
  std::mt19937 rng(41);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> x(std::size_t(20 + 7 + 18 + 40 + 2) * kHidden);
  for (float& v : x) v = value(rng);
  for (const std::int32_t q_lora_rank : {0, 24}) {
    const MlaShape s = shape(q_lora_rank);
    const MlaLayerWeights w = weights(s, rng);
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kINT8, DType::kFP8E4M3})
      for (const AttentionKind kind : {AttentionKind::kMLA, AttentionKind::kMHA}) {
        SCOPED_TRACE(::testing::Message()
                     << "q_lora_rank " << q_lora_rank << ", " << dtype_name(dtype)
                     << ", MLA layout " << (kind == AttentionKind::kMLA));
        const auto absorbed = run(s, w, dtype, kind, steps, x, MlaForm::kAbsorbed);
        const auto expanded = run(s, w, dtype, kind, steps, x, MlaForm::kExpanded);
        for (std::size_t step = 0; step < steps.size(); ++step) {
          double largest = 0.0, worst = 0.0;
          for (std::size_t i = 0; i < absorbed[step].size(); ++i) {
            largest = std::max(largest, std::abs(double(absorbed[step][i])));
            worst = std::max(worst, std::abs(double(expanded[step][i]) - absorbed[step][i]));
          }
          // The same products summed in another order, over the same cached
          // (rounded) rows.
          EXPECT_LE(worst, 2e-5 * largest) << "step " << step;
          EXPECT_GT(largest, 0.1) << "step " << step;
        }
      }
  }
}

// The per-head products split over the threads (ProductSplit) give every
// head's values whatever the thread count: bitwise in deterministic mode,
// within f32 rounding otherwise (a prefill chunk's products go to BLAS,
// whose sums depend on the columns a call takes). Three heads whose
// up-projections are wider than a column block (160 and 144 columns), so
// that some threads take part of a head. With bf16 batch products asked for
// (ForwardBatch::bf16_products: a ScopedActivations on the calling thread)
// every thread's pieces take them, where the CPU has them.
TEST(MlaForms, AbsorbedValuesDoNotDependOnTheThreadCount) {
  const std::vector<Step> steps = {{{20, 7}}, {{18, 40}}, {{1, 1}}};
  std::mt19937 rng(43);
  std::normal_distribution<float> value(0.0f, 1.0f);
  MlaShape s = shape(24);
  s.heads = 3, s.kv_lora_rank = 160, s.v_head_dim = 144;
  std::vector<float> x(std::size_t(20 + 7 + 18 + 40 + 2) * s.hidden);
  for (float& v : x) v = value(rng);
  const MlaLayerWeights w = weights(s, rng);
  const int before = omp_get_max_threads();
  for (const auto& [deterministic, bf16] :
       {std::pair{false, false}, {true, false}, {false, true}}) {
    const ScopedActivations caller(Activations::kDefault, bf16);
    omp_set_num_threads(1);
    const auto one =
        run(s, w, DType::kF32, AttentionKind::kMLA, steps, x, MlaForm::kAbsorbed, deterministic);
    for (const int threads : {2, 3}) {  // more: see Linear.MatchesADoubleReferenceOnAnyThreadCount
      SCOPED_TRACE(::testing::Message() << threads << " threads, deterministic " << deterministic
                                        << ", bf16 products " << bf16);
      omp_set_num_threads(threads);
      const auto many =
          run(s, w, DType::kF32, AttentionKind::kMLA, steps, x, MlaForm::kAbsorbed, deterministic);
      for (std::size_t step = 0; step < steps.size(); ++step) {
        ASSERT_EQ(many[step].size(), one[step].size());
        double largest = 0.0, worst = 0.0;
        for (std::size_t i = 0; i < one[step].size(); ++i) {
          largest = std::max(largest, std::abs(double(one[step][i])));
          worst = std::max(worst, std::abs(double(many[step][i]) - one[step][i]));
        }
        EXPECT_LE(worst, deterministic ? 0.0 : 1e-5 * largest) << "step " << step;
        EXPECT_GT(largest, 0.1) << "step " << step;
      }
    }
  }
  omp_set_num_threads(before);
}

BatchPlan plan_of(std::vector<std::int32_t> q, std::vector<std::int32_t> keys) {
  BatchPlan p;
  p.page_size = 16;
  p.qo_indptr = {0};
  for (std::size_t b = 0; b < q.size(); ++b) {
    p.seq_ids.push_back(SeqId(b));
    p.qo_indptr.push_back(p.qo_indptr.back() + q[b]);
  }
  p.kv_lens = std::move(keys);
  return p;
}

// DeepSeek-V2-Lite's shapes: a prompt expands, decode stays absorbed, and
// so do deterministic mode, token trees and contexts past the memory bound.
TEST(MlaForms, TheCheaperFormIsChosen) {
  MlaShape s;
  s.heads = 16, s.kv_lora_rank = 512, s.nope = 128, s.rope = 64, s.v_head_dim = 128;
  EXPECT_EQ(mla_form(s, plan_of({512}, {512}), false), MlaForm::kExpanded);
  EXPECT_EQ(mla_form(s, plan_of({2048}, {6144}), false), MlaForm::kExpanded);
  EXPECT_EQ(mla_form(s, plan_of({1}, {8192}), false), MlaForm::kAbsorbed);
  EXPECT_EQ(mla_form(s, plan_of({16}, {8192}), false), MlaForm::kAbsorbed);
  // A decode row of a long context makes its whole batch stay absorbed.
  EXPECT_EQ(mla_form(s, plan_of({256, 1}, {256, 30000}), false), MlaForm::kAbsorbed);
  EXPECT_EQ(mla_form(s, plan_of({512}, {512}), true), MlaForm::kAbsorbed);
  BatchPlan tree = plan_of({512}, {512});
  tree.has_tree = true;
  EXPECT_EQ(mla_form(s, tree, false), MlaForm::kAbsorbed);
  // 16 heads x 320 floats per key: 512 MiB hold about 26,000 keys.
  EXPECT_EQ(mla_form(s, plan_of({2048}, {20000}), false), MlaForm::kExpanded);
  EXPECT_EQ(mla_form(s, plan_of({2048}, {30000}), false), MlaForm::kAbsorbed);
}

}  // namespace
}  // namespace pagedattn::engine
