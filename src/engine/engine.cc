// Engine: validation, and the step loop - schedule, one forward over the
// mixed batch, sample, retire. Scheduling lives in scheduler.cc, sampling in
// sampler.cc, the model behind the Model interface.
#include "pagedattn/engine.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "counter_random.h"
#include "sampler.h"
#include "scheduler.h"

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
      return "aborted";
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
                  cache) {
    // A swap's cost is a host copy: its rate is measured once (a few ms).
    if (cache.num_host_pages() > 0)
      scheduler.set_copy_seconds_per_byte(
          engine::measure_host_copy_seconds_per_byte(kCopyProbeBytes));
    config.model->attach_cache(cache);
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
  engine::Sampler sampler;
  StreamCallback callback;
  std::int64_t steps = 0;
  std::int32_t last_tokens = 0, last_decodes = 0;
  double seconds_in_steps = 0.0, seconds_in_model = 0.0;
  std::vector<RequestOutput> aborted;  // reported by the next step
  // Imported requests between reserve_import and commit/cancel_import.
  std::unordered_map<RequestId, std::unique_ptr<SequenceGroup>> imports;
  // Buffers of one step.
  std::vector<std::int32_t> token_ids, logit_rows;
  std::vector<float> logits;

  void validate_request(std::span<const std::int32_t> prompt, const SamplingParams& p) const;
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
  void append_token(SequenceGroup& g, std::int32_t seq, std::int32_t token, RequestOutput& out);
  // Samples chunk `c`'s sequence from `row` (the prompt's first sampling
  // draws every sample); false when the row is not finite and nothing was appended.
  bool sample_chunk(const ScheduledChunk& c, std::span<const float> row, RequestOutput& out);
  // Ends every unfinished sample of chunk `c`'s request with kError (see engine.h).
  void fail_request(const ScheduledChunk& c, std::span<const float> row, RequestOutput& out);
};

