// The engine shared by threads: requests added and queried from other
// threads while one thread steps (an HTTP server's shape), and a model that
// throws half way through a step.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {
namespace engine_threads_test {  // this file's own names in a unity batch

using Tokens = std::vector<std::int32_t>;

std::shared_ptr<Model> small_model() {
  static std::shared_ptr<Model> model = [] {
    LlamaConfig c = llama_preset("tiny");
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_layers = 2;
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 200;
    return std::shared_ptr<Model>(make_llama_model(c));
  }();
  return model;
}

EngineConfig config(std::shared_ptr<Model> model) {
  EngineConfig c;
  c.model = std::move(model);
  c.kv_memory_bytes = 4 << 20;
  c.page_size = 8;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 48;
  c.deterministic = true;  // a request's tokens do not depend on its batch mates
  return c;
}

Tokens prompt_of(std::int32_t job) {
  Tokens t(static_cast<std::size_t>(3 + job % 11));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>((i * 31 + job * 17 + 5) % 200);
  return t;
}

SamplingParams params_of(std::int32_t job) {
  SamplingParams p;
  p.max_tokens = 3 + job % 5;
  p.ignore_eos = true;
  return p;  // greedy: the request id (and so the adding order) does not matter
}

Tokens solo_tokens(std::int32_t job) {
  Engine engine(config(small_model()));
  engine.add_request(prompt_of(job), params_of(job));
  Tokens out;
  while (engine.has_unfinished())
    for (const RequestOutput& r : engine.step())
      out.insert(out.end(), r.samples[0].new_token_ids.begin(), r.samples[0].new_token_ids.end());
  return out;
}

TEST(EngineThreads, RequestsAddedFromOtherThreadsWhileOneThreadSteps) {
  constexpr std::int32_t kJobs = 18, kAdders = 3;
  Engine engine(config(small_model()));
  std::mutex ids_mutex;
  std::map<RequestId, std::int32_t> job_of;
  std::atomic<int> adders_done{0};
  std::atomic<bool> stepping_done{false};
  std::map<RequestId, Tokens> produced;  // only the stepping thread writes
  std::thread stepper([&] {
    while (adders_done < kAdders || engine.has_unfinished())
      for (const RequestOutput& r : engine.step()) {
        Tokens& t = produced[r.request_id];
        t.insert(t.end(), r.samples[0].new_token_ids.begin(), r.samples[0].new_token_ids.end());
      }
    stepping_done = true;
  });
  std::thread watcher([&] {  // queries race with the steps
    while (!stepping_done) {
      const EngineStats s = engine.stats();
      EXPECT_LE(s.pages_in_use, s.num_pages);
      (void)engine.has_unfinished();
    }
  });
  std::vector<std::thread> adders;
  for (std::int32_t a = 0; a < kAdders; ++a)
    adders.emplace_back([&, a] {
      for (std::int32_t job = a; job < kJobs; job += kAdders) {
        const RequestId id = engine.add_request(prompt_of(job), params_of(job));
        const std::lock_guard lock(ids_mutex);
        job_of[id] = job;
      }
      ++adders_done;
    });
  for (std::thread& t : adders) t.join();
  stepper.join();
  watcher.join();
  ASSERT_EQ(job_of.size(), std::size_t{kJobs});
  for (const auto& [id, job] : job_of) EXPECT_EQ(produced[id], solo_tokens(job)) << "job " << job;
  EXPECT_TRUE(engine.cache().empty());
  engine.cache().check_invariants();
}

TEST(EngineThreads, AbortFromAnotherThreadReturnsThePages) {
  Engine engine(config(small_model()));
  SamplingParams long_run = params_of(0);
  long_run.max_tokens = 40;
  const RequestId id = engine.add_request(prompt_of(0), long_run);
  engine.step();
  std::thread([&] { engine.abort(id); }).join();
  bool reported = false;
  while (engine.has_unfinished())
    for (const RequestOutput& r : engine.step())
      reported |= r.request_id == id && r.samples[0].finish_reason == FinishReason::kAborted;
  EXPECT_TRUE(reported);
  EXPECT_TRUE(engine.cache().empty());
}

// Delegates to the real model but throws after `layers_before_throw` layers
// of its `fail_at`-th forward: the cache has a half-appended step.
class FailingModel : public Model {
 public:
  explicit FailingModel(std::shared_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    if (++calls_ == fail_at) {
      // Append layer 0 like a model would, then fail.
      const ModelSpec& s = spec();
      const auto tokens = static_cast<std::size_t>(cache.num_step_tokens());
      std::vector<float> q(tokens * s.num_qo_heads * s.head_dim, 0.5f);
      std::vector<float> kv(tokens * s.num_kv_heads * s.head_dim, 0.5f), out(q.size());
      const std::int64_t qs = std::int64_t{s.num_qo_heads} * s.head_dim;
      const std::int64_t ks = std::int64_t{s.num_kv_heads} * s.head_dim;
      cache.attention(
          0, {q.data(), DType::kF32, qs, s.head_dim}, {kv.data(), DType::kF32, ks, s.head_dim},
          {kv.data(), DType::kF32, ks, s.head_dim}, {out.data(), DType::kF32, qs, s.head_dim});
      throw std::runtime_error("model failed half way");
    }
    inner_->forward(batch, cache, logits);
  }
  int fail_at = 0;

