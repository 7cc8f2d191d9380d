// Engine: validation, and the step loop - schedule, one forward over the
// mixed batch, sample, retire. Scheduling lives in scheduler.cc, sampling in
// sampler.cc, the model behind the Model interface.
#include "pagedattn/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/own_thread.h"
#include "counter_random.h"
#include "kernels/cpu/attention_cpu.h"
#include "sampler.h"
#include "scheduler.h"
#include "step_activations.h"
#include "step_threads.h"

namespace pagedattn {

KVCacheConfig kv_cache_config(const ModelSpec& spec) {
  KVCacheConfig k;
  k.num_layers = spec.num_layers;
  k.num_qo_heads = spec.num_qo_heads;
  k.num_kv_heads = spec.num_kv_heads;
  k.head_dim = spec.head_dim;
  k.rope_mode = spec.rope_mode;
  k.rope = spec.rope;
  k.support_sliding_window = spec.sliding_window > 0;
  // Multi-head latent attention: one [latent | RoPE key] row per token,
  // whose first latent_dim elements are V (nothing stored for V).
  if (spec.latent_dim > 0) {
    k.v_head_dim = spec.latent_dim;
    k.attention_kind = AttentionKind::kMLA;
  }
  return k;
}

using engine::Schedule;
using engine::ScheduledChunk;
using engine::Sequence;
using engine::SequenceGroup;

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

// Keys per KV split in deterministic mode (a multiple of the kernel's key block).
constexpr std::int32_t kDeterministicKVChunk = 256;

const EngineConfig& validated(const EngineConfig& c) {
  require(c.model != nullptr, "EngineConfig.model is null");
  require(c.kv_memory_bytes > 0, "EngineConfig.kv_memory_bytes = ", c.kv_memory_bytes,
          " must be > 0");
  require(c.page_size >= 1, "EngineConfig.page_size = ", c.page_size, " must be >= 1");
  require(c.max_num_seqs >= 1 && c.max_num_seqs <= 1 << 20,
          "EngineConfig.max_num_seqs = ", c.max_num_seqs, " must be in [1, 2^20]");
  require(c.host_kv_memory_bytes >= 0,
          "EngineConfig.host_kv_memory_bytes = ", c.host_kv_memory_bytes,
          " must be >= 0 (0: no host tier)");
  require(c.max_num_batched_tokens >= c.max_num_seqs,
          "EngineConfig.max_num_batched_tokens = ", c.max_num_batched_tokens,
          " must be >= max_num_seqs = ", c.max_num_seqs,
          " (every running sequence decodes each step)");
  return c;
}

}  // namespace

KVCacheConfig engine_cache_config(const EngineConfig& c) {
  KVCacheConfig k = kv_cache_config(c.model->spec());
  k.page_size = c.page_size;
  k.memory_budget_bytes = c.kv_memory_bytes;
  k.kv_dtype = c.kv_dtype;
  if (c.deterministic) k.attention_plan.fixed_kv_chunk = kDeterministicKVChunk;
  k.enable_prefix_caching = c.enable_prefix_caching;
  k.host_memory_budget_bytes = c.host_kv_memory_bytes;
  k.attention_plan.bf16_products = c.bf16_products;
  k.attention_plan.int8_products = c.int8_products;
  k.attention_plan.f16_products = c.f16_products;
  k.attention_plan.fp8_fast_products = !c.exact_products;
  k.attention_plan.fast_prefill_products = !c.exact_products;
  k.prefault_pages = true;  // no step waits for the kernel to zero a page
  return k;
}

