// bench-serve: a workload through the engine in real time (arrivals on the
// wall clock), then the report and the contiguous-reservation replay.
#include "bench_serve.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>
#include <unordered_map>

#include "bench_serve_http.h"
#include "bench_serve_options.h"
#include "bench_serve_roofline.h"
#include "contiguous_replay.h"
#include "engine/gemm.h"
#include "engine/onednn_matmul.h"
#include "engine/step_activations.h"
#include "engine/step_profile.h"
#include "kernels/cpu/attention_cpu.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama.h"
#include "progress_bar.h"
#include "serve_metrics.h"
#include "serve_report.h"
#include "tensor_parallel_cli.h"
#include "workload.h"

namespace pagedattn::tools {
namespace {

struct PresetDefaults {
  std::int32_t num_requests;
  double length_scale;  // workload lengths are scaled to the model's speed
  double kv_memory_mib;
};

bool is_gguf(const std::string& model) {
  return model.ends_with(".gguf");
}

PresetDefaults preset_defaults(const std::string& model) {
  if (model == "small" || is_gguf(model)) return {16, 0.5, 256};
  if (model == "1b") return {12, 0.25, 1024};
  return {300, 1.0, 64};
}

std::vector<TraceRequest> build_trace(const BenchServeOptions& o, const PresetDefaults& d) {
  if (o.workload.ends_with(".jsonl")) return load_trace(o.workload);
  WorkloadOptions w;
  w.name = o.workload;
  w.num_requests = o.num_requests > 0 ? o.num_requests : (o.quick ? 40 : d.num_requests);
  w.request_rate = o.request_rate;
  w.length_scale = o.quick ? 0.2 : d.length_scale;
  w.seed = o.seed;
  w.num_shared_prefixes = o.shared_prefixes;
  w.shared_prefix_len = o.shared_prefix_len > 0 ? o.shared_prefix_len
                                                : static_cast<std::int32_t>(1024 * w.length_scale);
  w.num_turns = o.turns;
  return make_workload(w);
}

// The KV budget in bytes, refused above this machine's physical memory (the
// cache allocates all of it up front; the library would otherwise cap a huge
// budget at 2^31 - 1 pages without a word).
std::int64_t kv_memory_bytes(double mib) {
  const double machine = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const double machine_mib = machine / double(1 << 20);
  require(machine <= 0 || mib <= machine_mib, "bench-serve: --kv-memory-mib = ", mib,
          " exceeds this machine's memory (", static_cast<long long>(machine_mib), " MiB)");
  return static_cast<std::int64_t>(mib * double(1 << 20));
}

// The checks Engine::add_request makes, run over the whole trace before the
// clock starts, so that a bad request fails the run at once rather than when
// it arrives.
void check_trace_fits(const std::vector<TraceRequest>& trace, const Engine& engine) {
  const EngineConfig& c = engine.config();
  const std::int64_t max_position = c.model->spec().max_position;
  const std::int64_t ps = c.page_size;
  auto pages = [&](std::int64_t tokens) { return (tokens + ps - 1) / ps; };
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& r = trace[i];
    const std::int64_t total = std::int64_t{r.prompt_len} + r.output_len;
    require(total <= max_position, "bench-serve: request ", i, ": prompt_len ", r.prompt_len,
            " + output_len ", r.output_len, " exceeds the model's max_position = ", max_position);
    require(r.n <= c.max_num_seqs, "bench-serve: request ", i, ": n = ", r.n,
            " exceeds --max-num-seqs = ", c.max_num_seqs);
    require(c.chunked_prefill || total <= c.max_num_batched_tokens, "bench-serve: request ", i,
            ": prompt_len + output_len = ", total,
            " exceeds --max-num-batched-tokens = ", c.max_num_batched_tokens,
            " with --no-chunked-prefill");
    const std::int64_t need = pages(total) + (r.n - 1) * (pages(total) - r.prompt_len / ps);
    require(need <= engine.cache().num_pages(), "bench-serve: request ", i, " needs up to ", need,
            " KV pages (prompt_len ", r.prompt_len, ", output_len ", r.output_len, ", n ", r.n,
            "); the cache has ", engine.cache().num_pages(), " (raise --kv-memory-mib)");
  }
}

// For each request, the trace index of the previous turn of its
// conversation (-1: none; it waits only for its arrival).
std::vector<std::ptrdiff_t> previous_turns(const std::vector<TraceRequest>& trace) {
  std::vector<std::ptrdiff_t> prev(trace.size(), -1);
  std::unordered_map<std::int32_t, std::size_t> last;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].conversation < 0) continue;
    const auto it = last.find(trace[i].conversation);
    if (it != last.end()) prev[i] = static_cast<std::ptrdiff_t>(it->second);
    last[trace[i].conversation] = i;
  }
  return prev;
}

