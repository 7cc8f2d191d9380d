// The C and C++ code blocks of README.md and docs/*.md, compiled and run.
//
// Each block is copied verbatim between `// doc-snippet: FILE#N` and
// `// end doc-snippet` (N counts the ```cpp and ```c blocks of FILE from 1);
// the ctest doc_snippets_match_docs (check_doc_snippets.cmake) fails when a
// block and its region differ, so a doc edit needs the same edit here.
// The code around a region supplies what the docs leave to the reader
// (buffers, a consume function, the prompt) and checks what it did. The
// headers are included here first, so a snippet's own #include lines expand
// to nothing inside the function bodies (#pragma once / include guards).
// Regions start at column 0 between clang-format off/on, as in the docs.
// docs/ops.md#1 (C) is in doc_snippets.c.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "pagedattn/pagedattn.h"

#ifdef PAGEDATTN_HAVE_MPI
#include <cstdlib>

#include "pagedattn/distributed/disagg.h"
#include "pagedattn/distributed/tensor_parallel.h"
#endif

extern "C" int doc_snippet_ops_md_1(void);  // doc_snippets.c

namespace {

// README.md#2 continues README.md#1's cache (32 layers, 32 query and 8 KV
// heads of 128, f16) with its own step over `lens` new tokens.
void readme_attention_step(pagedattn::PagedKVCache& kv, const std::vector<pagedattn::SeqId>& ids,
                           const std::vector<std::int64_t>& lens) {
  std::int64_t tokens = 0;
  for (std::int64_t len : lens) tokens += len;
  std::vector<std::uint16_t> q_rows(tokens * 32 * 128, 0x3c00);  // f16 1.0
  std::vector<std::uint16_t> k_rows(tokens * 8 * 128, 0x3c00);
  std::vector<std::uint16_t> v_rows(tokens * 8 * 128, 0x3800);  // f16 0.5
  std::vector<std::uint16_t> out_rows(tokens * 32 * 128, 0);
  void* q = q_rows.data();
  void* k = k_rows.data();
  void* v = v_rows.data();
  void* out = out_rows.data();
  // clang-format off
// doc-snippet: README.md#2
const pagedattn::BatchPlan& plan = kv.begin_forward(ids, lens);
const int T = plan.num_tokens();          // q: [T][32][128], k, v: [T][8][128]
for (int layer = 0; layer < 32; ++layer)
  kv.attention(layer, {q, pagedattn::DType::kF16, 32 * 128, 128},
               {k, pagedattn::DType::kF16, 8 * 128, 128},
               {v, pagedattn::DType::kF16, 8 * 128, 128},
               {out, pagedattn::DType::kF16, 32 * 128, 128});
kv.end_forward();
// end doc-snippet
  // clang-format on
  EXPECT_EQ(T, tokens);
  // Every output is a softmax average of the V rows: the prefill's (never
  // written here: zero pages) and the new token's 0.5, weighted up.
  for (std::uint16_t x : out_rows) ASSERT_TRUE(x > 0 && x <= 0x3800) << x;
}

}  // namespace

// The cache: a 512-token prefill step, a fork, then a decode step with attention.
TEST(DocSnippets, ReadmeCacheAndAttention) {
// clang-format off
// doc-snippet: README.md#1
#include <pagedattn/pagedattn.h>

pagedattn::KVCacheConfig config;          // named fields, validated
config.num_layers = 32;
config.num_qo_heads = 32;
config.num_kv_heads = 8;
config.head_dim = 128;
config.page_size = 16;
config.kv_dtype = pagedattn::DType::kF16;
config.memory_budget_bytes = 4ll << 30;   // or num_pages
pagedattn::PagedKVCache kv(config);

kv.add_sequence(7);
std::vector<pagedattn::SeqId> ids = {7};
std::vector<std::int64_t> lens = {512};   // prefill 512 tokens
const pagedattn::BatchPlan& plan = kv.begin_forward(ids, lens);
for (int layer = 0; layer < config.num_layers; ++layer) {
  // your kernels: write the new K/V into kv.layer_storage(layer) at
  // plan.slot_mapping, attend over plan.table(), then say so:
  kv.mark_layer_appended(layer);          // end_forward refuses unwritten layers
}
kv.end_forward();
kv.fork_sequence(7, 8);                   // parallel sample shares the prompt
// end doc-snippet
  // clang-format on
  (void)plan;
  EXPECT_EQ(kv.sequence_length(7), 512);
  EXPECT_EQ(kv.sequence_length(8), 512);
  lens = {1};  // README.md#2: decode one token of sequence 7
  readme_attention_step(kv, ids, lens);
  EXPECT_EQ(kv.sequence_length(7), 513);
}