namespace {

std::int64_t pages_for(std::int64_t tokens, std::int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

}  // namespace

struct Engine::Impl {
  explicit Impl(EngineConfig c)
      : config(std::move(c)),
        cache(engine_cache_config(validated(config))),
        scheduler({config.max_num_seqs, config.max_num_batched_tokens, config.chunked_prefill,
                   std::max<std::int64_t>(1, cache.num_pages() / 100), config.enable_prefix_caching,
                   config.model->spec().sliding_window},
                  cache),
        threads(config.pin_threads),
        activation_policy(engine::activation_policy(config)) {
    // A swap's cost is a host copy: its rate is measured once (a few ms).
    if (cache.num_host_pages() > 0)
      scheduler.set_copy_seconds_per_byte(
          engine::measure_host_copy_seconds_per_byte(kCopyProbeBytes));
    config.model->attach_cache(cache);
    engine::prepare_step_activations(activation_policy);
    // The product paths attention takes are timed now, not in the first
    // step, on a thread of their own (the stepping thread may be another).
    const KVCacheConfig& k = cache.config();
    if (k.device == KVDevice::kCpu)
      core::run_on_own_thread(
          [&] { kernels::prepare_product_choice(kernels::product_shape(k), k.attention_plan); });
  }
  static constexpr std::int64_t kCopyProbeBytes = 16 << 20;

  EngineConfig config;
  PagedKVCache cache;  // internally synchronized
  // Requests added since the last step. add_request only takes intake_mutex,
  // so it never waits for a running step; step() moves them to the
  // scheduler. Lock order: mutex, then intake_mutex.
  std::mutex intake_mutex;
  std::vector<std::unique_ptr<SequenceGroup>> incoming;
  RequestId next_id = 0;
  // Everything below: held by step() (but not its callbacks), abort and the
  // queries.
  mutable std::mutex mutex;
  engine::Scheduler scheduler;
  std::vector<engine::Sampler> samplers;             // one per OpenMP thread that draws
  engine::StepThreads threads;                       // this engine's steps' OpenMP threads
  const engine::ActivationPolicy activation_policy;  // each step's int8 choice
  StreamCallback callback;
  std::int64_t steps = 0;
  std::int32_t last_tokens = 0, last_decodes = 0;
  double seconds_in_steps = 0.0, seconds_in_model = 0.0;
  std::vector<RequestOutput> aborted;  // reported by the next step
  // Imported requests between reserve_import and commit/cancel_import.
  std::unordered_map<RequestId, std::unique_ptr<SequenceGroup>> imports;
  // Positions [first, first + count) of a chunk whose logits give prompt
  // logprobs: prompt positions 0 .. prompt_len - 2 not done before.
  struct PromptRows {
    std::int32_t first = 0, count = 0;
  };
  static PromptRows prompt_logprob_rows(const ScheduledChunk& c);

  // Buffers of one step. Per chunk, logits come for its prompt_rows, then
  // for its sampling row if it samples.
  std::vector<std::int32_t> token_ids, logit_rows;
  std::vector<PromptRows> prompt_rows;  // [chunks]
  std::vector<float> logits;

