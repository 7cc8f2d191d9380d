// A model whose every layer has a sliding window (Mistral-style): the engine
// lets the cache free the pages behind the window, and the model rotates
// with whole-sequence positions, so the greedy tokens equal those of a
// teacher-forced run over a cache that keeps every token.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "pagedattn/engine.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {
namespace sliding_window_engine_test {  // this file's own names in a unity batch

constexpr std::int32_t kWindow = 6, kPageSize = 4;

LlamaConfig windowed_config(std::int32_t layers_windowed) {
  LlamaConfig c = llama_preset("tiny");
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 200;
  c.rope_theta = 100.0f;  // fast rotations: a position off by a few tokens shows
  c.layer_windows.assign(2, 0);
  for (std::int32_t l = 0; l < layers_windowed; ++l) c.layer_windows[std::size_t(l)] = kWindow;
  return c;
}

std::vector<std::int32_t> prompt_tokens() {
  std::vector<std::int32_t> t;
  for (std::int32_t i = 0; i < 30; ++i) t.push_back((i * 37 + 11) % 200);
  return t;
}

// Greedy continuation of `prompt` by teacher forcing over a plain cache
// (no window: every token kept; windows only mask).
std::vector<std::int32_t> greedy_reference(Model& model, const std::vector<std::int32_t>& prompt,
                                           std::int32_t new_tokens) {
  KVCacheConfig config = kv_cache_config(model.spec());
  config.support_sliding_window = false;
  config.page_size = kPageSize;
  config.num_pages = 64;
  config.kv_dtype = DType::kF16;
  PagedKVCache cache(config);
  const SeqId seq = 1;
  cache.add_sequence(seq);
  std::vector<std::int32_t> input = prompt, out;
  std::vector<float> logits(std::size_t(model.spec().vocab_size));
  for (std::int32_t step = 0; step < new_tokens; ++step) {
    const auto n = static_cast<std::int64_t>(input.size());
    const std::vector<std::int32_t> rows = {static_cast<std::int32_t>(n - 1)};
    cache.begin_forward({&seq, 1}, {&n, 1});
    model.forward({input, rows, true}, cache, logits);
    cache.end_forward();
    const auto best =
        static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    input = {best};
  }
  return out;
}

TEST(SlidingWindowEngine, FreesPagesBehindTheWindowWithTheSameTokens) {
  const std::shared_ptr<Model> model(make_llama_model(windowed_config(2)));
  ASSERT_EQ(model->spec().sliding_window, kWindow);
  EngineConfig config;
  config.model = model;
  config.kv_memory_bytes = 4 << 20;
  config.page_size = kPageSize;
  config.max_num_batched_tokens = 8;  // the prompt prefills in chunks over dropped tokens
  config.max_num_seqs = 4;
  config.deterministic = true;
  Engine engine(config);
  const std::vector<std::int32_t> prompt = prompt_tokens();
  const std::int32_t new_tokens = 24;
  engine.add_request(prompt, {.max_tokens = new_tokens, .ignore_eos = true});
  std::vector<std::int32_t> got;
  std::int64_t most_pages = 0;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step())
      for (const SampleOutput& s : out.samples)
        got.insert(got.end(), s.new_token_ids.begin(), s.new_token_ids.end());
    most_pages = std::max(most_pages, engine.cache().num_pages() - engine.cache().num_free_pages());
  }
  // Held between steps: the window's tokens and the partly filled pages at
  // either end; during a step a chunk of 8 more.
  EXPECT_LE(most_pages, (kWindow + 8) / kPageSize + 2);
  EXPECT_EQ(got, greedy_reference(*model, prompt, new_tokens));
}

TEST(SlidingWindowEngine, ParallelSamplesKeepTheirPromptAndMatchTheReference) {
  const std::shared_ptr<Model> model(make_llama_model(windowed_config(2)));
  EngineConfig config;
  config.model = model;
  config.kv_memory_bytes = 4 << 20;
  config.page_size = kPageSize;
  config.max_num_batched_tokens = 8;
  config.max_num_seqs = 4;
  config.deterministic = true;
  Engine engine(config);
  const std::vector<std::int32_t> prompt = prompt_tokens();
  engine.add_request(prompt, {.max_tokens = 12, .n = 2, .ignore_eos = true});
  engine.add_request(prompt, {.max_tokens = 12, .ignore_eos = true});  // windowed, beside them
  std::map<std::pair<RequestId, std::int32_t>, std::vector<std::int32_t>> got;
  while (engine.has_unfinished())
    for (const RequestOutput& out : engine.step())
      for (const SampleOutput& s : out.samples)
        got[{out.request_id, s.index}].insert(got[{out.request_id, s.index}].end(),
                                              s.new_token_ids.begin(), s.new_token_ids.end());
  const std::vector<std::int32_t> want = greedy_reference(*model, prompt, 12);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& [key, tokens] : got) EXPECT_EQ(tokens, want) << key.first << "/" << key.second;
}

TEST(SlidingWindowEngine, MixedLayersKeepEveryToken) {
  const std::shared_ptr<Model> model(make_llama_model(windowed_config(1)));
  EXPECT_EQ(model->spec().sliding_window, 0);  // one global layer needs the whole sequence
  EngineConfig config;
  config.model = model;
  config.kv_memory_bytes = 4 << 20;
  config.page_size = kPageSize;
  config.deterministic = true;
  Engine engine(config);
  const std::vector<std::int32_t> prompt = prompt_tokens();
  engine.add_request(prompt, {.max_tokens = 8, .ignore_eos = true});
  std::vector<std::int32_t> got;
  while (engine.has_unfinished())
    for (const RequestOutput& out : engine.step())
      for (const SampleOutput& s : out.samples)
        got.insert(got.end(), s.new_token_ids.begin(), s.new_token_ids.end());
  EXPECT_EQ(got, greedy_reference(*model, prompt, 8));
}

}  // namespace sliding_window_engine_test
}  // namespace
}  // namespace pagedattn
