// Engine: continuous batching over one PagedKVCache. Requests are added at
// any time; every step() runs one iteration over a mixed ragged batch -
// running decodes first, then prefill chunks, admitting waiting requests FCFS
// while pages allow, preempting the most recently admitted requests when a
// running sequence cannot get a page (by swap to a host-memory tier or by
// recompute, whichever a measured cost estimate finds cheaper).
//
// Automatic prefix caching (EngineConfig.enable_prefix_caching): full pages
// of every prompt and output are published under a hash of their tokens
// (and the request's cache_salt); a new request whose prompt starts with
// published pages takes them instead of computing them (at least its last
// token always runs: its logits give the first output token). Finished
// requests' pages stay cached until the pool needs them (LRU).
//
//   Engine engine({.model = make_llama_model(llama_preset("tiny"))});
//   RequestId id = engine.add_request(prompt, {.max_tokens = 64});
//   while (engine.has_unfinished()) for (auto& out : engine.step()) ...
//
// Threading: every method may be called from any thread. add_request never
// waits for a running step (it queues the request; the next step admits
// it), so a server can take requests on other threads while one thread
// loops on step(). step() calls serialize; abort, has_unfinished, stats and
// set_stream_callback wait for a running step to finish. The stream callback
// runs on the stepping thread after the step released the engine, so it may
// call add_request, abort or the queries. If the model throws, the step is
// cancelled (the cache returns to its state before the step) and step()
// rethrows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"