 private:
  std::shared_ptr<Model> inner_;
  int calls_ = 0;
};

TEST(EngineThreads, AModelThatThrowsCancelsTheStep) {
  auto failing = std::make_shared<FailingModel>(small_model());
  failing->fail_at = 3;
  Engine engine(config(failing));
  engine.add_request(prompt_of(4), params_of(4));
  engine.step();
  engine.step();
  const std::uint64_t before = engine.cache().state_digest();
  EXPECT_THROW(engine.step(), std::runtime_error);
  EXPECT_FALSE(engine.cache().in_forward());
  EXPECT_EQ(engine.cache().state_digest(), before);  // exactly as before the step
  engine.cache().check_invariants();
  while (engine.has_unfinished()) engine.step();  // and it goes on
  EXPECT_TRUE(engine.cache().empty());
}

// The small model's logits in a row of kWideVocab, the tokens past its
// vocabulary far below the rest (never drawn, but read by every draw): rows
// long enough that a step's sampling rows are drawn over the threads.
class WideVocabModel final : public Model {
 public:
  static constexpr std::int32_t kWideVocab = 20000;
  explicit WideVocabModel(std::shared_ptr<Model> inner) : inner_(std::move(inner)) {
    spec_ = inner_->spec();
    spec_.vocab_size = kWideVocab;
  }
  const ModelSpec& spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    const std::size_t inner_vocab = std::size_t(inner_->spec().vocab_size);
    const std::size_t rows = batch.logit_rows.size();
    std::vector<float> narrow(rows * inner_vocab);
    inner_->forward(batch, cache, narrow);
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * std::size_t(kWideVocab);
      std::copy_n(narrow.data() + r * inner_vocab, inner_vocab, row);
      std::fill(row + inner_vocab, row + kWideVocab, -1e30f);
    }
  }

 private:
  std::shared_ptr<Model> inner_;
  ModelSpec spec_;
};

// Every sampled token (temperature, top-p, per-request seeds) is the same
// whether a step's rows are drawn on one thread or over several: each draw
// is seeded by its request, sample and position alone.
TEST(EngineThreads, SampledTokensDoNotDependOnTheThreadsThatDrawThem) {
  const auto model = std::make_shared<WideVocabModel>(small_model());
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::map<RequestId, Tokens> out;
    {
      Engine engine(config(model));
      for (std::int32_t job = 0; job < 8; ++job) {
        SamplingParams p = params_of(job);
        p.temperature = 0.9f;
        p.top_p = 0.95f;
        p.seed = 77 + job;
        engine.add_request(prompt_of(job), p);
      }
      while (engine.has_unfinished())
        for (const RequestOutput& r : engine.step())
          for (const SampleOutput& s : r.samples)
            out[r.request_id].insert(out[r.request_id].end(), s.new_token_ids.begin(),
                                     s.new_token_ids.end());
    }
    omp_set_num_threads(before);
    return out;
  };
  const auto one = run(1);
  EXPECT_EQ(one.size(), 8u);
  EXPECT_EQ(run(4), one);
}

// Threads of this process now (Linux: /proc/self/task).
std::int64_t process_threads() {
  std::int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// Threads the process gains while `make` runs on a fresh thread with 3
// OpenMP threads, counted before that thread exits.
template <class Make>
std::int64_t threads_gained_by(const Make& make) {
  std::int64_t before = 0, after = 0;
  std::thread maker([&] {
    omp_set_num_threads(3);
    before = process_threads();
    const auto made = make();
    // A helper thread's own team may take a moment to wind down.
    for (int i = 0; i < 200 && (after = process_threads()) > before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  maker.join();
  return after - before;
}

bool per_thread_teams() {
  // LLVM's runtime (the sanitizer build's) keeps one pool of workers for the
  // whole process, which outlive the thread that started them by design.
  return dlsym(RTLD_DEFAULT, "kmp_get_blocktime") == nullptr;
}

// A server loads its model and makes its engine on one thread and steps it
// on another. Had the loading or the constructor's parallel work (drawing
// preset weights, touching the K/V pool, timing the product paths) run on
// the making thread, that thread would keep an idle OpenMP team for good,
// and libgomp, managing more threads than CPUs, would cut the stepping
// threads' spinning between regions (one stream through `serve` ran at half
// speed). The maker gains no threads.
TEST(EngineThreads, MakingAModelAndEngineLeavesNoOpenMpTeamOnTheMakingThread) {
  if (!std::filesystem::exists("/proc/self/task")) GTEST_SKIP() << "no /proc/self/task";
  if (!per_thread_teams()) GTEST_SKIP() << "LLVM's OpenMP runtime: teams per thread are libgomp's";
  EXPECT_EQ(threads_gained_by([] { return std::make_unique<Engine>(config(small_model())); }), 0);
  LlamaConfig c = llama_preset("tiny");  // matrices above the parallel drawing size
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_layers = 1;
  EXPECT_EQ(threads_gained_by([&] { return make_llama_model(c); }), 0);
}

}  // namespace engine_threads_test
}  // namespace
}  // namespace pagedattn
