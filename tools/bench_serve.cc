// bench-serve: a workload through the engine in real time (arrivals on the
// wall clock), then the report and the contiguous-reservation replay.
#include "bench_serve.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "bench_serve_options.h"
#include "contiguous_replay.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama.h"
#include "progress_bar.h"
#include "serve_metrics.h"
#include "serve_report.h"
#include "workload.h"

namespace pagedattn::tools {
namespace {

struct PresetDefaults {
  std::int32_t num_requests;
  double length_scale;  // workload lengths are scaled to the model's speed
  double kv_memory_mib;
};

PresetDefaults preset_defaults(const std::string& model) {
  if (model == "small") return {16, 0.5, 256};
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
  return make_workload(w);
}

std::vector<std::int32_t> synthetic_prompt(std::int32_t len, std::size_t request, std::int32_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(len));
  for (std::int32_t i = 0; i < len; ++i)
    t[std::size_t(i)] = static_cast<std::int32_t>((request * 7919 + std::size_t(i) * 104729) % std::size_t(vocab));
  return t;
}

// Serves the trace; fills per-request timings and per-step samples.
void serve(Engine& engine, const std::vector<TraceRequest>& trace, std::vector<RequestTiming>& timing,
           std::vector<StepSample>& steps) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const std::int32_t vocab = engine.config().model->spec().vocab_size;
  std::vector<std::vector<std::int32_t>> sample_tokens(trace.size());
  timing.assign(trace.size(), {});
  ProgressBar bar(stderr, std::ssize(trace));
  std::size_t next = 0;
  std::int64_t completed = 0, produced = 0;
  while (next < trace.size() || engine.has_unfinished()) {
    for (; next < trace.size() && trace[next].arrival <= now(); ++next) {
      const TraceRequest& r = trace[next];
      SamplingParams p;
      p.max_tokens = r.output_len;
      p.n = r.n;
      p.temperature = r.n > 1 ? 1.0f : 0.0f;  // parallel samples must differ
      p.ignore_eos = true;                     // the trace fixes output lengths
      engine.add_request(synthetic_prompt(r.prompt_len, next, vocab), p);  // ids are 0, 1, ...
      timing[next].arrival = r.arrival;
      sample_tokens[next].assign(std::size_t(r.n), 0);
    }
    if (!engine.has_unfinished()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(trace[next].arrival - now()));
      continue;
    }
    const std::vector<RequestOutput> outputs = engine.step();
    const double t = now();
    for (const RequestOutput& out : outputs) {
      RequestTiming& rt = timing[std::size_t(out.request_id)];
      for (const SampleOutput& s : out.samples) {
        rt.output_tokens += std::ssize(s.new_token_ids);
        produced += std::ssize(s.new_token_ids);
        sample_tokens[std::size_t(out.request_id)][std::size_t(s.index)] += std::ssize(s.new_token_ids);
        if (rt.first_token < 0 && !s.new_token_ids.empty()) rt.first_token = t;
      }
      if (out.finished) {
        rt.finish = t;
        for (std::int32_t n : sample_tokens[std::size_t(out.request_id)])
          rt.longest_sample = std::max(rt.longest_sample, n);
        ++completed;
      }
    }
    const EngineStats st = engine.stats();
    steps.push_back({t, st.num_running_seqs, st.last_step_tokens, st.pages_in_use,
                     st.token_states_stored, st.pages_if_unshared, produced});
    bar.update(completed, detail::concat("running ", st.num_running_seqs, "  pages ",
                                         st.pages_in_use * 100 / st.num_pages, "%  ",
                                         static_cast<long long>(produced / std::max(t, 1e-9)), " tok/s"));
  }
  bar.finish();
}

}  // namespace

int run_bench_serve(int argc, char** argv) {
  const BenchServeOptions o = parse_bench_serve_options(argc, argv, 2);
  if (o.help) {
    std::fputs(bench_serve_usage(), stdout);
    return 0;
  }
  const PresetDefaults d = preset_defaults(o.model);
  const LlamaConfig lc = llama_preset(o.model);
  const std::vector<TraceRequest> trace = build_trace(o, d);
  std::printf("pagedattn bench-serve: model '%s' (%.1fM parameters; weights are synthetic and seeded,\n"
              "  so generated text is meaningless - the timing and memory figures are real)\n",
              o.model.c_str(), double(llama_parameter_count(lc)) / 1e6);
  std::fflush(stdout);
  EngineConfig ec;
  ec.model = make_llama_model(lc);
  const double mib = o.kv_memory_mib > 0 ? o.kv_memory_mib : d.kv_memory_mib;
  ec.kv_memory_bytes = static_cast<std::int64_t>(mib * (1 << 20));
  ec.page_size = o.page_size;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.chunked_prefill = o.chunked_prefill;
  ec.deterministic = o.deterministic;
  ec.seed = o.seed;
  Engine engine(ec);
  std::printf("  workload %s: %zu requests, %s; KV cache %.1f MiB = %lld pages x %d tokens (f16)\n",
              o.workload.c_str(), trace.size(),
              o.request_rate > 0 ? detail::concat("Poisson ", o.request_rate, " req/s").c_str()
                                 : "all at once",
              mib, static_cast<long long>(engine.cache().num_pages()), o.page_size);
  std::fflush(stdout);

  std::vector<RequestTiming> timing;
  std::vector<StepSample> steps;
  serve(engine, trace, timing, steps);
  ServeSummary summary = summarize(timing, steps, o.page_size);
  const EngineStats st = engine.stats();
  summary.preemptions = st.num_preemptions;
  summary.num_pages = st.num_pages;
  summary.overhead_share = st.seconds_in_steps > 0 ? 1.0 - st.seconds_in_model / st.seconds_in_steps : 0.0;

  const std::int64_t capacity = engine.cache().num_pages() * o.page_size;
  std::vector<ReplayResult> contiguous;
  for (ReservePolicy policy : {ReservePolicy::kMaxLength, ReservePolicy::kExactLength})
    contiguous.push_back(replay_contiguous(trace, {policy, capacity, 2048, o.max_num_seqs}));
  print_report(stdout, summary, contiguous);
  if (!o.json.empty()) {
    const RunInfo info = {{"model", o.model}, {"workload", o.workload},
                          {"requests", std::to_string(trace.size())},
                          {"request_rate", o.request_rate > 0 ? std::to_string(o.request_rate) : "inf"},
                          {"kv_memory_mib", std::to_string(mib)},
                          {"page_size", std::to_string(o.page_size)},
                          {"deterministic", o.deterministic ? "true" : "false"}};
    write_json(o.json, info, summary, contiguous, steps, timing);
    std::printf("\n  wrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace pagedattn::tools
