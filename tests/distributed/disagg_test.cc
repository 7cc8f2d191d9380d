// Disaggregated prefill/decode on 2 ranks (rank 0 prefills, rank 1 decodes):
// the decode rank's output equals a single engine's on the same requests
// (deterministic mode, f16 and int8 KV, prompts longer than a step's token
// budget, a decode cache too small for everything at once); cancelled,
// aborted and rejected transfers leave no page in use on either rank;
// mismatched configurations fail on both ranks with the field named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "failing_model.h"
#include "pagedattn/distributed/disagg.h"
#include "pagedattn/llama.h"
#include "support/engine_jobs.h"

namespace pagedattn::dist {
namespace {

using test::Tokens;
constexpr int kPrefillRank = 0, kDecodeRank = 1;

std::shared_ptr<Model> test_model(std::int32_t num_layers = 2) {
  LlamaConfig c = llama_preset("tiny");
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.num_layers = num_layers;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 300;
  return std::shared_ptr<Model>(make_llama_model(c));
}

EngineConfig config(DType kv_dtype, std::int64_t kv_bytes = 4 << 20) {
  EngineConfig c;
  c.model = test_model();
  c.kv_memory_bytes = kv_bytes;
  c.page_size = 8;
  c.kv_dtype = kv_dtype;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.deterministic = true;
  return c;
}

Tokens prompt(std::int32_t len, std::int32_t salt) {
  return test::token_stream(len, salt);
}

std::vector<DisaggRequest> requests() {
  std::vector<DisaggRequest> r;
  const std::int32_t lens[] = {5, 17, 150, 8, 64, 33};  // 150: three prefill chunks
  for (std::int32_t i = 0; i < 6; ++i) {
    SamplingParams p;
    p.max_tokens = 6 + 3 * i;
    p.ignore_eos = true;
    if (i == 4) {  // sampled: equal too, as the seed is fixed
      p.temperature = 0.9f;
      p.top_k = 40;
      p.seed = 1234;
    }
    r.push_back({prompt(lens[i], i), p});
  }
  return r;
}

// The same requests through one engine: every output token of each.
std::vector<Tokens> single_instance(const EngineConfig& c, const std::vector<DisaggRequest>& reqs) {
  Engine engine(c);
  std::map<RequestId, std::size_t> index;
  for (std::size_t i = 0; i < reqs.size(); ++i)
    index[engine.add_request(reqs[i].prompt, reqs[i].params)] = i;
  std::vector<Tokens> out(reqs.size());
  while (engine.has_unfinished())
    for (const RequestOutput& o : engine.step())
      for (const SampleOutput& s : o.samples)
        out[index[o.request_id]].insert(out[index[o.request_id]].end(), s.new_token_ids.begin(),
                                        s.new_token_ids.end());
  return out;
}

// Runs both roles; on the decode rank returns its report (empty on rank 0).
DecodeReport run_both(const EngineConfig& prefill_config, const EngineConfig& decode_config,
                      const std::vector<DisaggRequest>& reqs, const PrefillHooks& ph = {},
                      const DecodeHooks& dh = {}) {
  const MpiComm world = MpiComm::world();
  if (world.rank() == kPrefillRank) {
    const TransferStats s = run_prefill(world, kDecodeRank, prefill_config, reqs, ph);
    EXPECT_EQ(s.pages_left, 0) << "the prefill rank leaked pages";
    return {};
  }
  if (world.rank() == kDecodeRank) {
    DecodeReport r = run_decode(world, kPrefillRank, decode_config, dh);
    EXPECT_EQ(r.transfer.pages_left, 0) << "the decode rank leaked pages";
    return r;
  }
  return {};
}

class DisaggGeneration : public ::testing::TestWithParam<DType> {};

TEST_P(DisaggGeneration, EqualsSingleInstanceGeneration) {
  const EngineConfig c = config(GetParam());
  const std::vector<DisaggRequest> reqs = requests();
  const DecodeReport r = run_both(c, c, reqs);
  if (MpiComm::world().rank() != kDecodeRank) return;
  const std::vector<Tokens> expected = single_instance(c, reqs);
  ASSERT_EQ(r.results.size(), reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(r.results[i].tokens, expected[i]) << "request " << i;
    EXPECT_EQ(r.results[i].finish, FinishReason::kLength) << "request " << i;
  }
  EXPECT_EQ(r.transfer.transfers, 6);
  EXPECT_EQ(r.transfer.cancelled, 0);
  EXPECT_GT(r.transfer.bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(KVDTypes, DisaggGeneration, ::testing::Values(DType::kF16, DType::kINT8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Disagg, ADecodeCacheTooSmallForEverythingStillGivesTheSameOutput) {
  const EngineConfig prefill = config(DType::kF16);
  // Each request fills the decode rank's 24 pages (13 for the prompt, 11
  // while it decodes): an offer made while another request runs is refused
  // and retried until that one finishes (whether that happens depends on
  // timing; Engine.ReserveImport* in the engine tests covers the refusal).
  EngineConfig decode = config(DType::kF16);
  decode.kv_memory_bytes = 24 * PagedKVCache(engine_cache_config(prefill)).bytes_per_page();
  std::vector<DisaggRequest> reqs;
  for (std::int32_t i = 0; i < 3; ++i)
    reqs.push_back({prompt(100, i), {.max_tokens = 88, .ignore_eos = true}});
  const DecodeReport r = run_both(prefill, decode, reqs);
  if (MpiComm::world().rank() != kDecodeRank) return;
  const std::vector<Tokens> expected = single_instance(prefill, reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(r.results[i].tokens, expected[i]) << i;
  RecordProperty("retries", static_cast<int>(r.transfer.retries));
}

TEST(Disagg, CancelledAbortedAndRejectedTransfersLeakNoPageOnEitherRank) {
  const EngineConfig c = config(DType::kINT8);
  std::vector<DisaggRequest> reqs = requests();
  reqs[3].params.max_tokens = 5000;  // beyond max_position: the decode rank rejects it
  PrefillHooks ph;
  ph.cancel_after_ack = [](std::int64_t index) { return index == 1; };
  DecodeHooks dh;
  dh.abort_during_transfer = [](std::int64_t index) { return index == 2 || index == 5; };
  const DecodeReport r = run_both(c, c, reqs, ph, dh);
  if (MpiComm::world().rank() != kDecodeRank) return;
  const std::vector<Tokens> expected = single_instance(c, {reqs[0], reqs[4]});
  EXPECT_EQ(r.results[0].tokens, expected[0]);
  EXPECT_EQ(r.results[4].tokens, expected[1]);
  for (std::size_t i : {1u, 2u, 5u}) {
    EXPECT_TRUE(r.results[i].tokens.empty()) << i;
    EXPECT_EQ(r.results[i].finish, FinishReason::kAborted) << i;
  }
  EXPECT_NE(r.results[3].error.find("max_position"), std::string::npos) << r.results[3].error;
  EXPECT_EQ(r.transfer.cancelled, 3);
  EXPECT_EQ(r.transfer.transfers, 4);  // aborted ones arrived, then were dropped
}

TEST(Disagg, MismatchedConfigurationsFailOnBothRanks) {
  const MpiComm world = MpiComm::world();
  EngineConfig c = config(DType::kF16);
  if (world.rank() == kDecodeRank) {
    c.page_size = 16;
    c.model = test_model(3);  // another model: one more layer
  }
  try {
    run_both(c, c, requests());
    ADD_FAILURE() << "rank " << world.rank() << " did not notice the mismatch";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("page_size is '"), std::string::npos) << what;
    EXPECT_NE(what.find("num_layers is '"), std::string::npos) << what;
    EXPECT_EQ(what.find("kv_dtype"), std::string::npos) << what;  // only what differs
  }
}

using test::FailingModel;

TEST(Disagg, APrefillFailureStopsBothRanksWithItsMessage) {
  const MpiComm world = MpiComm::world();
  EngineConfig c = config(DType::kF16);
  if (world.rank() == kPrefillRank) c.model = std::make_shared<FailingModel>(c.model, 17);
  try {
    run_both(c, c, requests());  // requests()[1] has 17 prompt tokens
    ADD_FAILURE() << "rank " << world.rank() << " did not stop";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("injected model failure"), std::string::npos) << e.what();
    if (world.rank() == kDecodeRank) {
      EXPECT_NE(std::string(e.what()).find("the prefill rank failed"), std::string::npos)
          << e.what();
    }
  }
}

// SmolLM2-135M (PAGEDATTN_TEST_MODEL): the real model's greedy text is the
// same disaggregated, f16 and int8.
TEST(DisaggRealModel, SmolLM2GreedyEqualsSingleInstance) {
  const char* path = std::getenv("PAGEDATTN_TEST_MODEL");
  if (path == nullptr)
    GTEST_SKIP() << "PAGEDATTN_TEST_MODEL is not set (scripts/get_test_model.sh)";
  const std::shared_ptr<Model> model = make_gguf_model(path, {.max_position = 1024});
  for (DType dtype : {DType::kF16, DType::kINT8}) {
    EngineConfig c;
    c.model = model;
    c.kv_dtype = dtype;
    c.kv_memory_bytes = 64 << 20;
    c.deterministic = true;
    std::vector<DisaggRequest> reqs;
    for (std::int32_t i = 0; i < 2; ++i) {
      Tokens p = prompt(24 + 60 * i, i);
      for (std::int32_t& t : p) t = 1000 + t * 17;  // ordinary vocabulary ids
      reqs.push_back({p, {.max_tokens = 8, .ignore_eos = true}});
    }
    const DecodeReport r = run_both(c, c, reqs);
    if (MpiComm::world().rank() != kDecodeRank) continue;
    const std::vector<Tokens> expected = single_instance(c, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(r.results[i].tokens, expected[i]) << dtype_name(dtype) << " request " << i;
  }
}

}  // namespace
}  // namespace pagedattn::dist
