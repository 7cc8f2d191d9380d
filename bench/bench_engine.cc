// Engine: the cost of one scheduler + planning step (schedule, begin_forward,
// end_forward, bookkeeping) at N running decode sequences, against a whole
// engine step of the tiny model at the same N. The ratio is the overhead
// target (< 3% at 64 running sequences).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

constexpr std::int32_t kContext = 400;  // tokens per sequence when timing starts

void BM_SchedulerStep(benchmark::State& state) {
  const auto n = static_cast<std::int32_t>(state.range(0));
  KVCacheConfig c;  // page accounting only: one tiny layer
  c.num_layers = 1;
  c.head_dim = 1;
  c.kv_dtype = DType::kF32;
  c.page_size = 16;
  c.num_pages = std::int64_t{n} * 512;
  PagedKVCache cache(c);
  engine::Scheduler scheduler({.max_num_seqs = 256, .max_num_batched_tokens = 4096}, cache);
  for (std::int32_t i = 0; i < n; ++i) {
    auto g = std::make_unique<engine::SequenceGroup>();
    g->id = i;
    g->params.max_tokens = 1 << 20;
    g->prompt_len = kContext;
    engine::Sequence s;
    s.id = std::int64_t{i} * engine::kMaxSamples;
    s.tokens.assign(kContext, 1);
    g->seqs.push_back(std::move(s));
    scheduler.add(std::move(g));
  }
  auto step = [&] {
    const engine::Schedule s = scheduler.schedule();
    cache.begin_forward(s.seq_ids, s.lengths);
    // No model: no K/V is written; declare every layer so the step can end.
    for (std::int32_t l = 0; l < cache.config().num_layers; ++l) cache.mark_layer_appended(l);
    cache.end_forward();
    scheduler.complete(s);
    for (const engine::ScheduledChunk& ch : s.chunks)
      if (ch.samples) ch.group->seqs[ch.seq].tokens.push_back(1);
    scheduler.release_finished();
    return s.num_decodes;
  };
  while (step() < n) {
  }  // prefill everything first
  for (auto _ : state) benchmark::DoNotOptimize(step());
  state.counters["running"] = n;
}
BENCHMARK(BM_SchedulerStep)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_EngineDecodeStep(benchmark::State& state) {
  const auto n = static_cast<std::int32_t>(state.range(0));
  EngineConfig c;
  c.model = make_llama_model(llama_preset("tiny"));
  c.kv_memory_bytes = 512ll << 20;
  c.max_num_batched_tokens = 4096;
  Engine engine(c);
  const std::vector<std::int32_t> prompt(kContext, 5);
  for (std::int32_t i = 0; i < n; ++i)
    engine.add_request(prompt, {.max_tokens = 3000, .ignore_eos = true});
  while (engine.stats().last_step_decodes < n) engine.step();
  for (auto _ : state) benchmark::DoNotOptimize(engine.step());
  state.counters["running"] = n;
}
BENCHMARK(BM_EngineDecodeStep)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// One row's draw, us per row: Args vocab (SmolLM2's 49,152, Llama 3's
// 128,256), mode 0 greedy, 1 temperature 1 over the whole vocabulary
// (OpenAI's default), 2 top_p 0.9, 3 top_k 50. Logits of a model's range
// (normal, sd 3); a new position per draw.
void BM_SampleRow(benchmark::State& state) {
  const auto vocab = static_cast<std::size_t>(state.range(0));
  const auto mode = state.range(1);
  std::vector<float> logits(vocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> value(0.0f, 3.0f);
  for (auto& v : logits) v = value(rng);
  SamplingParams p;
  p.temperature = mode == 0 ? 0.0f : 1.0f;
  if (mode == 2) p.top_p = 0.9f;
  if (mode == 3) p.top_k = 50;
  engine::Sampler sampler;
  std::int64_t position = 0;
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, p, 7, 0, position++));
  static const char* const kModes[] = {"greedy", "temperature 1", "top_p 0.9", "top_k 50"};
  state.SetLabel(kModes[mode]);
}
BENCHMARK(BM_SampleRow)
    ->ArgNames({"vocab", "mode"})
    ->ArgsProduct({{49152, 128256}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedattn

BENCHMARK_MAIN();