TEST(DocSnippets, ReadmeEngine) {
  std::int64_t tokens = 0;
  auto consume = [&](std::int32_t index, const std::vector<std::int32_t>& new_token_ids,
                     pagedattn::FinishReason) {
    EXPECT_TRUE(index == 0 || index == 1);
    tokens += std::ssize(new_token_ids);
  };
// clang-format off
// doc-snippet: README.md#3
#include <pagedattn/engine.h>
#include <pagedattn/llama.h>

pagedattn::EngineConfig config;
config.model = pagedattn::make_llama_model(pagedattn::llama_preset("tiny"));  // or your Model
config.kv_memory_bytes = 256ll << 20;     // pages are derived from the budget
config.max_num_batched_tokens = 2048;     // tokens per step
config.deterministic = true;              // tokens independent of batch mates
config.enable_prefix_caching = true;      // reuse K/V of earlier prompts' pages
pagedattn::Engine engine(config);

std::vector<std::int32_t> prompt = {1, 15, 27, 99};
pagedattn::RequestId id = engine.add_request(
    prompt, {.max_tokens = 64, .temperature = 0.8f, .top_p = 0.95f, .n = 2, .seed = 7});
while (engine.has_unfinished())
  for (const pagedattn::RequestOutput& out : engine.step())   // one iteration
    for (const pagedattn::SampleOutput& s : out.samples)      // new tokens per sample
      if (out.request_id == id) consume(s.index, s.new_token_ids, s.finish_reason);
// end doc-snippet
  // clang-format on
  EXPECT_GT(tokens, 0);
  EXPECT_LE(tokens, 2 * 64);
}

TEST(DocSnippets, EngineMdPrefixCaching) {
  const std::vector<std::int32_t> system_prompt_and_question(40, 11);
  const std::uint64_t tenant_id = 3;
  // clang-format off
// doc-snippet: docs/engine.md#1
pagedattn::EngineConfig config;
config.model = pagedattn::make_llama_model(pagedattn::llama_preset("tiny"));
config.enable_prefix_caching = true;
config.host_kv_memory_bytes = 512ll << 20;  // swap space in host memory
pagedattn::Engine engine(config);
engine.add_request(system_prompt_and_question, {.max_tokens = 64, .cache_salt = tenant_id});
// end doc-snippet
  // clang-format on
  std::int64_t steps = 0;
  while (engine.has_unfinished() && steps < 1000) {
    engine.step();
    ++steps;
  }
  EXPECT_FALSE(engine.has_unfinished());
}

TEST(DocSnippets, OpsMdCApi) {
  EXPECT_EQ(doc_snippet_ops_md_1(), 0);
}

