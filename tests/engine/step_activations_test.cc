// The engine's choice of activations per step (engine/step_activations.h):
// int8 by default only in decode steps of at least as many sequences as
// this CPU's one-time timing found it faster at (min_rows, 8 or more);
// never with exact_products or in deterministic mode; always with
// int8_activations.
#include "engine/step_activations.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "pagedattn/engine.h"
#include "support/engine_jobs.h"
#include "support/small_llama.h"

namespace pagedattn {
namespace {
namespace step_activations_test {  // this file's own names in a unity batch

using engine::ActivationPolicy;
using engine::int8_decode_timing;
using engine::kInt8DecodeRows;
using engine::step_takes_int8;

TEST(StepActivations, TheTimingIsMadeOnceAndFindsTheFewestRowsWhereInt8Pays) {
  const engine::Int8DecodeTiming& t = int8_decode_timing();
  EXPECT_EQ(&t, &int8_decode_timing());
  // Timed from the fewest rows up, stopping at the first that pays.
  std::int32_t expected = 0;
  for (std::size_t i = 0; i < kInt8DecodeRows.size() && expected == 0; ++i) {
    const engine::Int8DecodeTiming::Point& p = t.points[i];
    EXPECT_EQ(p.rows, kInt8DecodeRows[i]);
    EXPECT_GT(p.f32_seconds, 0.0);
    EXPECT_GT(p.int8_seconds, 0.0);
    if (p.int8_seconds <= engine::kInt8DecodeMargin * p.f32_seconds) expected = p.rows;
  }
  EXPECT_EQ(t.min_rows, expected);
}

// Whether the default takes int8 in a decode-only step of `decodes`.
bool default_takes(std::int32_t decodes) {
  const std::int32_t min_rows = int8_decode_timing().min_rows;
  return min_rows > 0 && decodes >= min_rows;
}

TEST(StepActivations, DefaultTakesInt8OnlyInDecodeStepsOfManySequences) {
  const ActivationPolicy by_default{};
  for (const std::int32_t decodes : {1, 4, 7, 8, 15, 16, 31, 32, 256})
    EXPECT_EQ(step_takes_int8(by_default, decodes, decodes), default_takes(decodes)) << decodes;
  EXPECT_FALSE(default_takes(kInt8DecodeRows.front() - 1));
  // A prompt token anywhere in the step keeps it f32, however many decode.
  EXPECT_FALSE(step_takes_int8(by_default, 33, 32));
  EXPECT_FALSE(step_takes_int8(by_default, 512, 0));
  for (const std::int32_t decodes : {0, 1, 8, 64}) {
    EXPECT_FALSE(step_takes_int8({false, true}, decodes, decodes));
    EXPECT_FALSE(step_takes_int8({false, true}, decodes + 40, decodes));
    EXPECT_TRUE(step_takes_int8({true, false}, decodes + 40, decodes));
    EXPECT_TRUE(step_takes_int8({true, false}, decodes, decodes));
  }
}

// Records each step's shape (tokens, sequences in the plan) and the
// activations the engine asked for.
class ActivationRecorder final : public Model {
 public:
  struct Step {
    std::int32_t tokens = 0, sequences = 0;
    bool int8 = false;
  };
  explicit ActivationRecorder(std::shared_ptr<Model> model) : model_(std::move(model)) {}
  const ModelSpec& spec() const override { return model_->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    steps.push_back({static_cast<std::int32_t>(batch.token_ids.size()),
                     static_cast<std::int32_t>(cache.plan().seq_ids.size()),
                     batch.int8_activations});
    model_->forward(batch, cache, logits);
  }
  std::vector<Step> steps;