namespace pagedattn {

using RequestId = std::int64_t;

// Log-probabilities (natural log) of one token position under the model's
// raw distribution: the log-softmax of its logits before bias, penalties,
// temperature and truncation (vLLM's default "raw_logprobs").
struct TokenLogprobs {
  std::int32_t token = 0;  // the token that came (sampled, or the prompt's)
  float logprob = 0.0f;    // of `token`
  std::int32_t rank = 0;   // of `token`: 1 + the number of tokens with a larger logprob
  // The `k` most likely tokens (SamplingParams::logprobs or prompt_logprobs),
  // most likely first, the lower id first on ties: (token, logprob).
  std::vector<std::pair<std::int32_t, float>> top{};
};

// SamplingParams::logprobs and prompt_logprobs: at most this many top tokens
// (vLLM's default max_logprobs; OpenAI's chat allows as many).
inline constexpr std::int32_t kMaxLogprobs = 20;

// How a request samples; vLLM's SamplingParams and their semantics.
// Engine::add_request validates every field (InvalidArgument naming it).
// Per step, each sample's logits go through: logit_bias, min_tokens (EOS and
// stop_token_ids masked), repetition / frequency / presence penalties, then
// greedy argmax (temperature 0) or temperature, min_p, top_k and top_p.
struct SamplingParams {
  std::int32_t max_tokens = 16;         // new tokens per sample, >= 1
  float temperature = 0.0f;             // 0: greedy (argmax, lowest token id on ties)
  std::int32_t top_k = 0;               // 0: all tokens
  float top_p = 1.0f;                   // (0, 1]: smallest set whose probability reaches top_p
  std::int32_t n = 1;                   // parallel samples sharing the prompt's pages, [1, 256]
  std::optional<std::uint64_t> seed{};  // none: derived from EngineConfig.seed and the request id
  std::vector<std::int32_t> stop_token_ids{};
  bool ignore_eos = false;
  // Prefix caching: requests share cached pages only with requests of the
  // same salt (tenant isolation; 0 is the shared default).
  std::uint64_t cache_salt = 0;
  // > 0; 1 = off. Tokens in the prompt or the sample's output so far: a
  // positive logit is divided by it, a negative one multiplied (CTRL's rule).
  float repetition_penalty = 1.0f;
  // [-2, 2]: subtracted once from the logit of every token the sample has
  // output so far (OpenAI's presence penalty).
  float presence_penalty = 0.0f;
  // [-2, 2]: subtracted from a token's logit once per time the sample has
  // output it so far.
  float frequency_penalty = 0.0f;
  // [0, 1]: after temperature, tokens less likely than min_p x the most
  // likely token's probability are dropped. 0 = off.
  float min_p = 0.0f;
  // [0, max_tokens]: EOS (unless ignore_eos) and stop_token_ids cannot be
  // sampled before the sample has this many new tokens.
  std::int32_t min_tokens = 0;
  // (token, bias) added to the token's logit first; bias in [-100, 100],
  // each token at most once.
  std::vector<std::pair<std::int32_t, float>> logit_bias{};
  // [0, kMaxLogprobs]: report each new token's TokenLogprobs with this many most likely
  // tokens (SampleOutput::logprobs). None: not reported.
  std::optional<std::int32_t> logprobs{};
  // [0, kMaxLogprobs]: the same for prompt tokens 1.. (RequestOutput::prompt_logprobs).
  // The request then computes its whole prompt: it takes no cached prefix.
  std::optional<std::int32_t> prompt_logprobs{};
  // Text that ends a sample where it appears in the output (never part of it
  // unless include_stop_str_in_output). The engine works on tokens and does
  // not read these: the layers that turn tokens into text apply them
  // (Python's LLM, the server).
  std::vector<std::string> stop{};
  bool include_stop_str_in_output = false;
};

// InvalidArgument naming the field and its value for sampling parameters no
// engine accepts (ranges above, logit_bias duplicates, empty stop strings).
// Engine::add_request checks these too, and what depends on the model (token
// ids against the vocabulary, lengths against the context).
void check_sampling_params(const SamplingParams& params);

// kError: the model's logits for the request held a NaN or an infinity (its
// weights or activations are broken); RequestOutput.error says where. The
// request ends there - no token is drawn from such a row - and its pages are
// freed; other requests of the batch carry on.
enum class FinishReason : std::uint8_t { kNone = 0, kLength, kStop, kAborted, kError };
// "none", "length", "stop", "abort", "error" (the OpenAI server's and vLLM's names).
const char* finish_reason_name(FinishReason reason);

struct SampleOutput {
  std::int32_t index = 0;                   // sample index in [0, n)
  std::vector<std::int32_t> new_token_ids;  // tokens produced this step
  FinishReason finish_reason = FinishReason::kNone;
  // With SamplingParams::logprobs: one per new token, in order.
  std::vector<TokenLogprobs> logprobs{};
};

// One request's progress in one step (only requests with news are reported).
struct RequestOutput {
  RequestId request_id = 0;
  std::vector<SampleOutput> samples;
  bool finished = false;  // every sample has finished (or the request was aborted)
  // Set with FinishReason::kError (every unfinished sample ends with it):
  // names the request, the engine step, the output token and how many
  // logits were NaN and infinite.
  std::string error;
  // With SamplingParams::prompt_logprobs: entry i is prompt token i + 1's
  // (the first token has no context), all of them in the request's first
  // output that carries tokens; empty in later outputs.
  std::vector<TokenLogprobs> prompt_logprobs{};
};

struct EngineConfig {
  std::shared_ptr<Model> model{};              // required
  std::int64_t kv_memory_bytes = 256ll << 20;  // K+V pages of every layer; pages derived from it
  std::int32_t page_size = 16;
  DType kv_dtype = DType::kF16;
  std::int32_t max_num_seqs = 256;             // running sequences (samples) at once
  std::int32_t max_num_batched_tokens = 2048;  // tokens per step, >= max_num_seqs
  bool chunked_prefill = true;                 // split prompts across steps to fill the budget
  // Results of a request independent of what is batched with it: fixed KV
  // split sizes and one summation order for every row in attention (its
  // prefill tiles are not used), and fixed row blocks in matrix products.
  bool deterministic = false;
  std::uint64_t seed = 0;
  // Reuse published pages of earlier prompts and outputs (see above). Off by
  // default: outputs are unchanged with it only where results do not depend
  // on batch shape (deterministic mode); otherwise skipping a prefix changes
  // the prefill's row blocks and may flip a near-tie greedy choice.
  bool enable_prefix_caching = false;
  // Host-memory tier (0: none): preempted requests' pages are swapped to it
  // when that is estimated cheaper than recomputing them, and cached prefix
  // pages evicted from the device pool are demoted to it.
  std::int64_t host_kv_memory_bytes = 0;
  // Attention on bf16 dot products where the CPU has AVX512-BF16
  // (AttentionPlanOptions::bf16_products: prefill, and decode over f16,
  // bf16 and fp8 KV): queries, softmax weights and f16 K/V rounded to bf16,
  // up to a few percent of a row's largest output, for about twice the
  // multiply rate. Also the weight products of batches of
  // more than 8 rows (ForwardBatch::bf16_products: the activations and the
  // dequantised weights rounded to bf16). Off: exact f32 products.
  // Deterministic mode keeps f32.
  bool bf16_products = false;
  // int8 KV decode on AVX512-VNNI dot products where the CPU has them
  // (AttentionPlanOptions::int8_products): queries rounded to int8 per row,
  // softmax weights to u8 per block; about 2% of a row's largest output at
  // the default scale. Off: exact f32 products. Deterministic mode keeps f32.
  bool int8_products = false;
  // fp8 e4m3 and f16 KV decode on AVX512-FP16 multiply-adds where the CPU
  // has them (AttentionPlanOptions::f16_products: Intel Xeon from Sapphire
  // Rapids on): queries and softmax weights rounded to f16, short f16 sums;
  // under 1% of a row's largest output. Off: exact f32 products.
  // Deterministic mode keeps f32.
  bool f16_products = false;
  // f32 products in every step. Off (the default), three fast paths are
  // taken where a one-time timing finds them faster on this CPU: prefill
  // attention over f16, bf16 and int8 KV on bf16 products
  // (AttentionPlanOptions::fast_prefill_products: queries, softmax weights
  // and f16 K/V rounded to bf16; the bound is in docs/design.md, "Product
  // paths"), fp8 KV attention on the bf16 or f16 paths above
  // (AttentionPlanOptions::fp8_fast_products; their rounding is below the
  // fp8 values' own), and int8 activations (see int8_activations) in the
  // model products of steps that decode at least 8 sequences (16 or 32
  // where the timing finds int8 faster only there) and compute no prompt
  // token (compute-bound, where int8 dot products carry 4x an f32 FMA's
  // multiply-adds). Prompts, and steps of fewer sequences, keep f32 weight
  // products: a request served alone (with fewer than 8 samples) differs
  // from the exact path only by its prompt's attention rounding.
  // Deterministic mode keeps f32 everywhere. (int8_activations, where also
  // set, still takes int8 in every step.)
  bool exact_products = false;
  // Bind the stepping thread's OpenMP threads, one each, to the CPUs the
  // process may run on (thread i to the i-th CPU), at the first step: no
  // migrations between a step's parallel regions, and each thread's share
  // of a product stays on one core and its caches. For a machine (or a
  // cpuset) this engine has to itself: a bound thread cannot move away
  // from a core another process takes. Ignored where OpenMP has more
  // threads than the process has CPUs.
  bool pin_threads = false;
  // Model products with quantised weights (GGUF Q4_0 ... Q6_K) take the
  // activations rounded to int8 per 32 values, as llama.cpp does, on
  // integer dot products, in every step (prompts too): batches of at most
  // 8 rows (decode of a few sequences) on AVX2 and up, about 1.2-1.6x
  // faster decode; larger ones (decode of many sequences, prefill) on the
  // int8 tiles: about 2.5x faster products than f32 on AVX512-VNNI, 2x on
  // AVX-VNNI, 1.5x on AVX2 (docs/benchmarks.md). Logits
  // move (on SmolLM2-135M: top-1 agreement ~0.9 with f32, differences up
  // to ~4; docs/models.md). Off: f32 activations, except in the decode
  // steps of many sequences that exact_products leaves to int8.
  // Deterministic mode keeps f32.
  // (The environment variable PAGEDATTN_INT8_ACTIVATIONS=1 turns it on for
  // every model of the process.)
  bool int8_activations = false;
};

// Counters and the KV picture after the last step.
struct EngineStats {
  std::int64_t steps = 0;
  std::int64_t num_preemptions = 0;    // requests preempted (swap or recompute), in total
  std::int64_t recomputed_tokens = 0;  // tokens dropped by recompute preemptions
  std::int32_t num_running_seqs = 0;
  std::int32_t num_waiting_requests = 0;
  std::int32_t last_step_tokens = 0;   // tokens in the last step's batch
  std::int32_t last_step_decodes = 0;  // of which decodes
  std::int64_t num_pages = 0;
  std::int64_t pages_in_use = 0;
  std::int64_t token_states_stored = 0;    // distinct tokens held (shared pages counted once)
  std::int64_t token_states_unshared = 0;  // the same if no page were shared (sum over sequences)
  std::int64_t pages_if_unshared = 0;      // pages the sequences would hold without sharing
  double seconds_in_steps = 0.0;           // wall time inside step(), in total
  double seconds_in_model = 0.0;           // of which in Model::forward
  // Prefix caching: prompt tokens looked up at admission, and those found
  // cached (their K/V taken, not computed), in total.
  std::int64_t prefix_query_tokens = 0;
  std::int64_t prefix_hit_tokens = 0;
  std::int64_t prefix_host_hit_tokens = 0;  // of the hits, found in the host tier
  std::int64_t cached_pages = 0;            // device pages holding published prefixes
  std::int64_t prefix_evictions = 0;        // cached pages reclaimed for new data
  std::int64_t prefix_demotions = 0;        // of those, kept in the host tier
  double prefix_hit_rate() const {
    return prefix_query_tokens > 0 ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
  // Preemption by swap (num_preemptions counts both kinds).
  std::int64_t num_swap_outs = 0;   // requests swapped out
  std::int64_t num_swap_ins = 0;    // requests swapped back in
  std::int64_t swapped_tokens = 0;  // tokens kept by swapping instead of recomputing
  std::int64_t swapped_out_pages = 0, swapped_in_pages = 0;
  std::int32_t num_swapped_requests = 0;  // in the host tier now
  std::int64_t num_host_pages = 0, free_host_pages = 0;
};

using StreamCallback = std::function<void(const RequestOutput&)>;

// --- disaggregated prefill/decode (the prefill instance runs the model
// itself, see src/distributed/disagg_prefill.cc; the decode instance imports) --------
// A request slot whose prompt K/V arrives from a prefill instance: `pages`
// are the reserved pages of the engine's cache the bytes must land in.
struct ImportSlot {
  RequestId request_id = 0;
  KVPageRuns pages;
};
// The cache config an engine with `config` builds (page size, KV dtype,
// memory, deterministic planning): a prefill instance computes K/V that a
// decode engine continues from with exactly this config.
KVCacheConfig engine_cache_config(const EngineConfig& config);
// The engine's sampling of one token (logits [vocab]; `position` is the index
// the new token will have), for a prefill instance's first token: the same
// processing as a step's (logit_bias, min_tokens, penalties, then the draw).
// `prompt_token_ids` are the tokens before it (repetition_penalty counts
// them; none: nothing to penalize), `eos_token_id` the one min_tokens masks
// (-1: none). InvalidArgument for parameters check_sampling_params rejects,
// token ids outside the logits, and (counting the NaN and infinite logits)
// when a logit is not finite.
std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t seed, std::int32_t sample_index, std::int64_t position,
                          std::span<const std::int32_t> prompt_token_ids = {},
                          std::int32_t eos_token_id = -1);
// --- end of disaggregated prefill/decode ---------------------------------------

class Engine {
 public:
  // Validates the config (InvalidArgument naming the field) and builds the cache.
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument (nothing queued) for an empty prompt,
  // a token outside the vocabulary, bad params, or a request that could not
  // fit the KV memory even alone.
  RequestId add_request(std::span<const std::int32_t> prompt_token_ids,
                        const SamplingParams& params);
  // One iteration; returns the requests with new tokens or a finish.
  std::vector<RequestOutput> step();
  // Stops a request and returns its pages; reported (kAborted) by the next
  // step. InvalidArgument for an unknown or finished id.
  void abort(RequestId id);
  bool has_unfinished() const;
  // Called for every RequestOutput as step() produces it.
  void set_stream_callback(StreamCallback callback);