// Serves the trace; fills per-request timings and per-step samples. A
// request is sent once it has arrived and (multi-turn) the previous turn of
// its conversation has finished: its prompt then holds that turn's output.
void serve(Engine& engine, const std::vector<TraceRequest>& trace,
           std::vector<RequestTiming>& timing, std::vector<StepSample>& steps) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const std::int32_t vocab = engine.config().model->spec().vocab_size;
  const std::vector<std::ptrdiff_t> prev = previous_turns(trace);
  std::vector<std::vector<std::int32_t>> sample_tokens(trace.size());
  std::vector<std::vector<std::int32_t>> first_sample(trace.size());  // multi-turn history
  std::vector<char> sent(trace.size(), 0), done(trace.size(), 0);
  std::unordered_map<RequestId, std::size_t> index_of;
  MultiTurnPrompts prompts;
  timing.assign(trace.size(), {});
  ProgressBar bar(stderr, std::ssize(trace));
  std::size_t first_unsent = 0;
  std::int64_t completed = 0, produced = 0;
  engine::StepProfile profile;
  const engine::StepProfileScope profiling(&profile);
  while (first_unsent < trace.size() || engine.has_unfinished()) {
    double next_arrival = kMaxArrivalSeconds;
    for (std::size_t i = first_unsent; i < trace.size(); ++i) {
      const TraceRequest& r = trace[i];
      if (sent[i] || (prev[i] >= 0 && !done[std::size_t(prev[i])])) continue;
      if (r.arrival > now()) {
        next_arrival = std::min(next_arrival, r.arrival);
        continue;
      }
      SamplingParams p;
      p.max_tokens = r.output_len;
      p.n = r.n;
      p.temperature = r.n > 1 ? 1.0f : 0.0f;  // parallel samples must differ
      p.ignore_eos = true;                    // the trace fixes output lengths
      if (prev[i] >= 0) {
        const std::size_t before = std::size_t(prev[i]);
        prompts.record_output(trace[before], first_sample[before]);
      }
      index_of[engine.add_request(prompts.prompt(r, i, 0, vocab), p)] = i;
      // A later turn is sent when the previous one ends: its latency counts from then.
      timing[i].arrival = prev[i] >= 0 ? now() : r.arrival;
      sample_tokens[i].assign(std::size_t(r.n), 0);
      sent[i] = 1;
    }
    while (first_unsent < trace.size() && sent[first_unsent]) ++first_unsent;
    if (!engine.has_unfinished()) {
      if (first_unsent < trace.size())
        std::this_thread::sleep_for(std::chrono::duration<double>(next_arrival - now()));
      continue;
    }
    profile = {};
    const double step_start = now();
    const std::vector<RequestOutput> outputs = engine.step();
    const double t = now();
    for (const RequestOutput& out : outputs) {
      const std::size_t i = index_of.at(out.request_id);
      RequestTiming& rt = timing[i];
      for (const SampleOutput& s : out.samples) {
        rt.output_tokens += std::ssize(s.new_token_ids);
        produced += std::ssize(s.new_token_ids);
        sample_tokens[i][std::size_t(s.index)] += std::ssize(s.new_token_ids);
        if (s.index == 0 && trace[i].conversation >= 0)
          first_sample[i].insert(first_sample[i].end(), s.new_token_ids.begin(),
                                 s.new_token_ids.end());
        if (rt.first_token < 0 && !s.new_token_ids.empty()) rt.first_token = t;
      }
      if (out.finished) {
        rt.finish = t;
        for (std::int32_t n : sample_tokens[i]) rt.longest_sample = std::max(rt.longest_sample, n);
        done[i] = 1;
        ++completed;
      }
    }
    const EngineStats st = engine.stats();
    steps.push_back({t, st.num_running_seqs, st.last_step_tokens, st.pages_in_use,
                     st.token_states_stored, st.pages_if_unshared, produced, t - step_start,
                     st.last_step_decodes, profile});
    bar.update(completed,
               detail::concat("running ", st.num_running_seqs, "  pages ",
                              st.pages_in_use * 100 / st.num_pages, "%  ",
                              static_cast<long long>(produced / std::max(t, 1e-9)), " tok/s"));
  }
  bar.finish();
}