 private:
  std::shared_ptr<Model> model_;
};

// 20 greedy requests of 3-20 prompt tokens and 2-21 new tokens, all added
// at once: one step computes every prompt (the token budget holds them),
// then decode steps of 20 sequences, fewer as requests finish.
std::vector<ActivationRecorder::Step> run_steps(EngineConfig c) {
  auto recorder = std::make_shared<ActivationRecorder>(test::small_llama());
  c.model = recorder;
  c.kv_memory_bytes = 8 << 20;
  c.page_size = 8;
  c.max_num_seqs = 32;
  c.max_num_batched_tokens = 512;
  Engine engine(c);
  for (std::int32_t j = 0; j < 20; ++j) {
    SamplingParams p;
    p.max_tokens = 2 + j;
    p.ignore_eos = true;
    engine.add_request(test::token_stream(3 + (j * 7) % 18, j), p);
  }
  while (engine.has_unfinished()) engine.step();
  return recorder->steps;
}

TEST(StepActivations, TheEngineAsksForInt8OnlyInDecodeStepsOfManySequences) {
  const std::vector<ActivationRecorder::Step> steps = run_steps({});
  ASSERT_GT(steps.size(), 3u);
  EXPECT_GT(steps.front().tokens, steps.front().sequences);  // the prompts, at once
  EXPECT_FALSE(steps.front().int8);
  std::int32_t int8_steps = 0, f32_steps = 0;
  for (const auto& s : steps) {
    if (s.tokens != s.sequences) continue;
    (s.int8 ? int8_steps : f32_steps) += 1;
    EXPECT_EQ(s.int8, default_takes(s.sequences)) << s.sequences << " sequences decoding";
  }
  EXPECT_GT(f32_steps, 0);  // the last steps decode fewer than 8
  if (default_takes(20)) {
    EXPECT_GT(int8_steps, 0);
  }
}

TEST(StepActivations, ExactProductsAndDeterministicModeNeverAskAndTheFlagAlwaysDoes) {
  EngineConfig exact;
  exact.exact_products = true;
  EngineConfig deterministic;
  deterministic.deterministic = true;
  for (const EngineConfig& c : {exact, deterministic})
    for (const auto& s : run_steps(c)) EXPECT_FALSE(s.int8) << s.tokens << " tokens";
  EngineConfig always;
  always.int8_activations = true;
  for (const auto& s : run_steps(always)) EXPECT_TRUE(s.int8) << s.tokens << " tokens";
}

// bf16 products' routes: a bf16 route only where it beats f32 by the
// margin; of the two bf16 routes the fixed one unless the other beats it by
// the margin (a near tie keeps the fixed route); no oneDNN (infinite time)
// never chosen.
TEST(StepActivations, Bf16RoutesTakeTheFasterPathOnlyByAMargin) {
  using engine::Bf16Route;
  constexpr double kNone = std::numeric_limits<double>::infinity();
  const auto route = [](double f32, double tiles, double onednn, Bf16Route fixed) {
    return engine::fastest_bf16_route({16, f32, tiles, onednn}, fixed);
  };
  EXPECT_EQ(route(1.0, 0.5, 0.8, Bf16Route::kTiles), Bf16Route::kTiles);
  EXPECT_EQ(route(1.0, 0.8, 0.5, Bf16Route::kTiles), Bf16Route::kOneDnn);
  EXPECT_EQ(route(1.0, 0.8, 0.75, Bf16Route::kTiles), Bf16Route::kTiles);    // near tie: fixed
  EXPECT_EQ(route(1.0, 0.75, 0.8, Bf16Route::kOneDnn), Bf16Route::kOneDnn);  // near tie: fixed
  EXPECT_EQ(route(1.0, 0.5, 0.8, Bf16Route::kOneDnn), Bf16Route::kTiles);
  EXPECT_EQ(route(1.0, 0.95, 0.97, Bf16Route::kTiles), Bf16Route::kF32);  // under the margin
  EXPECT_EQ(route(1.0, 1.5, 2.0, Bf16Route::kOneDnn), Bf16Route::kF32);
  EXPECT_EQ(route(1.0, 0.5, kNone, Bf16Route::kOneDnn), Bf16Route::kTiles);  // no oneDNN
  EXPECT_EQ(route(1.0, 0.5, kNone, Bf16Route::kTiles), Bf16Route::kTiles);
  EXPECT_EQ(route(1.0, kNone, kNone, Bf16Route::kTiles), Bf16Route::kF32);
}

// The timing, made once, holds a point per kBf16RouteRows with the route
// the rule gives it; an engine with bf16 products sets those routes, and
// linear() takes them.
TEST(StepActivations, TheBf16TimingIsMadeOnceAndAnEngineWithBf16ProductsSetsItsRoutes) {
  const engine::Bf16Routes before = engine::bf16_routes();
  const engine::Bf16RouteTiming& t = engine::bf16_route_timing();
  EXPECT_EQ(&t, &engine::bf16_route_timing());
  const engine::Bf16Routes fixed = engine::fixed_bf16_routes();
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    EXPECT_EQ(t.points[i].rows, engine::kBf16RouteRows[i]);
    if (!engine::dot_tiles_bf16_available()) {
      EXPECT_EQ(t.routes.route[i], engine::Bf16Route::kF32);
      continue;
    }
    EXPECT_GT(t.points[i].f32_seconds, 0.0);
    EXPECT_GT(t.points[i].tiles_seconds, 0.0);
    EXPECT_EQ(t.routes.route[i], engine::fastest_bf16_route(t.points[i], fixed.route[i]));
  }
  engine::prepare_step_activations({});  // no bf16: the routes stay
  EXPECT_EQ(engine::bf16_routes(), before);
  engine::prepare_step_activations({false, false, true});
  EXPECT_EQ(engine::bf16_routes(), t.routes);
  engine::set_bf16_routes(before);
  // The policy of an engine: bf16 only where its products are not exact.
  EngineConfig c;
  c.bf16_products = true;
  EXPECT_TRUE(engine::activation_policy(c).bf16);
  c.deterministic = true;
  EXPECT_FALSE(engine::activation_policy(c).bf16);
}

}  // namespace step_activations_test
}  // namespace
}  // namespace pagedattn