  // --- disaggregated prefill/decode: importing a prefilled request ---------------
  // Reserves pages (PagedKVCache::reserve_incoming) for the prompt's K/V of a
  // request prefilled elsewhere. Validates like add_request (with neither
  // logprobs nor prompt_logprobs: the first token's and the prompt's logits
  // stay on the prefill instance); nullopt when the pages or n sequence
  // slots are not free now (retry after steps finish requests).
  // The request is not scheduled until commit_import; cancel_import frees
  // its pages.
  std::optional<ImportSlot> reserve_import(std::span<const std::int32_t> prompt_token_ids,
                                           const SamplingParams& params);
  // The K/V has landed: the request runs from here with `first_token` (the
  // prefill instance's sample) as its first output token; the following
  // steps decode it. Returns that token's finish reason: kStop or kLength
  // mean the request is already done (its pages are freed, nothing runs).
  // InvalidArgument for an unknown id or a token outside the vocabulary.
  // InvalidArgument also for a request with n > 1 (commit_import_samples).
  FinishReason commit_import(RequestId id, std::int32_t first_token);
  // As commit_import, for any n: first_tokens[i] is sample i's first token
  // (the prefill instance's draw from the prompt's logits with sample index
  // i); samples 1.. then start as forks of the imported prompt, as the
  // engine's own samples do. Returns each sample's finish reason for its
  // first token (none kNone: the request is already done). InvalidArgument
  // unless there are n tokens, each inside the vocabulary.
  std::vector<FinishReason> commit_import_samples(RequestId id,
                                                  std::span<const std::int32_t> first_tokens);
  void cancel_import(RequestId id);
  std::int32_t num_pending_imports() const;
  // --- end of importing -----------------------------------------------------------

  EngineStats stats() const;
  const EngineConfig& config() const;
  const PagedKVCache& cache() const;  // internally synchronized (see kv_cache.h)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The OPENBLAS_CORETYPE that OpenBLAS should load with on this CPU, where it
// chose its generic x86-64 kernels ("Prescott": its build predates the CPU
// model, as Debian 12's 0.3.21 on Emerald Rapids) although the CPU has
// AVX-512 ("SkylakeX") or AVX2 with FMA ("Haswell"), and the user set no
// OPENBLAS_CORETYPE; "" otherwise (also with another BLAS). Prefill's
// products run on OpenBLAS, several times slower on the generic kernels.
// OpenBLAS reads the variable only when it loads: a program acts on the
// answer by starting again with it set (the `pagedattn` command does).
std::string blas_core_instead_of_fallback();

}  // namespace pagedattn