TEST(DocSnippets, PrefixCachingMd) {
// clang-format off
// doc-snippet: docs/prefix_caching.md#1
#include <vector>
#include "pagedattn/kv_cache.h"

using namespace pagedattn;

KVCacheConfig c;
c.num_layers = 2;
c.num_qo_heads = 4;
c.num_kv_heads = 2;
c.head_dim = 64;
c.page_size = 16;
c.num_pages = 256;
c.enable_prefix_caching = true;
c.host_num_pages = 512;  // optional host tier (or host_memory_budget_bytes)
PagedKVCache cache(c);

std::vector<std::int32_t> prompt(40, 7);  // token ids from the tokenizer
// 1. Admission: how much would the cache supply, and at what page cost?
PrefixMatch m = cache.match_prefix(prompt, /*cache_salt=*/0);
if (m.pages_taken <= cache.num_free_pages()) {
  // 2. Add the sequence holding the cached prefix (m.num_tokens tokens).
  std::int64_t held = cache.add_sequence_with_prefix(1, prompt);
  // 3. Compute the rest as usual: begin_forward(ids, {prompt.size() - held}),
  //    attention per layer, end_forward - then tell the cache the token ids
  //    so that its full pages are published (after every decode step too,
  //    with the generated tokens appended).
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {std::ssize(prompt) - held};
  cache.begin_forward(ids, lens);
  // ... cache.attention(layer, q, k, v, out) for every layer ...
  for (std::int32_t l = 0; l < c.num_layers; ++l) cache.mark_layer_appended(l);
  cache.end_forward();
  cache.set_sequence_tokens(1, prompt);
}
// 4. When the request finishes its full pages stay cached (evictable).
cache.remove_sequence(1);
PrefixCacheStats s = cache.prefix_cache_stats();  // hit_tokens / query_tokens
// end doc-snippet
  // clang-format on
  EXPECT_EQ(s.queries, 1);
  EXPECT_GE(s.query_tokens, 40);
  EXPECT_EQ(cache.num_sequences(), 0);
  EXPECT_EQ(cache.num_cached_pages(), 2);  // the 40-token prompt's two full pages
  EXPECT_EQ(cache.match_prefix(prompt).num_tokens, 32);
}

#ifdef PAGEDATTN_HAVE_MPI
// MPI: these tests are left out of the per-test ctests (TEST_FILTER) and run
// by tests/docs/CMakeLists.txt under mpirun, one per process (MPI starts once).
namespace {

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

}  // namespace

// Runs on 2 ranks (rank 0 prefills, rank 1 decodes; 1 rank is not valid).
TEST(DocSnippetsMpi, Disaggregation) {
  if (!under_mpirun()) GTEST_SKIP() << "runs under mpirun -np 2";
  int argc = 1;
  char name[] = "doc_snippets";
  char* args[] = {name, nullptr};
  char** argv = args;
  pagedattn::EngineConfig config;
  config.model = pagedattn::make_llama_model(pagedattn::llama_preset("tiny"));
  config.kv_memory_bytes = 64ll << 20;
  std::vector<pagedattn::dist::DisaggRequest> requests(2);
  requests[0].prompt = {1, 2, 3, 4};
  requests[0].params.max_tokens = 4;
  requests[1].prompt = {5, 6, 7};
  requests[1].params.max_tokens = 3;
  // clang-format off
// doc-snippet: docs/disaggregation.md#1
pagedattn::dist::MpiSession session(&argc, &argv);
const auto world = pagedattn::dist::MpiComm::world();
if (world.rank() == 0) {
  pagedattn::dist::run_prefill(world, /*decode_rank=*/1, config, requests);
} else {
  auto report = pagedattn::dist::run_decode(world, /*prefill_rank=*/0, config);
  // report.results[i].tokens: every output token of request i
}
// end doc-snippet
  // clang-format on
}

// Runs on 2 ranks: rank 0 leads an engine, rank 1 follows it.
TEST(DocSnippetsMpi, TensorParallel) {
  if (!under_mpirun()) GTEST_SKIP() << "runs under mpirun -np 2";
  int argc = 1;
  char name[] = "doc_snippets";
  char* args[] = {name, nullptr};
  char** argv = args;
// clang-format off
// doc-snippet: docs/tensor_parallel.md#1
#include "pagedattn/distributed/tensor_parallel.h"   // target pagedattn::dist

using namespace pagedattn;

dist::MpiSession session(&argc, &argv);
const dist::MpiComm world = dist::MpiComm::world();
LlamaConfig config = llama_preset("small");
config.shard = dist::mpi_shard(world);               // rank, size, MPI_Allreduce
dist::require_same_model(world, dist::model_fingerprint(config));
std::unique_ptr<Model> shard = make_llama_model(config);   // or make_gguf_model(path, {.shard = ...})
if (world.rank() == 0) {
  auto leader = std::make_shared<dist::TensorParallelLeader>(world, std::move(shard));
  {
    Engine engine({.model = leader});
    // add_request / step as usual
  }
  leader->shutdown();
} else {
  dist::run_tensor_parallel_follower(world, *shard);
}
// end doc-snippet
  // clang-format on
}
#endif
