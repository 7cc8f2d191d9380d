// serve --disaggregate's library side on 2 ranks (rank 0: PrefillClient and
// the decode Engine, stepped as a server's engine thread does; rank 1:
// serve_prefill): the outputs equal one engine's on the same requests, also
// when the decode cache holds one request at a time (offers wait for room);
// cancelled requests (queued, being prefilled, arrived) and a prompt the
// prefill model fails on leave no page in use on either rank; close() with
// prompts in flight releases the prefill rank.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <vector>

#include "failing_model.h"
#include "pagedattn/distributed/disagg.h"
#include "pagedattn/llama.h"
#include "support/engine_jobs.h"

namespace pagedattn::dist::serve_test {
namespace {

using test::Tokens;
constexpr int kDecodeRank = 0, kPrefillRank = 1;

EngineConfig config(std::int64_t kv_pages = 1024) {
  LlamaConfig m = llama_preset("tiny");
  m.hidden_size = 96;
  m.intermediate_size = 160;
  m.num_layers = 2;
  m.num_qo_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 32;
  m.vocab_size = 300;
  EngineConfig c;
  c.model = std::shared_ptr<Model>(make_llama_model(m));
  c.page_size = 8;
  c.kv_memory_bytes = kv_pages * PagedKVCache(engine_cache_config(c)).bytes_per_page();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.deterministic = true;
  return c;
}

struct Request {
  Tokens prompt;
  SamplingParams params;
};

std::vector<Request> requests() {
  std::vector<Request> r;
  const std::int32_t lens[] = {5, 17, 150, 8, 64, 33};  // 150: three prefill chunks
  for (std::int32_t i = 0; i < 6; ++i) {
    SamplingParams p{.max_tokens = 6 + 3 * i, .ignore_eos = true};
    if (i == 4) p = {.max_tokens = 12, .temperature = 0.9f, .top_k = 40, .seed = 1234};
    r.push_back({test::token_stream(lens[i], i), p});
  }
  return r;
}

// Each sample's output tokens.
using Samples = std::vector<Tokens>;
void append(Samples& samples, const SampleOutput& s) {
  if (std::ssize(samples) <= s.index) samples.resize(std::size_t(s.index) + 1);
  Tokens& t = samples[std::size_t(s.index)];
  t.insert(t.end(), s.new_token_ids.begin(), s.new_token_ids.end());
}

// One engine alone: every output token of each request.
std::vector<Samples> single_engine(const EngineConfig& c, const std::vector<Request>& reqs) {
  Engine engine(c);
  std::map<RequestId, std::size_t> index;
  for (std::size_t i = 0; i < reqs.size(); ++i)
    index[engine.add_request(reqs[i].prompt, reqs[i].params)] = i;
  std::vector<Samples> out(reqs.size());
  while (engine.has_unfinished())
    for (const RequestOutput& o : engine.step())
      for (const SampleOutput& s : o.samples) append(out[index[o.request_id]], s);
  return out;
}

// Rank 0's loop, as the server's engine thread runs it: poll between steps.
// `before_poll(n)` runs before the n-th poll (cancellations). Returns each
// key's tokens; errors of failed keys in `errors`.
struct Served {
  std::map<std::int64_t, Samples> tokens;
  std::map<std::int64_t, std::string> errors;
  TransferStats transfer;
};
Served serve_requests(
    const EngineConfig& c, const std::vector<Request>& reqs,
    const std::function<void(int, PrefillClient&, Engine&, std::map<RequestId, std::int64_t>&)>&
        before_poll = {}) {
  const MpiComm world = MpiComm::world();
  Engine engine(c);
  PrefillClient client(world, c);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    client.submit(static_cast<std::int64_t>(i), reqs[i].prompt, reqs[i].params);
  Served out;
  std::map<RequestId, std::int64_t> key_of;
  for (int polls = 0; client.busy() || engine.has_unfinished(); ++polls) {
    if (before_poll) before_poll(polls, client, engine, key_of);
    for (const PrefillArrival& a : client.poll(engine)) {
      if (!a.error.empty()) {
        out.errors[a.key] = a.error;
        continue;
      }
      EXPECT_EQ(a.first_tokens.size(), a.finish.size());
      for (std::size_t i = 0; i < a.first_tokens.size(); ++i)
        append(out.tokens[a.key], {std::int32_t(i), {a.first_tokens[i]}});
      key_of[a.request_id] = a.key;
    }
    if (!engine.has_unfinished()) continue;
    for (const RequestOutput& o : engine.step()) {
      const auto it = key_of.find(o.request_id);
      if (it == key_of.end()) continue;  // aborted
      for (const SampleOutput& s : o.samples) append(out.tokens[it->second], s);
    }
  }
  client.close();
  out.transfer = client.stats();
  EXPECT_TRUE(engine.cache().empty()) << "the decode rank leaked pages";
  engine.cache().check_invariants();
  return out;
}

// Rank 1: prefills until rank 0 closes; no page may stay in use.
void prefill_rank(const EngineConfig& c) {
  const TransferStats s = serve_prefill(MpiComm::world(), kDecodeRank, c);
  EXPECT_EQ(s.pages_left, 0) << "the prefill rank leaked pages";
}

TEST(DisaggServe, ImportsEqualOneEngine) {
  const EngineConfig c = config();
  const std::vector<Request> reqs = requests();
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(c);
  const Served s = serve_requests(c, reqs);
  const std::vector<Samples> expected = single_engine(c, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(s.tokens.at(static_cast<std::int64_t>(i)), expected[i]) << "request " << i;
  EXPECT_TRUE(s.errors.empty());
  EXPECT_EQ(s.transfer.transfers, 6);
  EXPECT_GT(s.transfer.bytes, 0);
}

TEST(DisaggServe, ParallelSamplesForkTheImportedPrompt) {
  const EngineConfig c = config();
  SamplingParams sampled{.max_tokens = 9, .temperature = 1.5f, .n = 3, .seed = 77};
  std::vector<Request> reqs = {{test::token_stream(21, 1), sampled},
                               {test::token_stream(9, 2), {.max_tokens = 1, .n = 2}},
                               {test::token_stream(40, 3), {.max_tokens = 7, .n = 2}}};
  // A stop token only sample 1 draws first: it ends at its first token while
  // samples 0 and 2 go on from the forked prompt.
  const Samples free_run = single_engine(c, reqs)[0];
  for (std::int32_t t = 0; t < 300; ++t)
    if (t == free_run[1][0] && t != free_run[0][0] && t != free_run[2][0])
      reqs[0].params.stop_token_ids = {t};
  ASSERT_FALSE(reqs[0].params.stop_token_ids.empty()) << "samples 0 and 2 drew sample 1's token";
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(c);
  const Served s = serve_requests(c, reqs);
  const std::vector<Samples> expected = single_engine(c, reqs);
  EXPECT_EQ(expected[0][1].size(), 1u);  // stopped at its first token
  EXPECT_GT(expected[0][0].size(), 1u);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(s.tokens.at(static_cast<std::int64_t>(i)), expected[i]) << "request " << i;
  EXPECT_EQ(s.transfer.transfers, 3);
}

TEST(DisaggServe, OffersWaitForRoomInAFullDecodeCache) {
  // Each request needs 13 prompt pages and 11 more while it decodes: the
  // decode cache of 26 holds one at a time, so later offers wait (held on
  // rank 0, pages pinned on rank 1) until a request finishes.
  const EngineConfig prefill = config();
  const EngineConfig decode = config(26);
  std::vector<Request> reqs;
  for (std::int32_t i = 0; i < 3; ++i)
    reqs.push_back({test::token_stream(100, i), {.max_tokens = 88, .ignore_eos = true}});
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(prefill);
  const Served s = serve_requests(decode, reqs);
  const std::vector<Samples> expected = single_engine(prefill, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(s.tokens.at(static_cast<std::int64_t>(i)), expected[i]) << "request " << i;
  EXPECT_EQ(s.transfer.transfers, 3);
  RecordProperty("offers_that_waited", static_cast<int>(s.transfer.retries));
}

TEST(DisaggServe, CancelledRequestsLeaveNoPageOnEitherRank) {
  const EngineConfig c = config();
  const std::vector<Request> reqs = requests();
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(c);
  bool aborted = false;
  const Served s = serve_requests(c, reqs,
                                  [&](int poll, PrefillClient& client, Engine& engine,
                                      std::map<RequestId, std::int64_t>& key_of) {
                                    if (poll == 0) client.cancel(5);  // still queued
                                    if (aborted) return;
                                    // One prefill rank: request 1 was sent to it when request 0
                                    // arrived. Cancel it there, and abort request 0 in the engine.
                                    for (const auto& [id, key] : key_of)
                                      if (key == 0) {
                                        client.cancel(1);
                                        engine.abort(id);
                                        aborted = true;
                                        return;
                                      }
                                  });
  const std::vector<Samples> expected = single_engine(c, reqs);
  for (std::int64_t key : {2, 3, 4}) EXPECT_EQ(s.tokens.at(key), expected[std::size_t(key)]) << key;
  EXPECT_FALSE(s.tokens.contains(1));
  EXPECT_FALSE(s.tokens.contains(5));
  EXPECT_TRUE(aborted);
  EXPECT_EQ(s.transfer.cancelled, 1);  // request 1's offer, refused
}

using test::FailingModel;

TEST(DisaggServe, APromptThePrefillModelFailsOnFailsAloneAndTheRankServesOn) {
  EngineConfig c = config();
  const std::vector<Request> reqs = requests();
  if (MpiComm::world().rank() == kPrefillRank) {
    c.model = std::make_shared<FailingModel>(c.model, 17);  // request 1's prompt
    return prefill_rank(c);
  }
  const Served s = serve_requests(c, reqs);
  const std::vector<Samples> expected = single_engine(c, reqs);
  ASSERT_TRUE(s.errors.contains(1));
  EXPECT_NE(s.errors.at(1).find("injected model failure"), std::string::npos) << s.errors.at(1);
  for (std::int64_t key : {0, 2, 3, 4, 5})
    EXPECT_EQ(s.tokens.at(key), expected[std::size_t(key)]) << key;
}

TEST(DisaggServe, CloseWithPromptsInFlightReleasesThePrefillRank) {
  const EngineConfig c = config();
  const std::vector<Request> reqs = requests();
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(c);
  Engine engine(c);
  PrefillClient client(MpiComm::world(), c);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    client.submit(static_cast<std::int64_t>(i), reqs[i].prompt, reqs[i].params);
  client.poll(engine);  // sends the first prompt
  EXPECT_TRUE(client.busy());
  client.close();  // waits for its offer, refuses it, releases the prefill rank
  EXPECT_FALSE(client.busy());
  EXPECT_THROW(client.submit(9, reqs[0].prompt, reqs[0].params), InvalidState);
  EXPECT_EQ(engine.num_pending_imports(), 0);
}

TEST(DisaggServe, SubmitRejectsWhatTheImportCannotTake) {
  const EngineConfig c = config();
  if (MpiComm::world().rank() == kPrefillRank) return prefill_rank(c);
  PrefillClient client(MpiComm::world(), c);
  const Tokens p = test::token_stream(8, 0);
  EXPECT_THROW(client.submit(0, p, {.logprobs = 2}), InvalidArgument);
  EXPECT_THROW(client.submit(-1, p, {}), InvalidArgument);
  EXPECT_THROW(client.submit(0, {}, {}), InvalidArgument);
  EXPECT_FALSE(client.busy());
}

}  // namespace
}  // namespace pagedattn::dist::serve_test