  // InvalidArgument, opened by `caller`, for a request the engine cannot serve.
  void validate_request(std::span<const std::int32_t> prompt, const SamplingParams& p,
                        std::string_view caller) const;
  // A request's group with its first sequence; `id` is the next request id
  // (the caller holds intake_mutex while taking it).
  std::unique_ptr<SequenceGroup> new_group(std::span<const std::int32_t> prompt,
                                           const SamplingParams& params, RequestId id) const;
  void admit_incoming();
  std::int64_t num_incoming() {
    const std::lock_guard intake(intake_mutex);
    return std::ssize(incoming);
  }
  void run_forward(const Schedule& s);
  void apply_samples(const Schedule& s, std::vector<RequestOutput>& outputs);
  std::span<const float> logit_row(std::size_t row) const {
    const std::size_t vocab = std::size_t(config.model->spec().vocab_size);
    return {logits.data() + row * vocab, vocab};
  }
  // Appends chunk `c`'s prompt logprobs from its rows starting at logit row
  // `first_row`; the row that is not finite, if one is (nothing appended from it).
  std::optional<std::size_t> record_prompt_logprobs(const ScheduledChunk& c, PromptRows rows,
                                                    std::size_t first_row);
  void append_token(SequenceGroup& g, std::int32_t seq, std::int32_t token, RequestOutput& out);
  // (sequence, token) pairs a chunk draws.
  using Draws = std::vector<std::pair<std::int32_t, std::int32_t>>;
  // The tokens chunk `c`'s sequence draws from `row` (the prompt's first
  // sampling draws every sample); nullopt when the row is not finite. Reads
  // the group and changes nothing, so the chunks of a step draw at once.
  std::optional<Draws> draw_chunk(const ScheduledChunk& c, std::span<const float> row,
                                  engine::Sampler& sampler) const;
  // Every sampling chunk's draws (`row_ends[k]`: one past chunk k's last
  // logit row, the one it samples from), over the step's threads when the
  // rows are many and long.
  std::vector<std::optional<Draws>> draw_all(const Schedule& s,
                                             const std::vector<std::size_t>& row_ends);
  // Appends chunk `c`'s draws from `row` (forking the prompt's samples first).
  void apply_draws(const ScheduledChunk& c, std::span<const float> row, const Draws& drawn,
                   RequestOutput& out);
  // Ends every unfinished sample of chunk `c`'s request with kError (see engine.h).
  void fail_request(const ScheduledChunk& c, std::span<const float> row, RequestOutput& out);
};

void Engine::Impl::validate_request(std::span<const std::int32_t> prompt, const SamplingParams& p,
                                    std::string_view caller) const {
  const ModelSpec& m = config.model->spec();
  require(!prompt.empty(), caller, ": prompt_token_ids is empty");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    require(prompt[i] >= 0 && prompt[i] < m.vocab_size, caller, ": prompt_token_ids[", i,
            "] = ", prompt[i], " is outside [0, vocab_size = ", m.vocab_size, ")");
  engine::check_sampling_params(p, caller);
  engine::check_sampling_token_ids(p, m.vocab_size, caller);
  require(p.n <= config.max_num_seqs, caller, ": n = ", p.n,
          " must be <= max_num_seqs = ", config.max_num_seqs);
  const std::int64_t total = std::ssize(prompt) + p.max_tokens;
  require(total <= m.max_position, caller, ": prompt (", prompt.size(), ") + max_tokens (",
          p.max_tokens, ") exceeds the model's max_position = ", m.max_position);
  require(config.chunked_prefill || total <= config.max_num_batched_tokens, caller,
          ": prompt + max_tokens = ", total,
          " exceeds max_num_batched_tokens = ", config.max_num_batched_tokens,
          " and chunked prefill is off (a preempted request is recomputed in one step)");
  // Alone, the request must fit: the prompt once, each sample's own tail.
  const std::int64_t ps = config.page_size;
  const std::int64_t need =
      pages_for(total, ps) + (p.n - 1) * (pages_for(total, ps) - std::ssize(prompt) / ps);
  require(need <= cache.num_pages(), caller, ": the request needs up to ", need,
          " KV pages (prompt ", prompt.size(), ", max_tokens ", p.max_tokens, ", n ", p.n,
          "), the cache has ", cache.num_pages());
}

std::unique_ptr<SequenceGroup> Engine::Impl::new_group(std::span<const std::int32_t> prompt,
                                                       const SamplingParams& params,
                                                       RequestId id) const {
  auto g = std::make_unique<SequenceGroup>();
  g->params = params;
  g->prompt_len = static_cast<std::int32_t>(prompt.size());
  g->id = id;
  g->seed = params.seed.value_or(engine::splitmix64(config.seed ^ engine::splitmix64(id)));
  Sequence first;
  first.tokens.assign(prompt.begin(), prompt.end());
  first.id = id * engine::kMaxSamples;
  g->seqs.push_back(std::move(first));
  return g;
}

Engine::Engine(EngineConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Engine::~Engine() = default;

RequestId Engine::add_request(std::span<const std::int32_t> prompt, const SamplingParams& params) {
  Impl& im = *impl_;
  im.validate_request(prompt, params, "Engine::add_request");
  // Ids in the order requests are queued, so admission stays FCFS.
  const std::lock_guard intake(im.intake_mutex);
  im.incoming.push_back(im.new_group(prompt, params, im.next_id++));
  return im.next_id - 1;
}

void Engine::Impl::admit_incoming() {
  std::vector<std::unique_ptr<SequenceGroup>> batch;
  {
    const std::lock_guard intake(intake_mutex);
    batch.swap(incoming);
  }
  for (auto& g : batch) scheduler.add(std::move(g));
}

Engine::Impl::PromptRows Engine::Impl::prompt_logprob_rows(const ScheduledChunk& c) {
  const SequenceGroup& g = *c.group;
  if (!g.params.prompt_logprobs) return {};
  const std::int32_t first = std::max(c.begin, g.prompt_logprobs_done);
  const std::int32_t end = std::min(c.begin + c.length, g.prompt_len - 1);
  return {first, std::max(0, end - first)};
}

// Token ids of every chunk in plan order; logits for the chunks that sample
// and for the prompt positions whose logprobs a request asked for.
void Engine::Impl::run_forward(const Schedule& s) {
  token_ids.clear();
  logit_rows.clear();
  prompt_rows.clear();
  for (const ScheduledChunk& c : s.chunks) {
    const std::vector<std::int32_t>& t = c.group->seqs[c.seq].tokens;
    const auto position_zero = static_cast<std::int32_t>(token_ids.size()) - c.begin;
    token_ids.insert(token_ids.end(), t.begin() + c.begin, t.begin() + c.begin + c.length);
    const PromptRows rows = prompt_logprob_rows(c);
    prompt_rows.push_back(rows);
    for (std::int32_t p = rows.first; p < rows.first + rows.count; ++p)
      logit_rows.push_back(position_zero + p);
    if (c.samples) logit_rows.push_back(static_cast<std::int32_t>(token_ids.size()) - 1);
  }
  logits.resize(logit_rows.size() * std::size_t(config.model->spec().vocab_size));
  cache.begin_forward(s.seq_ids, s.lengths);
  const auto start = std::chrono::steady_clock::now();
  try {
    const bool int8 = engine::step_takes_int8(activation_policy, s.num_tokens, s.num_decodes);
    config.model->forward({token_ids, logit_rows, config.deterministic, int8, config.bf16_products},
                          cache, logits);
    seconds_in_model +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (...) {
    cache.cancel_forward();  // the cache is exactly as before begin_forward
    throw;
  }
  cache.end_forward();
}

void Engine::Impl::append_token(SequenceGroup& g, std::int32_t seq, std::int32_t token,
                                RequestOutput& out) {
  Sequence& s = g.seqs[std::size_t(seq)];
  s.tokens.push_back(token);
  const SamplingParams& p = g.params;
  const std::int32_t eos = config.model->spec().eos_token_id;
  const bool stop =
      (!p.ignore_eos && token == eos) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (stop)
    s.finish = FinishReason::kStop;
  else if (std::ssize(s.tokens) - g.prompt_len >= p.max_tokens)
    s.finish = FinishReason::kLength;
  out.samples.push_back({s.index, {token}, s.finish});
}

std::optional<Engine::Impl::Draws> Engine::Impl::draw_chunk(const ScheduledChunk& c,
                                                            std::span<const float> row,
                                                            engine::Sampler& sampler) const {
  const SequenceGroup& g = *c.group;
  const bool first = std::ssize(g.seqs) < g.params.n;
  const Sequence& s = g.seqs[std::size_t(c.seq)];
  const engine::SampleContext context{s.tokens, g.prompt_len, config.model->spec().eos_token_id};
  const std::int64_t position = std::ssize(s.tokens);
  Draws drawn;
  for (std::int32_t i = first ? 0 : s.index; i < (first ? g.params.n : s.index + 1); ++i) {
    const std::optional<std::int32_t> t =
        sampler.sample(row, g.params, g.seed, i, position, context);
    if (!t) return std::nullopt;
    drawn.emplace_back(first ? i : c.seq, *t);
  }
  return drawn;
}

std::vector<std::optional<Engine::Impl::Draws>> Engine::Impl::draw_all(
    const Schedule& s, const std::vector<std::size_t>& row_ends) {
  // A draw reads its row once or a few times: on a vocabulary of 2^15 and
  // more, a handful of rows is worth the threads (each draw is
  // counter-seeded, so the split does not change a token).
  constexpr std::int64_t kParallelLogits = std::int64_t{1} << 17;
  std::vector<std::int32_t> sampling;  // chunks that sample
  for (std::size_t k = 0; k < s.chunks.size(); ++k)
    if (s.chunks[k].samples) sampling.push_back(static_cast<std::int32_t>(k));
  const auto count = static_cast<std::int32_t>(sampling.size());
  const bool parallel =
      count > 1 && std::int64_t{count} * config.model->spec().vocab_size >= kParallelLogits;
  // Grown, never shrunk: each keeps its vocabulary-long buffers between steps.
  samplers.resize(std::max(samplers.size(), std::size_t(parallel ? omp_get_max_threads() : 1)));
  std::vector<std::optional<Draws>> draws(s.chunks.size());
  std::exception_ptr error;  // the first, rethrown here: none may leave the region
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (std::int32_t i = 0; i < count; ++i) {
    const std::size_t k = std::size_t(sampling[std::size_t(i)]);
    try {
      draws[k] = draw_chunk(s.chunks[k], logit_row(row_ends[k] - 1),
                            samplers[std::size_t(omp_get_thread_num())]);
    } catch (...) {
#pragma omp critical(pagedattn_draw_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return draws;
}

void Engine::Impl::apply_draws(const ScheduledChunk& c, std::span<const float> row,
                               const Draws& drawn, RequestOutput& out) {
  SequenceGroup& g = *c.group;
  // The prompt's first sampling: every sample drew from these logits;
  // samples 1.. now start as forks of the prompt (no copy of full pages).
  if (std::ssize(g.seqs) < g.params.n) {
    const std::vector<std::int32_t> prompt = g.seqs[0].tokens;
    for (std::int32_t i = 1; i < g.params.n; ++i) {
      Sequence child;
      child.id = g.id * engine::kMaxSamples + i;
      child.index = i;
      child.tokens = prompt;
      g.seqs.push_back(std::move(child));
    }
  }
  std::optional<engine::RawLogprobs> raw;
  if (g.params.logprobs) raw.emplace(row, *g.params.logprobs);
  for (const auto& [seq, token] : drawn) {
    append_token(g, seq, token, out);
    if (raw) out.samples.back().logprobs.push_back(raw->of(token));
  }
}

std::optional<std::size_t> Engine::Impl::record_prompt_logprobs(const ScheduledChunk& c,
                                                                PromptRows rows,
                                                                std::size_t first_row) {
  SequenceGroup& g = *c.group;
  const std::vector<std::int32_t>& tokens = g.seqs[std::size_t(c.seq)].tokens;
  for (std::int32_t i = 0; i < rows.count; ++i) {
    const std::span<const float> row = logit_row(first_row + std::size_t(i));
    const engine::NonFiniteCount non_finite = engine::count_non_finite(row);
    if (non_finite.nan + non_finite.inf > 0) return first_row + std::size_t(i);
    const std::int32_t position = rows.first + i;
    const engine::RawLogprobs raw(row, *g.params.prompt_logprobs);
    g.prompt_logprobs.push_back(raw.of(tokens[std::size_t(position) + 1]));
    g.prompt_logprobs_done = position + 1;
  }
  return std::nullopt;
}

// Non-finite logits: a token drawn from them would be arbitrary (the
// argmax of NaNs is token 0), so the whole request ends with kError - its
// samples share the model that failed - and release_finished frees its pages.
void Engine::Impl::fail_request(const ScheduledChunk& c, std::span<const float> row,
                                RequestOutput& out) {
  SequenceGroup& g = *c.group;
  const Sequence& failed = g.seqs[std::size_t(c.seq)];
  // The step's number as EngineStats.steps will report it once this step ends.
  out.error = detail::concat(
      "request ", g.id, ": the model's logits are not finite at engine step ", steps + 1,
      ", sample ", failed.index, ", after ", std::ssize(failed.tokens) - g.prompt_len,
      " output tokens (", engine::describe_non_finite(row),
      "); the model's weights or activations hold NaN or Inf (loading with check_tensors, "
      "--check-tensors on the CLI, names a bad weight)");
  // Samples not forked yet exist only to end here (never in the cache).
  for (std::int32_t i = static_cast<std::int32_t>(g.seqs.size()); i < g.params.n; ++i) {
    Sequence child;
    child.id = g.id * engine::kMaxSamples + i;
    child.index = i;
    g.seqs.push_back(std::move(child));
  }
  for (Sequence& s : g.seqs) {
    if (s.finished()) continue;
    s.finish = FinishReason::kError;
    const auto reported = std::find_if(out.samples.begin(), out.samples.end(),
                                       [&](const SampleOutput& o) { return o.index == s.index; });
    if (reported != out.samples.end())
      reported->finish_reason = FinishReason::kError;
    else
      out.samples.push_back({s.index, {}, FinishReason::kError});
  }
}

void Engine::Impl::apply_samples(const Schedule& s, std::vector<RequestOutput>& outputs) {
  std::unordered_map<RequestId, std::size_t> slot;
  auto output_of = [&](RequestId id) -> RequestOutput& {
    const auto [it, fresh] = slot.try_emplace(id, outputs.size());
    if (fresh) outputs.push_back({id, {}, false, {}, {}});
    return outputs[it->second];
  };
  // One past each chunk's last logit row: its prompt rows, then the row it
  // samples from, if it samples.
  std::vector<std::size_t> row_ends(s.chunks.size());
  for (std::size_t k = 0, row = 0; k < s.chunks.size(); ++k) {
    row += std::size_t(prompt_rows[k].count) + (s.chunks[k].samples ? 1 : 0);
    row_ends[k] = row;
  }
  // Drawn before any state changes; a chunk whose request fails on an
  // earlier row of the step drops its draws below.
  const std::vector<std::optional<Draws>> draws = draw_all(s, row_ends);
  for (std::size_t k = 0; k < s.chunks.size(); ++k) {
    const ScheduledChunk& c = s.chunks[k];
    const std::size_t first_row = k == 0 ? 0 : row_ends[k - 1];
    const std::size_t row = row_ends[k];
    SequenceGroup& g = *c.group;
    // Finished already: its request failed on an earlier row of this step.
    if (first_row == row || g.seqs[std::size_t(c.seq)].finished()) continue;
    if (const std::optional<std::size_t> bad =
            record_prompt_logprobs(c, prompt_rows[k], first_row)) {
      RequestOutput& out = output_of(g.id);
      fail_request(c, logit_row(*bad), out);
      out.finished = g.finished();
      continue;
    }
    if (!c.samples) continue;
    RequestOutput& out = output_of(g.id);
    if (draws[k])
      apply_draws(c, logit_row(row - 1), *draws[k], out);
    else
      fail_request(c, logit_row(row - 1), out);
    if (g.params.prompt_logprobs && !g.prompt_logprobs_reported) {
      require<InternalError>(g.prompt_logprobs_done == g.prompt_len - 1, "request ", g.id, ": ",
                             g.prompt_logprobs_done, " prompt logprobs of ", g.prompt_len - 1,
                             " at its first sampling");
      out.prompt_logprobs = std::move(g.prompt_logprobs);
      g.prompt_logprobs.clear();
      g.prompt_logprobs_reported = true;
    }
    out.finished = g.finished();
  }
}

std::vector<RequestOutput> Engine::step() {
  Impl& im = *impl_;
  std::unique_lock lock(im.mutex);
  const auto start = std::chrono::steady_clock::now();
  im.admit_incoming();
  std::vector<RequestOutput> outputs = std::move(im.aborted);
  im.aborted.clear();
  const Schedule s = im.scheduler.schedule();
  if (!s.empty()) {
    const double model_before = im.seconds_in_model;
    im.threads.apply();
    im.run_forward(s);
    im.threads.step_done();
    im.scheduler.observe_forward(s.num_tokens, im.seconds_in_model - model_before);
    im.scheduler.complete(s);
    im.apply_samples(s, outputs);
    im.scheduler.release_finished();
  }
  im.last_tokens = s.num_tokens;
  im.last_decodes = s.num_decodes;
  ++im.steps;
  im.seconds_in_steps +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Callbacks run unlocked: they may call add_request, abort or the queries.
  const StreamCallback callback = im.callback;
  lock.unlock();
  if (callback)
    for (const RequestOutput& out : outputs) callback(out);
  return outputs;
}

void Engine::abort(RequestId id) {
  Impl& im = *impl_;
  const std::lock_guard lock(im.mutex);
  im.admit_incoming();  // a request added a moment ago can be aborted too
  std::unique_ptr<SequenceGroup> g = im.scheduler.remove(id);
  require(g != nullptr, "Engine::abort: request id = ", id, " is not waiting or running");
  RequestOutput out{id, {}, true, {}, {}};
  for (std::int32_t i = 0; i < g->params.n; ++i) {
    const bool done = i < std::ssize(g->seqs) && g->seqs[std::size_t(i)].finished();
    if (!done) out.samples.push_back({i, {}, FinishReason::kAborted});
  }
  im.aborted.push_back(std::move(out));
}

bool Engine::has_unfinished() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->scheduler.has_unfinished() || !impl_->aborted.empty() || impl_->num_incoming() > 0;
}

void Engine::set_stream_callback(StreamCallback callback) {
  const std::lock_guard lock(impl_->mutex);
  impl_->callback = std::move(callback);
}

EngineStats Engine::stats() const {
  Impl& im = *impl_;
  const std::lock_guard lock(im.mutex);
  EngineStats st;
  st.steps = im.steps;
  st.num_preemptions = im.scheduler.num_preemptions();
  st.recomputed_tokens = im.scheduler.preempted_tokens();
  st.num_running_seqs = im.scheduler.num_running_seqs();
  st.num_waiting_requests =
      im.scheduler.num_waiting() + static_cast<std::int32_t>(im.num_incoming());
  st.last_step_tokens = im.last_tokens;
  st.last_step_decodes = im.last_decodes;
  st.num_pages = im.cache.num_pages();
  st.pages_in_use = st.num_pages - im.cache.num_free_pages();
  // Shared pages are full (forks copy partial pages): each extra holder of
  // a page counts page_size tokens that are stored once.
  const std::int64_t ps = im.config.page_size;
  std::int64_t page_refs = 0;
  for (SeqId id : im.cache.sequence_ids()) {
    if (im.cache.is_swapped(id)) continue;  // its pages are in the host tier
    const std::int64_t len = im.cache.sequence_length(id);
    st.token_states_unshared += len;
    page_refs += pages_for(len, ps);
  }
  st.token_states_stored = st.token_states_unshared - ps * (page_refs - st.pages_in_use);
  st.pages_if_unshared = page_refs;
  st.seconds_in_steps = im.seconds_in_steps;
  st.seconds_in_model = im.seconds_in_model;
  const PrefixCacheStats pc = im.cache.prefix_cache_stats();
  st.prefix_query_tokens = pc.query_tokens;
  st.prefix_hit_tokens = pc.hit_tokens;
  st.prefix_host_hit_tokens = pc.host_hit_tokens;
  st.cached_pages = im.cache.num_cached_pages();
  st.prefix_evictions = pc.evictions;
  st.prefix_demotions = pc.demotions;
  st.num_swap_outs = im.scheduler.num_swap_outs();
  st.num_swap_ins = im.scheduler.num_swap_ins();
  st.swapped_tokens = im.scheduler.swapped_tokens();
  st.swapped_out_pages = pc.swapped_out_pages;
  st.swapped_in_pages = pc.swapped_in_pages;
  st.num_swapped_requests = im.scheduler.num_swapped();
  st.num_host_pages = im.cache.num_host_pages();
  st.free_host_pages = im.cache.num_free_host_pages();
  return st;
}

const EngineConfig& Engine::config() const {
  return impl_->config;
}
const PagedKVCache& Engine::cache() const {
  return impl_->cache;
}

// --- disaggregated prefill/decode: importing a prefilled request -------------

std::optional<ImportSlot> Engine::reserve_import(std::span<const std::int32_t> prompt,
                                                 const SamplingParams& params) {
  Impl& im = *impl_;
  im.validate_request(prompt, params, "Engine::reserve_import");
  // The prefill instance holds the logits these need.
  require(!params.logprobs, "Engine::reserve_import: logprobs = ", params.logprobs.value_or(0),
          " is not supported for imported requests (the first token's logits stay on the "
          "prefill instance); leave it unset");
  require(!params.prompt_logprobs,
          "Engine::reserve_import: prompt_logprobs = ", params.prompt_logprobs.value_or(0),
          " is not supported for imported requests (the prompt runs on the prefill "
          "instance); leave it unset");
  const std::lock_guard lock(im.mutex);
  // Like admission: while others run, a watermark of pages stays free for
  // their decodes (an import preempted later would recompute its prompt).
  std::int64_t seqs = im.scheduler.num_running_seqs();
  for (const auto& [id, pending] : im.imports) seqs += pending->params.n;
  const std::int64_t watermark =
      seqs == 0 ? 0 : std::max<std::int64_t>(1, im.cache.num_pages() / 100);
  if (seqs + params.n > im.config.max_num_seqs ||
      pages_for(std::ssize(prompt), im.config.page_size) + watermark > im.cache.num_free_pages())
    return std::nullopt;
  std::unique_ptr<SequenceGroup> g;
  {
    const std::lock_guard intake(im.intake_mutex);
    g = im.new_group(prompt, params, im.next_id++);
  }
  ImportSlot slot{g->id, im.cache.reserve_incoming(g->seqs.front().id, std::ssize(prompt))};
  im.imports.emplace(g->id, std::move(g));
  return slot;
}

FinishReason Engine::commit_import(RequestId id, std::int32_t first_token) {
  {
    const std::lock_guard lock(impl_->mutex);
    const auto it = impl_->imports.find(id);
    const std::int32_t n = it == impl_->imports.end() ? 1 : it->second->params.n;
    require(n == 1, "Engine::commit_import: request id = ", id, " has n = ", n,
            " samples; commit them with commit_import_samples");
  }
  return commit_import_samples(id, std::span(&first_token, 1)).front();
}

std::vector<FinishReason> Engine::commit_import_samples(
    RequestId id, std::span<const std::int32_t> first_tokens) {
  Impl& im = *impl_;
  const std::lock_guard lock(im.mutex);
  const auto it = im.imports.find(id);
  require(it != im.imports.end(), "Engine::commit_import: request id = ", id,
          " has no reserved import");
  const std::int32_t n = it->second->params.n;
  require(std::ssize(first_tokens) == n, "Engine::commit_import_samples: first_tokens has ",
          first_tokens.size(), " tokens; request id = ", id, " has n = ", n, " samples");
  const std::int32_t vocab = im.config.model->spec().vocab_size;
  for (const std::int32_t token : first_tokens)
    require(token >= 0 && token < vocab, "Engine::commit_import: first_token = ", token,
            " is outside [0, vocab_size = ", vocab, ")");
  std::unique_ptr<SequenceGroup> g = std::move(it->second);
  im.imports.erase(it);
  const SeqId lead = g->seqs.front().id;
  im.cache.commit_incoming(lead);
  g->seqs.front().in_cache = true;
  g->seqs.front().num_computed = g->prompt_len;
  // Samples 1.. wait outside the cache until the scheduler forks the lead,
  // as after the engine's own first sampling (Impl::sample_chunk).
  const std::vector<std::int32_t> prompt = g->seqs.front().tokens;
  for (std::int32_t i = 1; i < n; ++i) {
    Sequence child;
    child.id = g->id * engine::kMaxSamples + i;
    child.index = i;
    child.tokens = prompt;
    g->seqs.push_back(std::move(child));
  }
  RequestOutput reported;  // the caller has the first tokens already
  std::vector<FinishReason> finish;
  for (std::int32_t i = 0; i < n; ++i) {
    im.append_token(*g, i, first_tokens[std::size_t(i)], reported);
    finish.push_back(g->seqs[std::size_t(i)].finish);
  }
  if (g->finished()) {
    im.cache.remove_sequence(lead);
    return finish;
  }
  im.scheduler.add_running(std::move(g));
  return finish;
}

void Engine::cancel_import(RequestId id) {
  Impl& im = *impl_;
  const std::lock_guard lock(im.mutex);
  const auto it = im.imports.find(id);
  require(it != im.imports.end(), "Engine::cancel_import: request id = ", id,
          " has no reserved import");
  im.cache.cancel_incoming(it->second->seqs.front().id);
  im.imports.erase(it);
}

std::int32_t Engine::num_pending_imports() const {
  const std::lock_guard lock(impl_->mutex);
  return static_cast<std::int32_t>(impl_->imports.size());
}

}  // namespace pagedattn