void Engine::Impl::validate_request(std::span<const std::int32_t> prompt,
                                    const SamplingParams& p) const {
  const ModelSpec& m = config.model->spec();
  require(!prompt.empty(), "Engine::add_request: prompt_token_ids is empty");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    require(prompt[i] >= 0 && prompt[i] < m.vocab_size, "Engine::add_request: prompt_token_ids[", i,
            "] = ", prompt[i], " is outside [0, vocab_size = ", m.vocab_size, ")");
  for (std::size_t i = 0; i < p.stop_token_ids.size(); ++i)
    require(p.stop_token_ids[i] >= 0 && p.stop_token_ids[i] < m.vocab_size,
            "Engine::add_request: stop_token_ids[", i, "] = ", p.stop_token_ids[i],
            " is outside [0, vocab_size = ", m.vocab_size, ")");
  require(p.max_tokens >= 1, "Engine::add_request: max_tokens = ", p.max_tokens, " must be >= 1");
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f,
          "Engine::add_request: temperature = ", p.temperature, " must be finite and >= 0");
  require(p.top_k >= 0, "Engine::add_request: top_k = ", p.top_k, " must be >= 0 (0 = off)");
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "Engine::add_request: top_p = ", p.top_p,
          " must be in (0, 1]");
  require(p.n >= 1 && p.n <= engine::kMaxSamples && p.n <= config.max_num_seqs,
          "Engine::add_request: n = ", p.n, " must be in [1, min(", engine::kMaxSamples,
          ", max_num_seqs = ", config.max_num_seqs, ")]");
  const std::int64_t total = std::ssize(prompt) + p.max_tokens;
  require(total <= m.max_position, "Engine::add_request: prompt (", prompt.size(),
          ") + max_tokens (", p.max_tokens,
          ") exceeds the model's max_position = ", m.max_position);
  require(config.chunked_prefill || total <= config.max_num_batched_tokens,
          "Engine::add_request: prompt + max_tokens = ", total,
          " exceeds max_num_batched_tokens = ", config.max_num_batched_tokens,
          " and chunked prefill is off (a preempted request is recomputed in one step)");
  // Alone, the request must fit: the prompt once, each sample's own tail.
  const std::int64_t ps = config.page_size;
  const std::int64_t need =
      pages_for(total, ps) + (p.n - 1) * (pages_for(total, ps) - std::ssize(prompt) / ps);
  require(need <= cache.num_pages(), "Engine::add_request: the request needs up to ", need,
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
  im.validate_request(prompt, params);
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

// Token ids of every chunk in plan order; logits for the chunks that sample.
void Engine::Impl::run_forward(const Schedule& s) {
  token_ids.clear();
  logit_rows.clear();
  for (const ScheduledChunk& c : s.chunks) {
    const std::vector<std::int32_t>& t = c.group->seqs[c.seq].tokens;
    token_ids.insert(token_ids.end(), t.begin() + c.begin, t.begin() + c.begin + c.length);
    if (c.samples) logit_rows.push_back(static_cast<std::int32_t>(token_ids.size()) - 1);
  }
  logits.resize(logit_rows.size() * std::size_t(config.model->spec().vocab_size));
  cache.begin_forward(s.seq_ids, s.lengths);
  const auto start = std::chrono::steady_clock::now();
  try {
    config.model->forward({token_ids, logit_rows, config.deterministic}, cache, logits);
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

bool Engine::Impl::sample_chunk(const ScheduledChunk& c, std::span<const float> row,
                                RequestOutput& out) {
  SequenceGroup& g = *c.group;
  const std::int64_t position = std::ssize(g.seqs[std::size_t(c.seq)].tokens);
  if (std::ssize(g.seqs) < g.params.n) {
    // The prompt's first sampling: every sample draws from these logits;
    // samples 1.. start as forks of the prompt (no copy of full pages).
    std::vector<std::int32_t> tokens;
    for (std::int32_t i = 0; i < g.params.n; ++i) {
      const std::optional<std::int32_t> t = sampler.sample(row, g.params, g.seed, i, position);
      if (!t) return false;
      tokens.push_back(*t);
    }
    const std::vector<std::int32_t> prompt = g.seqs[0].tokens;
    for (std::int32_t i = 1; i < g.params.n; ++i) {
      Sequence child;
      child.id = g.id * engine::kMaxSamples + i;
      child.index = i;
      child.tokens = prompt;
      g.seqs.push_back(std::move(child));
    }
    for (std::int32_t i = 0; i < g.params.n; ++i) append_token(g, i, tokens[std::size_t(i)], out);
    return true;
  }
  const std::int32_t index = g.seqs[std::size_t(c.seq)].index;
  const std::optional<std::int32_t> t = sampler.sample(row, g.params, g.seed, index, position);
  if (!t) return false;
  append_token(g, c.seq, *t, out);
  return true;
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
  const std::size_t vocab = std::size_t(config.model->spec().vocab_size);
  std::unordered_map<RequestId, std::size_t> slot;
  std::size_t row = 0;
  for (const ScheduledChunk& c : s.chunks) {
    if (!c.samples) continue;
    SequenceGroup& g = *c.group;
    const std::span<const float> l(logits.data() + row++ * vocab, vocab);
    auto [it, fresh] = slot.try_emplace(g.id, outputs.size());
    if (fresh) outputs.push_back({g.id, {}, false, {}});
    RequestOutput& out = outputs[it->second];
    if (!out.error.empty()) continue;  // failed on an earlier sample's row this step
    if (!sample_chunk(c, l, out)) fail_request(c, l, out);
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
    im.run_forward(s);
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
  RequestOutput out{id, {}, true, {}};
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
  im.validate_request(prompt, params);
  require(params.n == 1, "Engine::reserve_import: n = ", params.n,
          " must be 1 (parallel samples are not imported)");
  const std::lock_guard lock(im.mutex);
  // Like admission: while others run, a watermark of pages stays free for
  // their decodes (an import preempted later would recompute its prompt).
  const std::int64_t seqs = im.scheduler.num_running_seqs() + std::ssize(im.imports);
  const std::int64_t watermark =
      seqs == 0 ? 0 : std::max<std::int64_t>(1, im.cache.num_pages() / 100);
  if (seqs >= im.config.max_num_seqs ||
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
  Impl& im = *impl_;
  const std::lock_guard lock(im.mutex);
  const auto it = im.imports.find(id);
  require(it != im.imports.end(), "Engine::commit_import: request id = ", id,
          " has no reserved import");
  const std::int32_t vocab = im.config.model->spec().vocab_size;
  require(first_token >= 0 && first_token < vocab,
          "Engine::commit_import: first_token = ", first_token,
          " is outside [0, vocab_size = ", vocab, ")");
  std::unique_ptr<SequenceGroup> g = std::move(it->second);
  im.imports.erase(it);
  Sequence& s = g->seqs.front();
  im.cache.commit_incoming(s.id);
  s.in_cache = true;
  s.num_computed = g->prompt_len;
  RequestOutput reported;  // the caller has the first token already
  im.append_token(*g, 0, first_token, reported);
  if (s.finished()) {
    im.cache.remove_sequence(s.id);
    return s.finish;
  }
  im.scheduler.add_running(std::move(g));
  return FinishReason::kNone;
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