// The prefix-cache and preemption figures of the run.
void add_cache_figures(ServeSummary& summary, const std::vector<TraceRequest>& trace,
                       const EngineStats& st, bool prefix_caching) {
  summary.prefix_caching = prefix_caching;
  for (const TraceRequest& r : trace) {
    summary.prompt_tokens += r.prompt_len;
    summary.history_tokens += r.history_len;
    summary.shared_prefix_tokens += r.shared_prefix >= 0 ? r.shared_prefix_len : 0;
  }
  summary.prefix_hit_tokens = st.prefix_hit_tokens;
  summary.cached_pages = st.cached_pages;
  summary.prefix_evictions = st.prefix_evictions;
  summary.swap_outs = st.num_swap_outs;
  summary.swap_ins = st.num_swap_ins;
  summary.recomputed_tokens = st.recomputed_tokens;
  summary.swapped_tokens = st.swapped_tokens;
}

}  // namespace

namespace {

// The run's int8 activations: in every step, none, or the default's choice
// with the timing it rests on.
std::string int8_activations_report(const engine::ActivationPolicy& policy) {
  const std::string tiles = engine::int8_tiles_name(engine::int8_tiles());
  if (policy.int8_always) return "in every step (int8 tiles: " + tiles + ")";
  if (policy.exact) return "off";
  const engine::Int8DecodeTiming& t = engine::int8_decode_timing();
  std::string text = t.min_rows > 0 ? detail::concat("in decode steps of ", t.min_rows,
                                                     "+ sequences (int8 tiles: ", tiles,
                                                     "; timed, us on int8 / f32 x:")
                                    : "off (not faster when timed, us on int8 / f32 x:";
  for (const engine::Int8DecodeTiming::Point& p : t.points) {
    if (p.rows == 0) break;
    char point[64];
    std::snprintf(point, sizeof point, "%s %d rows %.1f / %.1f",
                  p.rows == t.points[0].rows ? "" : ",", p.rows, p.int8_seconds * 1e6,
                  p.f32_seconds * 1e6);
    text += point;
  }
  return text + ")";
}

// The run's bf16 products: off, or the weight products' routes by batch
// rows with the timing they rest on.
std::string bf16_products_report(const engine::ActivationPolicy& policy) {
  if (!policy.bf16) return "off";
  const engine::Bf16RouteTiming& t = engine::bf16_route_timing();
  std::string text = "on (weight products timed, us on f32 / bf16 tiles / oneDNN bf16:";
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    const engine::Bf16RouteTiming::Point& p = t.points[i];
    char point[128];
    std::snprintf(point, sizeof point, "%s %d rows %.1f / %.1f / %.1f -> %s", i == 0 ? "" : ",",
                  p.rows, p.f32_seconds * 1e6, p.tiles_seconds * 1e6, p.onednn_seconds * 1e6,
                  engine::bf16_route_name(t.routes.route[i]));
    text += point;
  }
  return text + ")";
}

// The products attention takes over the engine's cache, by phase, as the
// kernels chose them (timed once per process where allowed).
struct AttentionProducts {
  std::string prefill, decode;
};

AttentionProducts attention_products(const KVCacheConfig& k) {
  if (k.device != KVDevice::kCpu) return {"device", "device"};
  const kernels::ProductChoice c =
      kernels::product_choice(kernels::product_shape(k), k.attention_plan);
  return {c.amx_bf16   ? "bf16 (AMX)"
          : c.bf16_dot ? "bf16"
                       : "f32",
          c.f16_decode    ? "f16"
          : c.bf16_decode ? "bf16"
          : c.int8_dot    ? "int8"
                          : "f32"};
}

