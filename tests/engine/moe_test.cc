// The mixture-of-experts block against a double-precision reference: random
// shapes, a batch whose experts get very uneven numbers of rows (some none),
// quantised experts, and in deterministic mode every token's result bitwise
// the same alone as in any batch.
#include "engine/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "engine/counter_random.h"
#include "engine/quant_kernels.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"

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
      for (const bool deterministic : {false, true})
        expect_matches_reference(s, w, x, deterministic);
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

TEST(Moe, DeterministicRowsDoNotDependOnTheBatch) {
  const MoeShape s{64, 8, 2, 48, 80, true, MlpActivation::kSilu};
  const MoeLayerWeights w = random_weights(s, 500);
  const std::int32_t tokens = 40;
  const std::vector<float> x = uniform(std::size_t(tokens) * s.hidden, 1.5, 501);
  MoeScratch scratch;
  const std::vector<float> whole = run(s, w, x, true, scratch);
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

// The synthetic MoE model (seeded expert weights, a shared expert) in
// deterministic mode: a sequence's logits alone equal those in a batch.
TEST(Moe, SyntheticModelRowsDoNotDependOnTheBatch) {
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
  c.shard.size = 2;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"model 'tiny-moe' is a mixture of 4 experts"});
  c.shard.size = 1;
  c.num_experts = 0;
  test::expect_throws<InvalidArgument>([&] { validate_moe_config(c); },
                                       {"num_experts = 0 (a dense model)"});
}

}  // namespace
}  // namespace moe_tests
}  // namespace pagedattn::engine
