// Engine::reserve_import / commit_import / cancel_import (the decode side of
// disaggregated prefill/decode) without MPI: a prompt prefilled in a separate
// cache is copied into the reserved pages and the engine continues it exactly
// as if it had run the prompt itself; refusals and cancels leave no page.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {
namespace engine_import_test {  // this file's own names in a unity batch

using Tokens = std::vector<std::int32_t>;

EngineConfig config(std::int64_t pages = 64) {
  LlamaConfig m = llama_preset("tiny");
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_layers = 2;
  m.vocab_size = 200;
  EngineConfig c;
  c.model = std::shared_ptr<Model>(make_llama_model(m));
  c.page_size = 8;
  c.kv_memory_bytes = 1 << 20;
  c.kv_memory_bytes = pages * PagedKVCache(engine_cache_config(c)).bytes_per_page();
  c.max_num_batched_tokens = 256;
  c.deterministic = true;
  return c;
}

Tokens prompt(std::int32_t len) {
  Tokens t(static_cast<std::size_t>(len));
  for (std::int32_t i = 0; i < len; ++i) t[i] = (i * 31 + 7) % 200;
  return t;
}

Tokens run_alone(const EngineConfig& c, const Tokens& p, const SamplingParams& params) {
  Engine e(c);
  e.add_request(p, params);
  Tokens out;
  while (e.has_unfinished())
    for (const RequestOutput& o : e.step())
      for (const SampleOutput& s : o.samples)
        out.insert(out.end(), s.new_token_ids.begin(), s.new_token_ids.end());
  return out;
}

// What a prefill instance does: the prompt's K/V in its own cache, pinned,
// and the first token.
struct Prefilled {
  PagedKVCache cache;
  OutgoingKV pinned;
  std::int32_t first = 0;
  std::vector<float> logits;  // the prompt's last row: every sample's first draw
};
Prefilled prefill(const EngineConfig& c, const Tokens& p, const SamplingParams& params) {
  Prefilled out{PagedKVCache(engine_cache_config(c)), {}, 0, {}};
  out.cache.add_sequence(1);
  const std::array<SeqId, 1> ids{1};
  const std::array<std::int64_t, 1> lens{std::ssize(p)};
  const std::array<std::int32_t, 1> row{static_cast<std::int32_t>(p.size()) - 1};
  std::vector<float> logits(static_cast<std::size_t>(c.model->spec().vocab_size));
  out.cache.begin_forward(ids, lens);
  c.model->forward({p, row, true}, out.cache, logits);
  out.cache.end_forward();
  out.first = sample_token(logits, params, params.seed.value_or(0), 0, std::ssize(p));
  out.pinned = out.cache.outgoing_pages(1);
  out.logits = std::move(logits);
  return out;
}

void copy_stream(const KVPageRuns& from, const KVPageRuns& to) {
  ASSERT_EQ(from.layer_bytes, to.layer_bytes);
  for (std::size_t l = 0; l < from.layers.size(); ++l) {
    std::vector<std::byte> bytes;
    for (std::span<std::byte> r : from.layers[l]) bytes.insert(bytes.end(), r.begin(), r.end());
    std::size_t at = 0;
    for (std::span<std::byte> r : to.layers[l]) {
      std::memcpy(r.data(), bytes.data() + at, r.size());
      at += r.size();
    }
  }
}

TEST(EngineImport, AnImportedPromptContinuesLikeALocalOne) {
  const EngineConfig c = config();
  const Tokens p = prompt(29);
  for (float temperature : {0.0f, 0.8f}) {
    const SamplingParams params{
        .max_tokens = 12, .temperature = temperature, .seed = 99, .ignore_eos = true};
    Prefilled pre = prefill(c, p, params);
    Engine e(c);
    const std::optional<ImportSlot> slot = e.reserve_import(p, params);
    ASSERT_TRUE(slot.has_value());
    EXPECT_EQ(e.num_pending_imports(), 1);
    copy_stream(pre.pinned.runs, slot->pages);
    EXPECT_EQ(e.commit_import(slot->request_id, pre.first), FinishReason::kNone);
    Tokens out{pre.first};
    while (e.has_unfinished())
      for (const RequestOutput& o : e.step())
        for (const SampleOutput& s : o.samples)
          out.insert(out.end(), s.new_token_ids.begin(), s.new_token_ids.end());
    EXPECT_EQ(out, run_alone(c, p, params)) << "temperature " << temperature;
    EXPECT_TRUE(e.cache().empty());
    e.cache().check_invariants();
  }
}

TEST(EngineImport, ParallelSamplesForkTheImportedPrompt) {
  const EngineConfig c = config();
  const Tokens p = prompt(29);  // a partial last page: each fork copies it
  const SamplingParams params{
      .max_tokens = 8, .temperature = 0.9f, .n = 3, .seed = 5, .ignore_eos = true};
  const Prefilled pre = prefill(c, p, params);
  Tokens first;
  for (std::int32_t i = 0; i < params.n; ++i)
    first.push_back(sample_token(pre.logits, params, *params.seed, i, std::ssize(p)));
  Engine e(c);
  const std::optional<ImportSlot> slot = e.reserve_import(p, params);
  ASSERT_TRUE(slot.has_value());
  copy_stream(pre.pinned.runs, slot->pages);
  EXPECT_THROW(e.commit_import(slot->request_id, first[0]), InvalidArgument);  // n is 3
  EXPECT_THROW(e.commit_import_samples(slot->request_id, std::span(first).first(2)),
               InvalidArgument);
  EXPECT_EQ(e.commit_import_samples(slot->request_id, first),
            std::vector<FinishReason>(3, FinishReason::kNone));
  std::vector<Tokens> imported(3), alone(3);
  for (std::size_t i = 0; i < 3; ++i) imported[i] = {first[i]};
  auto collect = [](Engine& engine, std::vector<Tokens>& out) {
    while (engine.has_unfinished())
      for (const RequestOutput& o : engine.step())
        for (const SampleOutput& s : o.samples) {
          Tokens& t = out[std::size_t(s.index)];
          t.insert(t.end(), s.new_token_ids.begin(), s.new_token_ids.end());
        }
  };
  collect(e, imported);
  Engine reference(c);
  reference.add_request(p, params);
  collect(reference, alone);
  EXPECT_EQ(imported, alone);
  EXPECT_TRUE(e.cache().empty());
  e.cache().check_invariants();
}

TEST(EngineImport, RefusalsAndCancelsLeaveNoPage) {
  Engine e(config(16));
  const Tokens p = prompt(60);  // 8 of the 16 pages
  EXPECT_THROW(e.reserve_import(p, {.max_tokens = 4, .n = 0}), InvalidArgument);
  EXPECT_THROW(e.reserve_import({}, {}), InvalidArgument);
  const std::optional<ImportSlot> a = e.reserve_import(p, {.max_tokens = 4});
  ASSERT_TRUE(a.has_value());
  const std::uint64_t before = e.cache().state_digest();
  EXPECT_FALSE(e.reserve_import(p, {.max_tokens = 4}).has_value());  // 8 + watermark > 8 free
  EXPECT_EQ(e.cache().state_digest(), before);
  EXPECT_THROW(e.commit_import(a->request_id, 200), InvalidArgument);  // outside the vocabulary
  EXPECT_THROW(e.commit_import(a->request_id + 7, 1), InvalidArgument);
  EXPECT_EQ(e.cache().state_digest(), before);
  e.cancel_import(a->request_id);
  EXPECT_THROW(e.cancel_import(a->request_id), InvalidArgument);
  EXPECT_EQ(e.num_pending_imports(), 0);
  EXPECT_TRUE(e.cache().empty());
  EXPECT_FALSE(e.has_unfinished());
}

TEST(EngineImport, AFirstTokenThatFinishesTheRequestFreesItsPages) {
  Engine e(config());
  const std::optional<ImportSlot> a = e.reserve_import(prompt(20), {.max_tokens = 1});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(e.commit_import(a->request_id, 5), FinishReason::kLength);
  const std::optional<ImportSlot> b =
      e.reserve_import(prompt(20), {.max_tokens = 9, .stop_token_ids = {6}});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(e.commit_import(b->request_id, 6), FinishReason::kStop);
  EXPECT_TRUE(e.cache().empty());
  EXPECT_FALSE(e.has_unfinished());
}

}  // namespace engine_import_test
}  // namespace
}  // namespace pagedattn