// Communication of a tensor-parallel run against its model time.
void print_tensor_parallel_times(const EngineStats& st) {
  const TensorParallelTimes tp = tensor_parallel_times();
  if (tp.size == 1) return;
  const double per_step_ms = st.steps > 0 ? 1e3 * tp.all_reduce_seconds / double(st.steps) : 0.0;
  std::printf(
      "  tensor parallel %d: all-reduce %.3f s in %lld calls (%.1f KiB each on average, %.3f ms "
      "per "
      "step) = %.1f%% of model time; step broadcasts %.3f s = %.1f%%\n",
      tp.size, tp.all_reduce_seconds, static_cast<long long>(tp.all_reduce_calls),
      tp.all_reduce_calls > 0
          ? 4.0 * double(tp.all_reduce_floats) / double(tp.all_reduce_calls) / 1024.0
          : 0.0,
      per_step_ms,
      st.seconds_in_model > 0 ? 100.0 * tp.all_reduce_seconds / st.seconds_in_model : 0.0,
      tp.broadcast_seconds,
      st.seconds_in_model > 0 ? 100.0 * tp.broadcast_seconds / st.seconds_in_model : 0.0);
}

}  // namespace

int run_bench_serve(int argc, char** argv) {
  const BenchServeOptions o = parse_bench_serve_options(argc, argv, 2);
  if (o.help) {
    std::fputs(bench_serve_help().c_str(), stdout);
    return 0;
  }
  // Over HTTP the server holds the model: the workload is sized as for a GGUF file.
  if (!o.url.empty())
    return run_bench_serve_http(o, build_trace(o, preset_defaults("server.gguf")));
  const PresetDefaults d = preset_defaults(o.model);
  const double mib = o.kv_memory_mib > 0 ? o.kv_memory_mib : d.kv_memory_mib;
  const std::int64_t kv_bytes = kv_memory_bytes(mib);
  const std::vector<TraceRequest> trace = build_trace(o, d);
  std::ofstream json_file;
  if (!o.json.empty()) json_file = open_json_output(o.json);
  EngineConfig ec;
  ec.model = make_cli_model(o.tensor_parallel, o.model, [&](const TensorParallelShard& shard) {
    if (is_gguf(o.model)) return make_gguf_model(o.model, {.shard = shard});
    LlamaConfig lc = llama_preset(o.model);
    lc.shard = shard;
    return make_llama_model(lc);
  });
  if (ec.model == nullptr) return 0;  // a follower rank: rank 0 reports
  if (is_gguf(o.model)) {
    std::printf("pagedattn bench-serve: model %s ('%s', real weights; prompts are random tokens)\n",
                o.model.c_str(), ec.model->spec().name.c_str());
  } else {
    const LlamaConfig lc = llama_preset(o.model);
    std::printf(
        "pagedattn bench-serve: model '%s' (%.1fM parameters; weights are synthetic and seeded,\n"
        "  so generated text is meaningless - the timing and memory figures are real)\n",
        o.model.c_str(), double(llama_parameter_count(lc)) / 1e6);
  }
  if (o.tensor_parallel > 1)
    std::printf(
        "  tensor parallel over %d MPI ranks: this rank holds %d of the query heads and %d "
        "of the KV heads\n",
        o.tensor_parallel, ec.model->spec().num_qo_heads, ec.model->spec().num_kv_heads);
  std::fflush(stdout);
  ec.kv_memory_bytes = kv_bytes;
  ec.page_size = o.page_size;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.chunked_prefill = o.chunked_prefill;
  ec.deterministic = o.deterministic;
  ec.enable_prefix_caching = o.prefix_caching;
  ec.host_kv_memory_bytes = o.host_kv_memory_mib > 0 ? kv_memory_bytes(o.host_kv_memory_mib) : 0;
  ec.bf16_products = o.bf16_products;
  ec.exact_products = o.exact_products;
  ec.pin_threads = o.pin_threads;
  ec.kv_dtype = o.kv_dtype;
  ec.int8_activations = o.int8_activations;
  ec.seed = o.seed;
  Engine engine(ec);
  check_trace_fits(trace, engine);
  std::printf("  workload %s: %zu requests, %s; KV cache %.1f MiB = %lld pages x %d tokens (%s)\n",
              o.workload.c_str(), trace.size(),
              o.request_rate > 0 ? detail::concat("Poisson ", o.request_rate, " req/s").c_str()
                                 : "all at once",
              mib, static_cast<long long>(engine.cache().num_pages()), o.page_size,
              std::string(dtype_name(o.kv_dtype)).c_str());
  std::printf("  prefix caching %s; host KV tier %.1f MiB; bf16 products %s; int8 activations %s\n",
              o.prefix_caching ? "on" : "off", o.host_kv_memory_mib,
              bf16_products_report(engine::activation_policy(ec)).c_str(),
              int8_activations_report(engine::activation_policy(ec)).c_str());
  const AttentionProducts attention = attention_products(engine.cache().config());
  std::printf("  attention products (where timed faster on this CPU): prefill %s, decode %s\n",
              attention.prefill.c_str(), attention.decode.c_str());
  const std::string blas = engine::blas_kernels(), onednn = engine::onednn_kernels();
  std::printf("  prefill's products: %s; OpenBLAS kernels%s: %s\n",
              onednn.empty() ? "OpenBLAS" : onednn.c_str(),
              onednn.empty() ? "" : " (deterministic mode)",
              blas.empty() ? "not OpenBLAS" : blas.c_str());
  std::fflush(stdout);

  std::vector<RequestTiming> timing;
  std::vector<StepSample> steps;
  serve(engine, trace, timing, steps);
  ServeSummary summary = summarize(timing, steps, o.page_size);
  const EngineStats st = engine.stats();
  summary.preemptions = st.num_preemptions;
  add_cache_figures(summary, trace, st, o.prefix_caching);
  summary.num_pages = st.num_pages;
  summary.overhead_share =
      st.seconds_in_steps > 0 ? 1.0 - st.seconds_in_model / st.seconds_in_steps : 0.0;

  const std::int64_t capacity = engine.cache().num_pages() * o.page_size;
  std::vector<ReplayResult> contiguous;
  for (ReservePolicy policy : {ReservePolicy::kMaxLength, ReservePolicy::kExactLength})
    contiguous.push_back(replay_contiguous(trace, {policy, capacity, 2048, o.max_num_seqs}));
  print_report(stdout, summary, contiguous);
  print_tensor_parallel_times(st);
  // After the run: the probes' seconds stay out of its clock, and they load
  // the machine as the run did (all OpenMP threads).
  std::optional<ProbeFigures> probes;
  if (o.probes) probes = measure_probes(o.quick);
  const nlohmann::ordered_json roofline =
      roofline_json(model_cost(o.model, ec.model->spec()), steps, probes);
  print_roofline(stdout, roofline);
  if (!o.json.empty()) {
    const RunInfo info = {
        {"model", o.model},
        {"workload", o.workload},
        {"requests", trace.size()},
        {"request_rate", o.request_rate > 0 ? nlohmann::ordered_json(o.request_rate) : nullptr},
        {"kv_memory_mib", mib},
        {"page_size", o.page_size},
        {"max_num_seqs", o.max_num_seqs},
        {"max_num_batched_tokens", o.max_num_batched_tokens},
        {"chunked_prefill", o.chunked_prefill},
        {"deterministic", o.deterministic},
        {"prefix_caching", o.prefix_caching},
        {"host_kv_memory_mib", o.host_kv_memory_mib},
        {"bf16_products", o.bf16_products},
        {"exact_products", o.exact_products},
        {"blas_kernels", blas},
        {"onednn_kernels", onednn},
        {"pin_threads", o.pin_threads},
        {"kv_cache_dtype", std::string(dtype_name(o.kv_dtype))},
        {"int8_activations", o.int8_activations},
        {"int8_decode_rows", engine::int8_decode_rows(engine::activation_policy(ec))},
        {"int8_tiles", engine::int8_tiles_name(engine::int8_tiles())},
        {"attention_prefill_products", attention.prefill},
        {"attention_decode_products", attention.decode},
        {"tensor_parallel", o.tensor_parallel},
        {"seed", o.seed}};
    nlohmann::ordered_json doc = serve_json(info, summary, contiguous, steps, timing);
    doc["roofline"] = roofline;  // bench/scaling.sh's input
    write_json(json_file, o.json, doc);
    std::printf("\n  wrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace pagedattn::tools
