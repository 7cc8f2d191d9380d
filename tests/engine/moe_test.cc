// The mixture-of-experts block against a double-precision reference: random
// shapes, a batch whose experts get very uneven numbers of rows (some none),
// quantised experts, and in deterministic mode every token's result bitwise
// the same alone as in any batch.
#include "engine/moe.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "engine/counter_random.h"
#include "engine/llama_weights.h"
#include "engine/quant_kernels.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"
#include "support/in_memory_all_reduce.h"

namespace pagedattn::engine {
// A namespace of its own: the unity build merges this file with others.
namespace moe_tests {
namespace {

std::vector<float> uniform(std::size_t count, double bound, std::uint64_t stream) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>((2.0 * counter_uniform(41, stream, i) - 1.0) * bound);
  return v;
}

WeightMatrix random_matrix(std::int32_t out, std::int32_t in, std::uint64_t stream) {
  return WeightMatrix::f32(uniform(std::size_t(out) * in, std::sqrt(3.0 / in), stream), out, in);
}

ExpertWeights random_expert(std::int32_t hidden, std::int32_t width, std::uint64_t& stream) {
  ExpertWeights e;
  e.gate_up = StackedMatrix(random_matrix(width, hidden, stream++));  // gate
  e.gate_up.append(random_matrix(width, hidden, stream++));           // up
  e.down = random_matrix(hidden, width, stream++);
  return e;
}

MoeLayerWeights random_weights(const MoeShape& s, std::uint64_t stream) {
  MoeLayerWeights w;
  w.router = random_matrix(s.num_experts, s.hidden, stream++);
  for (std::int32_t e = 0; e < s.num_experts; ++e)
    w.experts.push_back(random_expert(s.hidden, s.expert_intermediate, stream));
  if (s.shared_intermediate > 0) {
    w.shared = random_expert(s.hidden, s.shared_intermediate, stream);
    w.shared_gate = random_matrix(1, s.hidden, stream++);
  }
  return w;
}

// A matrix's values as doubles (dequantised when it is quantised).
std::vector<double> values(const WeightMatrix& m) {
  std::vector<float> f(std::size_t(m.out()) * m.in());
  if (m.format() == WeightFormat::kF32)
    std::memcpy(f.data(), m.data(), f.size() * sizeof(float));
  else
    dequantize_weight_rows(m.data(), m.format(), m.in(), 0, m.out(), f.data());
  return {f.begin(), f.end()};
}

// y[out] = w x
std::vector<double> apply(const std::vector<double>& w, std::int32_t out,
                          const std::vector<double>& x) {
  std::vector<double> y(std::size_t(out), 0.0);
  for (std::size_t o = 0; o < y.size(); ++o)
    for (std::size_t i = 0; i < x.size(); ++i) y[o] += w[o * x.size() + i] * x[i];
  return y;
}

std::vector<double> expert_reference(const ExpertWeights& e, const std::vector<double>& x) {
  std::vector<double> gate_up;
  for (const WeightMatrix& part : e.gate_up.parts()) {
    const std::vector<double> y = apply(values(part), part.out(), x);
    gate_up.insert(gate_up.end(), y.begin(), y.end());
  }
  const std::size_t width = gate_up.size() / 2;
  std::vector<double> act(width);
  for (std::size_t i = 0; i < width; ++i)
    act[i] = gate_up[i] / (1.0 + std::exp(-gate_up[i])) * gate_up[width + i];
  return apply(values(e.down), e.down.out(), act);
}

struct Reference {
  std::vector<double> y;              // [H]
  std::vector<std::int32_t> experts;  // top-k, in order
  double margin = 0.0;                // k-th largest logit minus the (k+1)-th
};

Reference reference(const MoeShape& s, const MoeLayerWeights& w, const float* x_row) {
  const std::vector<double> x(x_row, x_row + s.hidden);
  const std::vector<double> logits = apply(values(w.router), s.num_experts, x);
  std::vector<std::int32_t> order(std::size_t(s.num_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  const std::size_t k = std::size_t(s.num_experts_used);
  Reference r;
  r.experts.assign(order.begin(), order.begin() + std::ptrdiff_t(k));
  r.margin = k < order.size() ? logits[order[k - 1]] - logits[order[k]] : 1e9;
  const double top = logits[order[0]];
  double sum = 0.0, chosen = 0.0;
  for (std::size_t e = 0; e < order.size(); ++e) sum += std::exp(logits[e] - top);
  for (std::int32_t e : r.experts) chosen += std::exp(logits[e] - top);
  r.y.assign(std::size_t(s.hidden), 0.0);
  for (std::int32_t e : r.experts) {
    const double weight = std::exp(logits[e] - top) / (s.normalize_weights ? chosen : sum);
    const std::vector<double> out = expert_reference(w.experts[std::size_t(e)], x);
    for (std::size_t i = 0; i < out.size(); ++i) r.y[i] += weight * out[i];
  }
  if (s.shared_intermediate > 0) {
    const double g = apply(values(w.shared_gate), 1, x)[0];
    const std::vector<double> out = expert_reference(w.shared, x);
    for (std::size_t i = 0; i < out.size(); ++i) r.y[i] += out[i] / (1.0 + std::exp(-g));
  }
  return r;
}

std::vector<float> run(const MoeShape& s, const MoeLayerWeights& w, const std::vector<float>& x,
                       bool deterministic, MoeScratch& scratch) {
  const auto tokens = static_cast<std::int32_t>(x.size() / std::size_t(s.hidden));
  std::vector<float> y(x.size(), std::nanf(""));
  LinearScratch linear_scratch;
  moe_forward(s, w, x.data(), tokens, y.data(), deterministic, scratch, linear_scratch);
  return y;
}

// moe_forward against the reference for every token whose k-th and
// (k+1)-th router logits are apart (else f32 rounding may pick either).
void expect_matches_reference(const MoeShape& s, const MoeLayerWeights& w,
                              const std::vector<float>& x, bool deterministic) {
  MoeScratch scratch;
  const std::vector<float> y = run(s, w, x, deterministic, scratch);
  const auto tokens = static_cast<std::int32_t>(x.size() / std::size_t(s.hidden));
  std::int32_t checked = 0;
  for (std::int32_t t = 0; t < tokens; ++t) {
    const Reference r = reference(s, w, x.data() + std::size_t(t) * s.hidden);
    if (r.margin < 1e-3) continue;
    ++checked;
    for (std::int32_t j = 0; j < s.num_experts_used; ++j)
      ASSERT_EQ(scratch.experts[std::size_t(t) * s.num_experts_used + j], r.experts[j])
          << "token " << t << ", choice " << j;
    for (std::int32_t i = 0; i < s.hidden; ++i)
      ASSERT_NEAR(y[std::size_t(t) * s.hidden + i], r.y[i], 1e-4 * (1.0 + std::abs(r.y[i])))
          << "token " << t << ", feature " << i;
  }
  EXPECT_GE(checked, tokens - 2);
}

// Sets the OpenMP thread count while it lives: every thread takes a share
// of every expert's columns (ExpertSplit), so the split moves with it.
class Threads {
 public:
  explicit Threads(int threads) : previous_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~Threads() { omp_set_num_threads(previous_); }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;

 private:
  int previous_;
};

TEST(Moe, MatchesADoubleReferenceOnRandomShapes) {
  const MoeShape shapes[] = {
      {64, 8, 2, 48, 0, false, MlpActivation::kSilu},   // qwen2moe-like routing, no shared
      {64, 8, 2, 48, 80, false, MlpActivation::kSilu},  // with a shared expert
      {96, 16, 4, 40, 0, true, MlpActivation::kSilu},   // qwen3moe-like: renormalised
      {40, 5, 5, 24, 16, true, MlpActivation::kSilu},   // every expert used
      {32, 3, 1, 300, 0, false, MlpActivation::kSilu},  // top-1, width past a column block
  };
  std::uint64_t stream = 100;
  for (const MoeShape& s : shapes) {
    SCOPED_TRACE(testing::Message() << s.num_experts << " experts, top-" << s.num_experts_used
                                    << ", shared " << s.shared_intermediate);
    const MoeLayerWeights w = random_weights(s, stream);
    stream += 1000;
    for (const std::int32_t tokens : {1, 7, 37}) {
      const std::vector<float> x = uniform(std::size_t(tokens) * s.hidden, 1.5, stream++);
      // 3: more threads than a top-1 or top-2 token's experts. (At most 3:
      // clang's OpenMP runtime keeps the descriptors of a larger team past
      // exit, which LeakSanitizer reports.)
      for (const int threads : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << tokens << " tokens, " << threads << " threads");
        const Threads scope(threads);
        for (const bool deterministic : {false, true})
          expect_matches_reference(s, w, x, deterministic);
      }
    }
  }
}

// Router rows 8 e_e (unit vectors): token t's logit for expert e is 8
// x[t][e], so x picks the experts. 40 tokens: 30 go to experts 0 and 1,
// 9 to 1 and 5, one to 6 and 0; experts 2, 3, 4 and 7 get no rows.
TEST(Moe, GroupsUnevenLoadsAndSkipsExpertsWithoutRows) {
  const MoeShape s{32, 8, 2, 24, 20, false, MlpActivation::kSilu};
  std::uint64_t stream = 7;
  MoeLayerWeights w = random_weights(s, stream);
  std::vector<float> router(std::size_t(s.num_experts) * s.hidden, 0.0f);
  for (std::int32_t e = 0; e < s.num_experts; ++e) router[std::size_t(e) * s.hidden + e] = 8.0f;
  w.router = WeightMatrix::f32(router, s.num_experts, s.hidden);
  const std::int32_t tokens = 40;
  std::vector<float> x = uniform(std::size_t(tokens) * s.hidden, 0.3, 8);
  auto pick = [&](std::int32_t t, std::int32_t first, std::int32_t second) {
    x[std::size_t(t) * s.hidden + first] = 1.5f;
    x[std::size_t(t) * s.hidden + second] = 1.0f;
  };
  for (std::int32_t t = 0; t < tokens; ++t) {
    if (t < 30)
      pick(t, t % 2, 1 - t % 2);
    else if (t < 39)
      pick(t, 5, 1);
    else
      pick(t, 6, 0);
  }
  MoeScratch scratch;
  run(s, w, x, true, scratch);
  const std::vector<std::int32_t> rows_per_expert = {31, 39, 0, 0, 0, 9, 1, 0};
  for (std::int32_t e = 0; e < s.num_experts; ++e)
    EXPECT_EQ(scratch.first_row[std::size_t(e) + 1] - scratch.first_row[std::size_t(e)],
              rows_per_expert[std::size_t(e)])
        << "expert " << e;
  for (const bool deterministic : {false, true}) expect_matches_reference(s, w, x, deterministic);
}

// Q8_0 and Q4_K experts (the in-place kernels) against their dequantised
// values; the down projections' inputs are whole blocks.
TEST(Moe, QuantisedExpertsMatchTheirValues) {
  for (const WeightFormat format : {WeightFormat::kQ8_0, WeightFormat::kQ4_K}) {
    SCOPED_TRACE(weight_format_name(format));
    const std::int32_t block = weight_format_block(format);
    const MoeShape s{block, 6, 2, block, block, false, MlpActivation::kSilu};
    MoeLayerWeights w = random_weights(s, 300);
    // Random blocks (any bytes are a valid block once its f16 scales are
    // finite): the scales set to 2^-7 (Q8_0's d) or 2^-9 and 2^-10 (Q4_K's
    // d and dmin) keep the weights O(1).
    const std::size_t block_bytes = std::size_t(weight_row_bytes(format, block));
    auto quantise = [&](const WeightMatrix& m, std::uint64_t seed) {
      std::vector<std::byte> b(std::size_t(m.out()) *
                               std::size_t(weight_row_bytes(format, m.in())));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::byte(splitmix64(seed * 1000003 + i));
      for (std::size_t at = 0; at < b.size(); at += block_bytes) {
        b[at] = std::byte{0};
        b[at + 1] = format == WeightFormat::kQ8_0 ? std::byte{0x20} : std::byte{0x18};
        if (format == WeightFormat::kQ4_K) b[at + 2] = std::byte{0}, b[at + 3] = std::byte{0x14};
      }
      return WeightMatrix::rows(format, b, m.out(), m.in());
    };
    std::uint64_t seed = 1;
    for (ExpertWeights* e : {&w.experts[0], &w.experts[3], &w.shared}) {
      e->gate_up = StackedMatrix(quantise(e->gate_up.parts()[0], seed++));  // gate and up rows
      e->down = quantise(e->down, seed++);
    }
    const std::vector<float> x = uniform(std::size_t(9) * s.hidden, 1.0, 301);
    for (const bool deterministic : {false, true}) expect_matches_reference(s, w, x, deterministic);
  }
}

// ... nor on the thread count: experts wider than a column block (f32
// weights: BLAS tiles) split over 1-3 threads give the same bits.
TEST(Moe, DeterministicRowsDoNotDependOnTheBatch) {
  const MoeShape s{64, 8, 2, 300, 80, true, MlpActivation::kSilu};
  const MoeLayerWeights w = random_weights(s, 500);
  const std::int32_t tokens = 40;
  const std::vector<float> x = uniform(std::size_t(tokens) * s.hidden, 1.5, 501);
  MoeScratch scratch;
  const std::vector<float> whole = run(s, w, x, true, scratch);
  for (const int threads : {1, 2, 3}) {
    const Threads scope(threads);
    const std::vector<float> y = run(s, w, x, true, scratch);
    ASSERT_EQ(std::memcmp(y.data(), whole.data(), y.size() * sizeof(float)), 0)
        << threads << " threads";
    const std::vector<float> one = run(s, w, {x.begin(), x.begin() + s.hidden}, true, scratch);
    ASSERT_EQ(std::memcmp(one.data(), whole.data(), one.size() * sizeof(float)), 0)
        << "token 0 alone on " << threads << " threads";
  }
  const std::size_t h = std::size_t(s.hidden);
  for (std::int32_t t = 0; t < tokens; ++t) {  // alone
    const std::vector<float> row(x.begin() + std::ptrdiff_t(t * h),
                                 x.begin() + std::ptrdiff_t((t + 1) * h));
    const std::vector<float> y = run(s, w, row, true, scratch);
    ASSERT_EQ(std::memcmp(y.data(), whole.data() + t * h, h * sizeof(float)), 0) << "token " << t;
  }
  std::vector<float> reversed;  // every token at another place, other neighbours
  for (std::int32_t t = tokens - 1; t >= 3; --t)
    reversed.insert(reversed.end(), x.begin() + std::ptrdiff_t(t * h),
                    x.begin() + std::ptrdiff_t((t + 1) * h));
  const std::vector<float> y = run(s, w, reversed, true, scratch);
  for (std::int32_t t = tokens - 1; t >= 3; --t)
    ASSERT_EQ(std::memcmp(y.data() + (tokens - 1 - t) * h, whole.data() + t * h, h * sizeof(float)),
              0)
        << "token " << t;
}

// Logits of every token of `seqs` (token lists) run as one batch.
std::vector<float> model_logits(Model& model, const std::vector<std::vector<std::int32_t>>& seqs) {
  KVCacheConfig config = kv_cache_config(model.spec());
  config.page_size = 4;
  config.num_pages = 16;
  config.kv_dtype = DType::kF32;
  PagedKVCache cache(config);
  std::vector<SeqId> ids;
  std::vector<std::int64_t> lengths;
  std::vector<std::int32_t> tokens, rows;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    ids.push_back(SeqId(i));
    cache.add_sequence(SeqId(i));
    lengths.push_back(std::int64_t(seqs[i].size()));
    tokens.insert(tokens.end(), seqs[i].begin(), seqs[i].end());
  }
  for (std::size_t r = 0; r < tokens.size(); ++r) rows.push_back(std::int32_t(r));
  std::vector<float> logits(tokens.size() * std::size_t(model.spec().vocab_size));
  cache.begin_forward(ids, lengths);
  model.forward({tokens, rows, true}, cache, logits);
  cache.end_forward();
  return logits;
}

// A synthetic MoE model: 2 layers of 8 experts (top 2) and a shared one.
LlamaConfig synthetic_moe_config() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.num_experts = 8;
  c.num_experts_used = 2;
  c.expert_intermediate_size = 32;
  c.shared_expert_intermediate_size = 48;
  return c;
}

// The synthetic MoE model (seeded expert weights, a shared expert) in
// deterministic mode: a sequence's logits alone equal those in a batch.
TEST(Moe, SyntheticModelRowsDoNotDependOnTheBatch) {
  const LlamaConfig c = synthetic_moe_config();
  const auto model = make_llama_model(c);
  const std::vector<std::int32_t> a = {3, 9, 27, 17, 51}, b = {60, 2, 33};
  const std::vector<float> both = model_logits(*model, {a, b});
  const std::vector<float> alone = model_logits(*model, {a});
  ASSERT_EQ(std::memcmp(alone.data(), both.data(), alone.size() * sizeof(float)), 0);
  EXPECT_TRUE(std::all_of(both.begin(), both.end(), [](float v) { return std::isfinite(v); }));
  EXPECT_EQ(llama_parameter_count(c) - llama_parameter_count([&] {
              LlamaConfig dense = c;
              dense.num_experts = dense.num_experts_used = dense.expert_intermediate_size = 0;
              dense.shared_expert_intermediate_size = 0;
              return dense;
            }()),
            2 * (8 * (3 * 64 * 32 + 64) + 3 * 64 * 48 + 64 - 3 * 64 * c.intermediate_size));
}

// Two tensor-parallel shards of the synthetic MoE model on two threads
// (their all_reduce_sum meets in memory), each with half of every expert's
// features and of the shared expert's, give the whole model's logits.
TEST(Moe, TwoTensorParallelShardsGiveTheWholeModelsLogits) {
  const LlamaConfig c = synthetic_moe_config();
  const std::vector<std::int32_t> a = {3, 9, 27, 17, 51}, b = {60, 2, 33};
  const std::vector<float> expected = model_logits(*make_llama_model(c), {a, b});
  test::InMemoryAllReduce reduce(2);
  std::vector<float> got[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      LlamaConfig shard = c;
      shard.shard = {r, 2, [&](std::span<float> v) { reduce(v); }};
      got[r] = model_logits(*make_llama_model(shard), {a, b});
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(got[0], got[1]);
  ASSERT_EQ(got[0].size(), expected.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i)
    worst = std::max(
        worst, std::abs(double(got[0][i]) - expected[i]) / (1.0 + std::abs(double(expected[i]))));
  EXPECT_LE(worst, 2e-4);
}

TEST(Moe, RoutingTiesPickTheLowerExpert) {
  const MoeShape s{4, 5, 2, 4, 0, true, MlpActivation::kSilu};
  const float logits[] = {0.5f, 2.0f, 2.0f, 1.0f, 2.0f};
  std::int32_t experts[2];
  float weights[2];
  route_tokens(s, logits, 1, experts, weights);
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_FLOAT_EQ(weights[1], 0.5f);
}

// DeepSeek's routing restated by counting rather than sorting: an expert
// competes when fewer than groups_used groups score above its group, and
// is chosen when fewer than k competing experts rank above it. Tokens whose
// group or expert ranks are within 1e-9 of a tie are left out.
struct RoutingReference {
  std::vector<double> weight;  // [num_experts]; 0 when not chosen
  std::vector<double> choice;  // [num_experts] the ranking values
  bool clear = true;
};

RoutingReference deepseek_routing(const MoeShape& s, const float* logits, const float* bias) {
  const std::int32_t n = s.num_experts;
  std::vector<double> p(static_cast<std::size_t>(n));
  double sum = 0.0;
  for (std::int32_t e = 0; e < n; ++e) {
    p[std::size_t(e)] = s.gating == ExpertGating::kSigmoid
                            ? 1.0 / (1.0 + std::exp(-double(logits[e])))
                            : std::exp(double(logits[e]));
    sum += p[std::size_t(e)];
  }
  RoutingReference r;
  r.choice.resize(std::size_t(n));
  for (std::int32_t e = 0; e < n; ++e) {
    if (s.gating == ExpertGating::kSoftmax) p[std::size_t(e)] /= sum;
    r.choice[std::size_t(e)] = p[std::size_t(e)] + (bias ? bias[e] : 0.0);
  }
  const std::int32_t groups = s.groups > 1 ? s.groups : 1, per_group = n / groups;
  std::vector<double> group_score(static_cast<std::size_t>(groups));
  for (std::int32_t g = 0; g < groups; ++g) {
    double best = -1e300, second = -1e300;
    for (std::int32_t i = 0; i < per_group; ++i) {
      const double v = r.choice[std::size_t(g * per_group + i)];
      if (v > best)
        second = best, best = v;
      else if (v > second)
        second = v;
    }
    group_score[std::size_t(g)] = s.gating == ExpertGating::kSigmoid ? best + second : best;
  }
  const auto competes = [&](std::int32_t e) {
    std::int32_t above = 0;
    for (std::int32_t h = 0; h < groups; ++h) {
      const double gap = group_score[std::size_t(h)] - group_score[std::size_t(e / per_group)];
      if (h != e / per_group && std::abs(gap) < 1e-9) r.clear = false;
      above += gap > 0.0;
    }
    return groups == 1 || above < s.groups_used;
  };
  std::vector<bool> competing(static_cast<std::size_t>(n));
  for (std::int32_t e = 0; e < n; ++e) competing[std::size_t(e)] = competes(e);
  r.weight.assign(std::size_t(n), 0.0);
  double chosen_sum = 0.0;
  for (std::int32_t e = 0; e < n; ++e) {
    if (!competing[std::size_t(e)]) continue;
    std::int32_t above = 0;
    for (std::int32_t f = 0; f < n; ++f) {
      if (!competing[std::size_t(f)] || f == e) continue;
      const double gap = r.choice[std::size_t(f)] - r.choice[std::size_t(e)];
      if (std::abs(gap) < 1e-9) r.clear = false;
      above += gap > 0.0;
    }
    if (above < s.num_experts_used) {
      r.weight[std::size_t(e)] = p[std::size_t(e)];
      chosen_sum += p[std::size_t(e)];
    }
  }
  for (double& w : r.weight) w *= (s.normalize_weights ? 1.0 / chosen_sum : 1.0) * s.weights_scale;
  return r;
}

TEST(Moe, DeepSeekRoutingMatchesACountingReference) {
  MoeShape v3{8, 16, 4, 8, 0, true, MlpActivation::kSilu};  // V3: sigmoid, bias, best 2 of 4 groups
  v3.gating = ExpertGating::kSigmoid;
  v3.weights_scale = 2.5f;
  v3.groups = 4;
  v3.groups_used = 2;
  MoeShape v2 = v3;  // V2: softmax, best group by its best expert, scaled, not renormalised
  v2.gating = ExpertGating::kSoftmax;
  v2.normalize_weights = false;
  v2.num_experts = 12;
  v2.num_experts_used = 3;
  v2.groups = 6;
  v2.groups_used = 2;
  v2.weights_scale = 16.0f;
  MoeShape lite = v2;  // V2-Lite: no groups
  lite.groups = lite.groups_used = 1;
  lite.weights_scale = 1.0f;
  MoeShape one_group = v3;  // sigmoid, groups off by groups_used == groups
  one_group.groups_used = 4;
  for (const MoeShape& s : {v3, v2, lite, one_group}) {
    const std::int32_t tokens = 300, n = s.num_experts, k = s.num_experts_used;
    const std::vector<float> logits = uniform(std::size_t(tokens) * n, 3.0, 7000 + n);
    const std::vector<float> bias = uniform(std::size_t(n), 0.2, 7100 + n);
    const float* b = s.gating == ExpertGating::kSigmoid ? bias.data() : nullptr;
    std::vector<std::int32_t> experts(std::size_t(tokens) * k);
    std::vector<float> weights(experts.size());
    route_tokens(s, logits.data(), tokens, experts.data(), weights.data(), b);
    std::int32_t checked = 0;
    for (std::int32_t t = 0; t < tokens; ++t) {
      const RoutingReference r = deepseek_routing(s, logits.data() + std::size_t(t) * n, b);
      if (!r.clear) continue;
      ++checked;
      double previous = 1e300;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int32_t e = experts[std::size_t(t) * k + j];
        ASSERT_GT(r.weight[std::size_t(e)], 0.0) << "token " << t << ": expert " << e;
        EXPECT_NEAR(weights[std::size_t(t) * k + j], r.weight[std::size_t(e)],
                    1e-6 * r.weight[std::size_t(e)])
            << "token " << t << ", expert " << e;
        EXPECT_LT(r.choice[std::size_t(e)], previous) << "token " << t << ": not in rank order";
        previous = r.choice[std::size_t(e)];
      }
    }
    EXPECT_GE(checked, tokens - 3);
  }
}

// The V3 group rule matters: the experts of the best groups by their best
// two win over a lone top expert elsewhere.
TEST(Moe, SigmoidGroupsRankByTheirBestTwo) {
  MoeShape s{4, 4, 1, 4, 0, false, MlpActivation::kSilu};
  s.gating = ExpertGating::kSigmoid;
  s.groups = 2;
  s.groups_used = 1;
  const float logits[] = {4.0f, -4.0f, 1.0f, 1.0f};  // group 0: one high; group 1: two medium
  std::int32_t expert = -1;
  float weight = 0.0f;
  route_tokens(s, logits, 1, &expert, &weight);
  EXPECT_EQ(expert, 2);
  EXPECT_NEAR(weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  s.gating = ExpertGating::kSoftmax;  // V2: a group is as good as its best expert
  route_tokens(s, logits, 1, &expert, &weight);
  EXPECT_EQ(expert, 0);
}

TEST(Moe, ErrorsNameTheProblem) {
  const MoeShape s{16, 4, 2, 8, 0, false, MlpActivation::kSilu};
  MoeLayerWeights w = random_weights(s, 900);
  w.experts.pop_back();
  MoeScratch scratch;
  LinearScratch linear_scratch;
  std::vector<float> x(16, 0.0f), y(16);
  test::expect_throws<InvalidArgument>(
      [&] { moe_forward(s, w, x.data(), 1, y.data(), false, scratch, linear_scratch); },
      {"has 3 experts, the config has 4"});
  LlamaConfig c;
  c.name = "tiny-moe";
  c.num_experts = 4;
  c.num_experts_used = 5;
  c.expert_intermediate_size = 8;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); }, {"num_experts_used = 5"});
  c.num_experts_used = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.shard = {0, 2, [](std::span<float>) {}};
  c.expert_intermediate_size = 9;
  test::expect_throws<InvalidArgument>(
      [&] { validate_shard(c); },
      {"model 'tiny-moe' cannot be split over 2 ranks",
       "expert_intermediate_size = 9 is not divisible by the tensor-parallel size 2"});
  c.expert_intermediate_size = 8;
  c.shard = {};
  c.expert_groups = 3;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"expert_groups = 3 must divide num_experts = 4"});
  c.expert_groups = 2;
  c.expert_groups_used = 3;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"expert_groups_used = 3 must be in [1, 2]"});
  c.expert_groups = c.expert_groups_used = 0;
  c.expert_weights_scale = 0.0f;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"expert_weights_scale = 0"});
  c.expert_weights_scale = 1.0f;
  c.num_experts = 0;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"num_experts = 0 (a dense model)"});
}

}  // namespace
}  // namespace moe_tests
}  // namespace pagedattn::engine
