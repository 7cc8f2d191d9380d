// The engine's choice of activations per step (engine/step_activations.h):
// int8 by default only in decode steps of at least kInt8DecodeMinRows
// sequences where this CPU's one-time timing found it faster; never with
// exact_products or in deterministic mode; always with int8_activations.
#include "engine/step_activations.h"

#include <gtest/gtest.h>

#include <vector>

#include "pagedattn/engine.h"
#include "support/engine_jobs.h"
#include "support/small_llama.h"

namespace pagedattn {
namespace {
namespace step_activations_test {  // this file's own names in a unity batch

using engine::ActivationPolicy;
using engine::int8_decode_timing;
using engine::kInt8DecodeMinRows;
using engine::step_takes_int8;

TEST(StepActivations, TheTimingIsMadeOnceAndMeasuresBothPaths) {
  const engine::Int8DecodeTiming& first = int8_decode_timing();
  EXPECT_EQ(&first, &int8_decode_timing());
  EXPECT_GT(first.f32_seconds, 0.0);
  EXPECT_GT(first.int8_seconds, 0.0);
  EXPECT_EQ(first.pays, first.int8_seconds <= engine::kInt8DecodeMargin * first.f32_seconds);
}

TEST(StepActivations, DefaultTakesInt8OnlyInDecodeStepsOfManySequences) {
  const bool pays = int8_decode_timing().pays;
  const ActivationPolicy by_default{};
  EXPECT_EQ(step_takes_int8(by_default, kInt8DecodeMinRows, kInt8DecodeMinRows), pays);
  EXPECT_EQ(step_takes_int8(by_default, 256, 256), pays);
  EXPECT_FALSE(step_takes_int8(by_default, kInt8DecodeMinRows - 1, kInt8DecodeMinRows - 1));
  EXPECT_FALSE(step_takes_int8(by_default, 1, 1));
  // A prompt token anywhere in the step keeps it f32, however many decode.
  EXPECT_FALSE(step_takes_int8(by_default, 33, 32));
  EXPECT_FALSE(step_takes_int8(by_default, 512, 0));
  for (const std::int32_t decodes : {0, 1, kInt8DecodeMinRows, 64}) {
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

// 12 greedy requests of 3-20 prompt tokens and 2-13 new tokens, all added
// at once: one step computes every prompt (the token budget holds them),
// then decode steps of 12 sequences, fewer as requests finish.
std::vector<ActivationRecorder::Step> run_steps(EngineConfig c) {
  auto recorder = std::make_shared<ActivationRecorder>(test::small_llama());
  c.model = recorder;
  c.kv_memory_bytes = 8 << 20;
  c.page_size = 8;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 512;
  Engine engine(c);
  for (std::int32_t j = 0; j < 12; ++j) {
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
  std::int32_t many = 0, few = 0;
  for (const auto& s : steps) {
    if (s.tokens != s.sequences) continue;
    const bool enough = s.sequences >= kInt8DecodeMinRows;
    (enough ? many : few) += 1;
    EXPECT_EQ(s.int8, enough && int8_decode_timing().pays) << s.sequences << " sequences decoding";
  }
  EXPECT_GT(many, 0);
  EXPECT_GT(few, 0);
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

}  // namespace step_activations_test
}  // namespace
}  // namespace pagedattn
