// Benchmarks of the paged attention kernel, each reported as a fraction of
// this machine's limits measured in the same process (machine_probes.h):
//
//   BM_ProbeReadBandwidth, BM_ProbeFmaPeak   the probes themselves
//   BM_ProbeReadRuns     the read probe over shuffled runs of 4 / 32 / 1024 KiB;
//                        /prefetched: each run's lines prefetched to L2 two
//                        runs ahead, as the decode kernels prefetch
//   BM_Decode            AttentionRunner (plan + kernel) per decode step;
//                        K+V GB/s and % of the read-bandwidth probe
//   BM_DecodePlanned     paged_attention with a plan made once (f16 grid)
//   BM_DecodeRunnerVsPlanned  the two interleaved, and plan_attention alone
//   BM_DecodeE4M3PageFlags  fp8 e4m3 decode with page_may_hold_nan (as a
//                        PagedKVCache's storage has) against the same bytes
//                        without it (a NaN-code scan per block), interleaved
//   BM_DecodeQuantSpeedup  fp8 / int8 KV against bf16 KV, interleaved; int8
//                        also with int8 products allowed (/int8_products),
//                        fp8 with f16 products allowed (/f16_products) and
//                        with bf16 products on both sides (/bf16_products)
//   BM_Gqa8VsGqa4        64x8 against 32x8 heads, f16 b1 x 16k, interleaved;
//                        also with f16 or bf16 products allowed
//                        (/f16_products, /bf16_products), and bf16 KV with
//                        bf16 products
//   BM_PagedVsContiguous page 16 (shuffled) against one page per sequence,
//                        the same bytes, interleaved; /pages:in_order with
//                        the pages side by side (the indirection alone)
//   BM_Prefill, BM_ChunkedPrefill   causal; GFLOP/s and % of the FMA probe
//
// Working sets: every workload owns enough independent copies of its K/V
// pages (separate, shuffled page ranges of one pool) that together they are
// at least max(256 MiB, 4 x L3); iterations rotate through the copies, so a
// decode step never finds its K/V in the last-level cache. Workloads larger
// than a cap (default 2.5 GiB, env PAGEDATTN_BENCH_MAX_GIB) are not
// registered; the program lists them on stderr.
//
// Timing is manual (steady_clock around the one call) and wall-clock: the
// kernel runs on all OpenMP threads. After the run a summary of the
// project's performance targets, met or missed, goes to stderr.
//
// The machine is shared: every benchmark reports others_cores, the CPU that
// other processes (and hypervisor steal) used while it ran, from /proc/stat.
// Runs above 0.1 core are labelled "busy"; the start-up probes wait (at most
// 30 s) for a quiet second and are repeated if they were busy anyway;
// benchmarks whose every run was busy are run again
// at the end after a quiet second (--retry_busy=N rounds, default 2; their
// later runs carry the label "retry N"), and the summary prefers quiet runs.
// --benchmark_out is handled here (not by Google Benchmark) so that those
// re-runs land in the same file.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "attention_workload.h"
#include "machine_probes.h"
#include "pagedattn/attention.h"
#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"

namespace {

namespace pa = pagedattn;
namespace pb = pagedattn::bench;
using pa::DType;
using namespace pagedattn::bench;  // workloads and probes (perf/)
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// --- the project's targets (docs/benchmarks.md, "Attention kernels") ------------------
constexpr double kDecodeBandwidthTarget = 0.80;  // of the read-bandwidth probe
constexpr double kQuantSpeedupTarget = 1.6;      // fp8 / int8 over bf16 at kv_len 16k
constexpr double kPrefillFmaTarget = 0.40;       // of the FMA probe
constexpr double kPagedOverheadTarget = 1.03;    // paged time / contiguous time
constexpr double kGqaOverheadTarget = 1.15;      // GQA 8 time / GQA 4 time (the same K/V)
// A benchmark during which other processes (and hypervisor steal) used more
// than this many cores is marked [busy] in the summary.
constexpr double kContendedCores = 0.10;
// Prefill calls take 0.05 - 1.5 s (and a paired batch-32 decode iteration
// 0.35 s): measure those for longer than the default 0.5 s so that a
// benchmark is more than one or two calls.
constexpr double kLongMinSeconds = 2.0;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::size_t max_workload_bytes() {
  static const std::size_t cap = [] {
    if (const char* v = std::getenv("PAGEDATTN_BENCH_MAX_GIB")) {
      const double gib = std::atof(v);
      if (gib > 0) return static_cast<std::size_t>(gib * double(kGiB));
    }
    return static_cast<std::size_t>(2.5 * double(kGiB));
  }();
  return cap;
}

// Google Benchmark calls a benchmark function several times (a trial run,
// then the measured one): workloads survive between calls until a benchmark
// needs different ones.
class WorkloadCache {
 public:
  void retain_only(const std::vector<Config>& keep) {
    std::erase_if(cache_, [&](const auto& entry) {
      return std::none_of(keep.begin(), keep.end(),
                          [&](const Config& c) { return c.key() == entry.first; });
    });
  }
  std::shared_ptr<Workload> get(const Config& c, const Workload* copy_from = nullptr) {
    auto& slot = cache_[c.key()];
    if (!slot) slot = std::make_shared<Workload>(c, copy_from);
    return slot;
  }

 private:
  std::map<std::string, std::shared_ptr<Workload>> cache_;
};

WorkloadCache& cache() {
  static WorkloadCache c;
  return c;
}

// --- what the run measured, for the summary ---------------------------------------------

// Counters of every reported run, by registered benchmark name,
// in the order they ran; the summary takes the median over repetitions.
struct Recorded {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::map<std::string, double>>> runs;  // iteration runs
  std::map<std::string, std::map<std::string, double>> medians;            // "median" aggregates
};

Recorded& recorded() {
  static Recorded r;
  return r;
}

// Forwards to the display reporter (and to the --benchmark_out file
// reporter, which this program runs itself so that re-runs of busy
// benchmarks land in the same file) and keeps the counters of what is
// reported (not of Google Benchmark's trial runs). The context goes out once
// and Finalize only from finish(), so several RunSpecifiedBenchmarks calls
// make one console listing and one valid JSON document.
class RecordingReporter : public benchmark::BenchmarkReporter {
 public:
  RecordingReporter(std::unique_ptr<benchmark::BenchmarkReporter> display,
                    std::unique_ptr<benchmark::BenchmarkReporter> file,
                    std::unique_ptr<std::ofstream> stream)
      : display_(std::move(display)), file_(std::move(file)), stream_(std::move(stream)) {
    if (file_) file_->SetOutputStream(stream_.get());
  }
  bool ReportContext(const Context& context) override {
    if (context_done_) return true;
    context_done_ = true;
    const bool ok = display_->ReportContext(context);
    return file_ ? file_->ReportContext(context) && ok : ok;
  }
  void ReportRuns(const std::vector<Run>& reports) override {
    std::vector<Run> labelled = reports;
    for (Run& run : labelled) {
      if (!label_.empty())
        run.report_label = run.report_label.empty() ? label_ : run.report_label + "; " + label_;
      if (run.error_occurred) continue;
      // The registered name, without "/min_time:..." and "/manual_time".
      const std::string& name = run.run_name.function_name;
      std::map<std::string, double> counters;
      for (const auto& [key, counter] : run.counters) counters[key] = counter.value;
      Recorded& r = recorded();
      if (std::find(r.order.begin(), r.order.end(), name) == r.order.end()) r.order.push_back(name);
      if (run.run_type == Run::RT_Iteration)
        r.runs[name].push_back(counters);
      else if (run.aggregate_name == "median")
        r.medians[name] = counters;
    }
    display_->ReportRuns(labelled);
    if (file_) file_->ReportRuns(labelled);
  }
  void Finalize() override {}
  void finish() {
    display_->Finalize();
    if (file_) file_->Finalize();
  }
  // Appended to the label of every run reported from now on.
  void set_label(std::string label) { label_ = std::move(label); }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> display_, file_;
  std::unique_ptr<std::ofstream> stream_;
  bool context_done_ = false;
  std::string label_;
};

std::unique_ptr<benchmark::BenchmarkReporter> make_reporter(const std::string& format, bool color,
                                                            bool tabular) {
  if (format == "json") return std::make_unique<benchmark::JSONReporter>();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored \
    "-Wdeprecated-declarations"  // still what --benchmark_format=csv gives
  if (format == "csv") return std::make_unique<benchmark::CSVReporter>();
#pragma GCC diagnostic pop
  int options = benchmark::ConsoleReporter::OO_None;
  if (color) options |= benchmark::ConsoleReporter::OO_Color;
  if (tabular) options |= benchmark::ConsoleReporter::OO_Tabular;
  return std::make_unique<benchmark::ConsoleReporter>(
      static_cast<benchmark::ConsoleReporter::OutputOptions>(options));
}

bool flag_true(const std::string& v) {
  return v == "true" || v == "yes" || v == "1";
}

// This program's own command line: the reporter flags of Google Benchmark
// (read here; --benchmark_out and --benchmark_out_format are removed from
// argv and handled by RecordingReporter) and --retry_busy=N.
struct Options {
  std::unique_ptr<RecordingReporter> reporter;
  int retry_busy = 2;
  bool list_only = false;
};

Options parse_options(int& argc, char** argv) {
  std::string format = "console", color = "auto", tabular = "false", out, out_format = "json";
  Options o;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& flag, std::string& dest) {
      if (a.rfind(flag + "=", 0) != 0) return false;
      dest = a.substr(flag.size() + 1);
      return true;
    };
    std::string retry, list;
    value("--benchmark_format", format);
    value("--benchmark_color", color);
    value("--benchmark_counters_tabular", tabular);
    if (a == "--benchmark_list_tests" || (value("--benchmark_list_tests", list) && flag_true(list)))
      o.list_only = true;
    if (value("--benchmark_out", out) || value("--benchmark_out_format", out_format)) continue;
    if (value("--retry_busy", retry)) {
      o.retry_busy = std::max(0, std::atoi(retry.c_str()));
      continue;
    }
    argv[kept++] = argv[i];
  }
  argc = kept;
  const bool use_color = flag_true(color) || (color == "auto" && isatty(STDOUT_FILENO));
  std::unique_ptr<benchmark::BenchmarkReporter> file;
  std::unique_ptr<std::ofstream> stream;
  if (!out.empty()) {
    stream = std::make_unique<std::ofstream>(out);
    if (!*stream) {
      std::fprintf(stderr, "cannot open --benchmark_out=%s\n", out.c_str());
      std::exit(1);
    }
    file = make_reporter(out_format, false, false);
  }
  o.reporter = std::make_unique<RecordingReporter>(
      make_reporter(format, use_color, flag_true(tabular)), std::move(file), std::move(stream));
  return o;
}

bool is_busy(const std::map<std::string, double>& counters) {
  const auto it = counters.find("others_cores");
  return it != counters.end() && it->second > kContendedCores;
}

// Names of the benchmarks all of whose recorded runs were busy.
std::vector<std::string> busy_benchmarks() {
  std::vector<std::string> out;
  const Recorded& r = recorded();
  for (const std::string& name : r.order) {
    const auto it = r.runs.find(name);
    if (it == r.runs.end() || it->second.empty()) continue;
    if (std::all_of(it->second.begin(), it->second.end(), is_busy)) out.push_back(name);
  }
  return out;
}

// Median over the recorded runs of `name` (or its "median" aggregate).
std::map<std::string, double> median_counters(const std::string& name) {
  const Recorded& r = recorded();
  if (auto it = r.medians.find(name); it != r.medians.end()) return it->second;
  std::map<std::string, double> out;
  const auto it = r.runs.find(name);
  if (it == r.runs.end() || it->second.empty()) return out;
  // Runs on a quiet machine if there are any, else all of them.
  std::vector<std::map<std::string, double>> runs;
  for (const auto& run : it->second)
    if (!is_busy(run)) runs.push_back(run);
  if (runs.empty()) runs = it->second;
  for (const auto& [key, unused] : runs.front()) {
    std::vector<double> v;
    for (const auto& run : runs)
      if (auto c = run.find(key); c != run.end()) v.push_back(c->second);
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    out[key] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  return out;
}

std::vector<std::string>& skipped() {
  static std::vector<std::string> s;
  return s;
}

double read_bw_gbps() {
  return pb::machine_read_bandwidth().best_gbps;
}
double fma_peak_gflops() {
  return pb::machine_fma_peak().best_gflops;
}

// Wall time of timed calls, summed.
struct Timer {
  double total = 0.0;
  std::int64_t calls = 0;
  template <class F>
  double time(F&& f) {
    const auto t0 = Clock::now();
    f();
    const double s = seconds_between(t0, Clock::now());
    total += s;
    ++calls;
    return s;
  }
  double ms_per_call() const { return calls ? total / double(calls) * 1e3 : 0.0; }
};

// Decode / prefill metrics of `c` timed by `t`.
std::map<std::string, double> kernel_metrics(const Config& c, const Timer& t) {
  std::map<std::string, double> m;
  const double seconds = t.total / double(std::max<std::int64_t>(1, t.calls));
  m["ms_per_call"] = seconds * 1e3;
  m["KV_GBps"] = c.kv_bytes_per_call() / seconds / 1e9;
  m["pct_read_bw"] = 100.0 * m["KV_GBps"] / read_bw_gbps();
  m["GFLOPs"] = c.flops_per_call() / seconds / 1e9;
  m["pct_fma_peak"] = 100.0 * m["GFLOPs"] / fma_peak_gflops();
  return m;
}

// Sets the counters; labels the run "busy" when other processes used more
// than kContendedCores meanwhile.
void publish(benchmark::State& state, const std::map<std::string, double>& metrics) {
  for (const auto& [key, value] : metrics) state.counters[key] = value;
  if (const auto it = metrics.find("others_cores");
      it != metrics.end() && it->second > kContendedCores) {
    char label[64];
    std::snprintf(label, sizeof label, "busy: others used %.2f cores", it->second);
    state.SetLabel(label);
  }
}

// One call with a 64-byte aligned workspace for a fixed plan.
class PlannedCall {
 public:
  explicit PlannedCall(const pa::AttentionParams& p) {
    const pa::AttentionShape shape{p.num_qo_heads, p.kv.num_kv_heads, p.kv.head_dim,
                                   p.kv.v_head_dim};
    plan_ = pa::plan_attention(p.table, shape, p.options);
    storage_.resize(plan_.workspace_bytes + 64);
  }
  void run(const pa::AttentionParams& p) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    const std::size_t pad = (64 - base % 64) % 64;
    pa::paged_attention(p, plan_,
                        std::span<std::byte>(storage_.data() + pad, plan_.workspace_bytes));
  }

 private:
  pa::AttentionPlan plan_;
  std::vector<std::byte> storage_;
};

// --- benchmarks ---------------------------------------------------------------------------

// Decode (or prefill) through AttentionRunner, or with a plan made once.
void run_kernel(benchmark::State& state, const Config& c, bool planned,
                std::map<std::string, double> extra = {}) {
  try {
    cache().retain_only({c});
    const auto w = cache().get(c);
    pa::AttentionRunner runner;
    std::unique_ptr<PlannedCall> fixed;
    if (planned) fixed = std::make_unique<PlannedCall>(w->params(0));
    auto call = [&](std::int32_t copy) {
      const pa::AttentionParams p = w->params(copy);
      return [&, p] { planned ? fixed->run(p) : runner.run(p); };
    };
    call(w->copies() - 1)();  // warm-up: workspace, OpenMP team
    Timer t;
    std::int32_t copy = 0;
    const pb::CpuSample s0 = pb::sample_cpu();
    for (auto _ : state) {
      auto f = call(copy);
      state.SetIterationTime(t.time(f));
      copy = (copy + 1) % w->copies();
    }
    auto m = kernel_metrics(c, t);
    m["others_cores"] = pb::other_cores_between(s0, pb::sample_cpu());
    if (c.q_len == 1) {  // decode: bandwidth-bound
      m.erase("GFLOPs");
      m.erase("pct_fma_peak");
    } else {  // prefill: compute-bound
      m.erase("KV_GBps");
      m.erase("pct_read_bw");
    }
    m["copies"] = w->copies();
    m["working_set_MiB"] = double(w->bytes()) / double(kMiB);
    for (const auto& [k, v] : extra) m[k] = v;
    publish(state, m);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Two workloads, alternating which goes first, one call each per iteration;
// `a` is the baseline, `b` runs with the plan options `b_options`. Reports
// both and time(a) / time(b).
void run_pair(benchmark::State& state, const Config& a, const Config& b, bool b_copies_a,
              const std::string& a_label, const std::string& b_label, const std::string& ratio_name,
              bool ratio_b_over_a, const pa::AttentionPlanOptions& b_options,
              const pa::AttentionPlanOptions& a_options = {}) {
  try {
    cache().retain_only({a, b});
    const auto wa = cache().get(a);
    const auto wb = cache().get(b, b_copies_a ? wa.get() : nullptr);
    pa::AttentionRunner runner(a_options), runner_b(b_options);
    runner.run(wa->params(wa->copies() - 1));
    runner_b.run(wb->params(wb->copies() - 1));
    Timer ta, tb;
    std::int32_t ca = 0, cb = 0;
    bool a_first = true;
    const pb::CpuSample s0 = pb::sample_cpu();
    for (auto _ : state) {
      const pa::AttentionParams pa_ = wa->params(ca), pb_ = wb->params(cb);
      double s = 0.0;
      if (a_first) {
        s += ta.time([&] { runner.run(pa_); });
        s += tb.time([&] { runner_b.run(pb_); });
      } else {
        s += tb.time([&] { runner_b.run(pb_); });
        s += ta.time([&] { runner.run(pa_); });
      }
      state.SetIterationTime(s);
      a_first = !a_first;
      ca = (ca + 1) % wa->copies();
      cb = (cb + 1) % wb->copies();
    }
    const auto ma = kernel_metrics(a, ta), mb = kernel_metrics(b, tb);
    std::map<std::string, double> m;
    m["others_cores"] = pb::other_cores_between(s0, pb::sample_cpu());
    m[a_label + "_ms"] = ma.at("ms_per_call");
    m[b_label + "_ms"] = mb.at("ms_per_call");
    m[a_label + "_GBps"] = ma.at("KV_GBps");
    m[b_label + "_GBps"] = mb.at("KV_GBps");
    m[a_label + "_pct_read_bw"] = ma.at("pct_read_bw");
    m[b_label + "_pct_read_bw"] = mb.at("pct_read_bw");
    m[ratio_name] = ratio_b_over_a ? mb.at("ms_per_call") / ma.at("ms_per_call")
                                   : ma.at("ms_per_call") / mb.at("ms_per_call");
    publish(state, m);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// AttentionRunner (plans every call) against paged_attention with a plan
// made once, on the same workload, alternating call by call; also times
// plan_attention alone.
void run_planning_cost(benchmark::State& state, const Config& c) {
  try {
    cache().retain_only({c});
    const auto w = cache().get(c);
    pa::AttentionRunner runner;
    PlannedCall fixed(w->params(0));
    runner.run(w->params(w->copies() - 1));
    fixed.run(w->params(w->copies() - 1));
    Timer tr, tf, tp;
    std::int32_t copy = 0;
    bool runner_first = true;
    const pb::CpuSample s0 = pb::sample_cpu();
    for (auto _ : state) {
      const pa::AttentionParams p = w->params(copy);
      double s = 0.0;
      if (runner_first) {
        s += tr.time([&] { runner.run(p); });
        s += tf.time([&] { fixed.run(p); });
      } else {
        s += tf.time([&] { fixed.run(p); });
        s += tr.time([&] { runner.run(p); });
      }
      state.SetIterationTime(s);
      runner_first = !runner_first;
      copy = (copy + 1) % w->copies();
    }
    const pa::AttentionParams p = w->params(0);
    const pa::AttentionShape shape{p.num_qo_heads, p.kv.num_kv_heads, p.kv.head_dim,
                                   p.kv.v_head_dim};
    for (int i = 0; i < 20; ++i)
      tp.time([&] { benchmark::DoNotOptimize(pa::plan_attention(p.table, shape, p.options)); });
    publish(state, {{"others_cores", pb::other_cores_between(s0, pb::sample_cpu())},
                    {"runner_ms", tr.ms_per_call()},
                    {"planned_ms", tf.ms_per_call()},
                    {"runner_over_planned", tr.ms_per_call() / tf.ms_per_call()},
                    {"plan_attention_us", tp.ms_per_call() * 1e3}});
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Reads `bytes` once per iteration (work.repeat times with work): split
// between the threads in order (run_kib 0: the read probe), or as shuffled
// runs of run_kib KiB, what the access pattern of a paged cache (one run per
// page and head) costs before any arithmetic, or with `work` on what it reads.
void run_read_probe(benchmark::State& state, std::size_t bytes, std::size_t run_kib,
                    pb::RunPrefetch prefetch = pb::RunPrefetch::kNone, pb::RunWork work = {}) {
  pb::HugeBuffer buf(bytes);
  pb::touch_parallel(buf.data(), buf.size());
  auto pass = [&] {
    return run_kib == 0
               ? pb::read_pass_seconds(buf.data(), bytes, 0)
               : pb::read_runs_pass_seconds(buf.data(), bytes, run_kib * 1024, 0, prefetch, work);
  };
  const std::size_t bytes_read = bytes * std::size_t(std::max(1, work.repeat));
  pass();
  Timer t;
  double best = 0.0;
  const pb::CpuSample s0 = pb::sample_cpu();
  for (auto _ : state) {
    const double s = pass();
    t.total += s;
    ++t.calls;
    best = std::max(best, double(bytes_read) / s / 1e9);
    state.SetIterationTime(s);
  }
  const double gbps = double(bytes_read) * double(t.calls) / t.total / 1e9;
  publish(state, {{"others_cores", pb::other_cores_between(s0, pb::sample_cpu())},
                  {"GBps", gbps},
                  {"best_pass_GBps", best},
                  {"pct_read_bw", 100.0 * gbps / read_bw_gbps()},
                  {"threads", double(omp_get_max_threads())},
                  {"reference_GBps", read_bw_gbps()}});
}

void run_fma_probe(benchmark::State& state) {
  // ~20 ms passes.
  std::int64_t iterations = 1 << 16;
  double s = pb::fma_pass_seconds(iterations, 0);
  while (s < 0.005) s = pb::fma_pass_seconds(iterations *= 4, 0);
  iterations = std::max<std::int64_t>(1, std::int64_t(double(iterations) * 0.02 / s));
  const double flops = pb::fma_pass_flops_per_thread(iterations) * omp_get_max_threads();
  Timer t;
  double best = 0.0;
  const pb::CpuSample s0 = pb::sample_cpu();
  for (auto _ : state) {
    const double pass = pb::fma_pass_seconds(iterations, 0);
    t.total += pass;
    ++t.calls;
    best = std::max(best, flops / pass / 1e9);
    state.SetIterationTime(pass);
  }
  publish(state, {{"others_cores", pb::other_cores_between(s0, pb::sample_cpu())},
                  {"GFLOPs", flops * double(t.calls) / t.total / 1e9},
                  {"best_pass_GFLOPs", best},
                  {"threads", double(omp_get_max_threads())},
                  {"reference_GFLOPs", fma_peak_gflops()}});
}

// --- registration -------------------------------------------------------------------------

std::string heads_name(const Config& c) {
  return std::to_string(c.qo_heads) + "x" + std::to_string(c.kv_heads);
}

// Every workload of a benchmark must stay under the cap (a pair may hold two).
bool fits(const std::string& name, std::initializer_list<Config> configs) {
  std::size_t largest = 0;
  for (const Config& c : configs) largest = std::max(largest, c.storage_bytes());
  if (largest <= max_workload_bytes()) return true;
  char buf[64];
  std::snprintf(buf, sizeof buf, " (%.2f GiB of K/V)", double(largest) / double(kGiB));
  skipped().push_back(name + buf);
  return false;
}

benchmark::internal::Benchmark* add(const std::string& name,
                                    std::function<void(benchmark::State&)> fn) {
  return benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& s) { fn(s); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

Config decode(DType kv, std::int32_t qo_heads, std::int32_t batch, std::int32_t kv_len) {
  Config c;
  c.kv = kv;
  c.qo_heads = qo_heads;
  c.batch = batch;
  c.kv_len = kv_len;
  return c;
}

Config prefill(std::int32_t q_len, std::int32_t kv_len) {
  Config c;
  c.q_len = q_len;
  c.kv_len = kv_len;
  return c;
}

void register_all() {
  for (std::size_t mib : {std::size_t{1024}, std::size_t{16}}) {
    const std::string name = "BM_ProbeReadBandwidth/MiB:" + std::to_string(mib);
    add(name, [=](benchmark::State& s) { run_read_probe(s, mib * kMiB, 0); });
  }
  for (std::size_t kib : {std::size_t{4}, std::size_t{32}, std::size_t{1024}}) {
    const std::string name = "BM_ProbeReadRuns/KiB:" + std::to_string(kib);
    add(name, [=](benchmark::State& s) { run_read_probe(s, 1024 * kMiB, kib); });
    add(name + "/prefetched", [=](benchmark::State& s) {
      run_read_probe(s, 1024 * kMiB, kib, pb::RunPrefetch::kTwoRunsAhead);
    });
  }
  // The paged read probe with FMAs on what it reads, from memory and from
  // cache (512 KiB per thread, in L2, walked 512 times a pass): how much
  // of the stream a loop keeps when its arithmetic runs at a given multiple
  // of the stream's rate (docs/benchmarks.md, "What decode keeps of the
  // stream").
  for (int fmas : {0, 4, 8, 12, 16, 24}) {
    const std::string name = "BM_ProbeReadRunsWithWork/fmas_per_line:" + std::to_string(fmas);
    add(name + "/from:memory", [=](benchmark::State& s) {
      run_read_probe(s, 1024 * kMiB, 32, pb::RunPrefetch::kTwoRunsAhead, {fmas, 1});
    });
    add(name + "/from:cache", [=](benchmark::State& s) {
      const auto bytes = std::size_t(omp_get_max_threads()) * kMiB / 2;
      run_read_probe(s, bytes, 32, pb::RunPrefetch::kTwoRunsAhead, {fmas, 512});
    });
  }
  add("BM_ProbeFmaPeak", [](benchmark::State& s) { run_fma_probe(s); });

  const std::int32_t kv_lens[] = {4096, 16384, 32768};
  const std::int32_t batches[] = {1, 8, 32};
  auto decode_name = [](const std::string& bm, const Config& c) {
    return bm + "/kv:" + short_name(c.kv) + "/heads:" + heads_name(c) +
           "/batch:" + std::to_string(c.batch) + "/kv_len:" + std::to_string(c.kv_len);
  };

  // Decode grid: heads 32x8 for every KV type, 64x8 for f16 / bf16.
  struct Grid {
    DType kv;
    std::int32_t qo_heads;
  };
  const Grid grids[] = {{DType::kF16, 32},  {DType::kBF16, 32}, {DType::kFP8E4M3, 32},
                        {DType::kINT8, 32}, {DType::kF32, 32},  {DType::kF16, 64},
                        {DType::kBF16, 64}};
  for (const Grid& g : grids)
    for (std::int32_t kv_len : kv_lens)
      for (std::int32_t batch : batches) {
        const Config c = decode(g.kv, g.qo_heads, batch, kv_len);
        const std::string name = decode_name("BM_Decode", c);
        if (!fits(name, {c})) continue;
        add(name, [=](benchmark::State& s) { run_kernel(s, c, false); });
      }
  // The same through paged_attention with a plan made once (f16, 32x8).
  for (std::int32_t kv_len : kv_lens)
    for (std::int32_t batch : batches) {
      const Config c = decode(DType::kF16, 32, batch, kv_len);
      const std::string name = decode_name("BM_DecodePlanned", c);
      if (!fits(name, {c})) continue;
      add(name, [=](benchmark::State& s) { run_kernel(s, c, true); });
    }

  // fp8 / int8 against bf16 at kv_len 16k; int8 also on int8 products
  // (AttentionPlanOptions::int8_products: vpdpbusd where the CPU has VNNI),
  // fp8 also on f16 products (f16_products: AVX512-FP16 where the CPU has it)
  // and on bf16 products (bf16_products, for both sides: vdpbf16ps where the
  // CPU has AVX512-BF16).
  struct Quant {
    DType kv;
    const char* products;  // "" (f32), "int8_products", "f16_products" or "bf16_products"
  };
  for (const Quant q : {Quant{DType::kFP8E4M3, ""}, Quant{DType::kFP8E4M3, "f16_products"},
                        Quant{DType::kFP8E4M3, "bf16_products"}, Quant{DType::kINT8, ""},
                        Quant{DType::kINT8, "int8_products"}})
    for (std::int32_t batch : batches) {
      const Config base = decode(DType::kBF16, 32, batch, 16384),
                   quant = decode(q.kv, 32, batch, 16384);
      const std::string products = q.products;
      const std::string name = decode_name("BM_DecodeQuantSpeedup", quant) + "/vs:bf16" +
                               (products.empty() ? "" : "/" + products);
      if (!fits(name, {base, quant})) continue;
      add(name, [=](benchmark::State& s) {
        run_pair(s, base, quant, false, "bf16", short_name(q.kv), "speedup", false,
                 pa::AttentionPlanOptions{.bf16_products = products == "bf16_products",
                                          .int8_products = products == "int8_products",
                                          .f16_products = products == "f16_products"});
      });
    }

  // fp8 e4m3 with the cache's page flags (page_may_hold_nan) against the
  // same bytes without them, which the kernel scans for NaN codes per block.
  for (std::int32_t batch : batches) {
    const Config plain = decode(DType::kFP8E4M3, 32, batch, 16384);
    Config flagged = plain;
    flagged.page_flags = true;
    const std::string name = decode_name("BM_DecodeE4M3PageFlags", plain) + "/vs:scan";
    if (!fits(name, {plain, flagged})) continue;
    add(name, [=](benchmark::State& s) {
      run_pair(s, plain, flagged, true, "scan", "flags", "speedup", false, {});
    });
  }

  // The cost of planning every call, paired.
  for (std::int32_t batch : {1, 32}) {
    const Config c = decode(DType::kF16, 32, batch, 16384);
    const std::string name = decode_name("BM_DecodeRunnerVsPlanned", c);
    if (fits(name, {c}))
      add(name, [=](benchmark::State& s) { run_planning_cost(s, c); })->MinTime(kLongMinSeconds);
  }

  // GQA 8 (64x8 heads) against GQA 4 (32x8), b1 x 16k: the same K/V bytes
  // for twice the query rows. f16 KV with f32 products, with f16 products
  // (AVX512-FP16 where the CPU has it) and with bf16 products (AVX512-BF16);
  // bf16 KV with bf16 products (no conversion in registers).
  const std::pair<DType, std::string> gqa_variants[] = {{DType::kF16, ""},
                                                        {DType::kF16, "f16_products"},
                                                        {DType::kF16, "bf16_products"},
                                                        {DType::kBF16, "bf16_products"}};
  for (const auto& [kv, products] : gqa_variants) {
    const Config gqa4 = decode(kv, 32, 1, 16384), gqa8 = decode(kv, 64, 1, 16384);
    const std::string name =
        decode_name("BM_Gqa8VsGqa4", gqa8) + (products.empty() ? "" : "/" + products);
    const pa::AttentionPlanOptions options{.bf16_products = products == "bf16_products",
                                           .f16_products = products == "f16_products"};
    if (fits(name, {gqa4, gqa8}))
      add(name, [=](benchmark::State& s) {
        run_pair(s, gqa4, gqa8, false, "gqa4", "gqa8", "gqa8_over_gqa4", true, options, options);
      });
  }

  // Paged (page 16) against one contiguous page per sequence: the pages
  // shuffled over the pool (the target), and in the pool's order (the
  // indirection alone, without pages at random places).
  for (const bool in_order : {false, true}) {
    Config paged = decode(DType::kF16, 32, 8, 16384);
    paged.pages_in_order = in_order;
    Config contiguous = paged;
    contiguous.contiguous = true;  // the same workload for both pairs (keeps_page_order)
    const std::string name =
        decode_name("BM_PagedVsContiguous", paged) + (in_order ? "/pages:in_order" : "");
    if (fits(name, {paged, contiguous}))
      add(name, [=](benchmark::State& s) {
        run_pair(s, contiguous, paged, true, "contiguous", "paged", "paged_over_contiguous", true,
                 {});
      });
  }

  // Prefill: causal over its own keys; chunked: a chunk of new queries after a prefix.
  for (std::int32_t q_len : {512, 1024, 2048}) {
    const Config c = prefill(q_len, q_len);
    const std::string name = "BM_Prefill/kv:f16/heads:32x8/q_len:" + std::to_string(q_len) +
                             "/kv_len:" + std::to_string(q_len);
    add(name, [=](benchmark::State& s) { run_kernel(s, c, false); })->MinTime(kLongMinSeconds);
  }
  for (auto [q_len, kv_len] : {std::pair{512, 4096}, std::pair{1024, 8192}}) {
    const Config c = prefill(q_len, kv_len);
    const std::string name = "BM_ChunkedPrefill/kv:f16/heads:32x8/q_len:" + std::to_string(q_len) +
                             "/kv_len:" + std::to_string(kv_len);
    add(name, [=](benchmark::State& s) { run_kernel(s, c, false); })->MinTime(kLongMinSeconds);
  }
}

// --- the summary of targets --------------------------------------------------------------

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

const char* verdict(bool met) {
  return met ? "MET" : "MISSED";
}

void print_summary() {
  const Recorded& rec = recorded();
  if (rec.order.empty()) return;
  std::vector<std::pair<std::string, std::map<std::string, double>>> r;
  for (const std::string& name : rec.order) r.emplace_back(name, median_counters(name));
  auto get = [](const std::map<std::string, double>& m, const char* key) {
    const auto it = m.find(key);
    return it == m.end() ? std::nan("") : it->second;
  };
  std::FILE* out = stderr;
  std::fprintf(out,
               "\n== pagedattn attention targets (this run; per benchmark the median of its "
               "quiet runs, or of all runs if none was quiet) ==\n");
  std::fprintf(out, "probes: read %.1f GB/s, fp32 FMA %.1f GFLOP/s, %d threads\n", read_bw_gbps(),
               fma_peak_gflops(), omp_get_max_threads());
  // The denominators were measured once at start-up; if the probe benchmarks
  // later did clearly better, the machine was busy then and every fraction
  // below is overstated.
  auto check_probe = [&](const std::string& bm, const char* key, double reference,
                         const char* unit) {
    for (const auto& [name, m] : r)
      if (name == bm && get(m, key) > 1.1 * reference)
        std::fprintf(
            out,
            "WARNING: %s measured %.1f %s, > 10%% above the start-up probe (%.1f): "
            "the machine was busy at start-up; fractions are overstated. Re-run when idle.\n",
            bm.c_str(), get(m, key), unit, reference);
  };
  check_probe("BM_ProbeReadBandwidth/MiB:1024", "best_pass_GBps", read_bw_gbps(), "GB/s");
  check_probe("BM_ProbeFmaPeak", "best_pass_GFLOPs", fma_peak_gflops(), "GFLOP/s");
  const double probe_others =
      std::max(pb::machine_read_bandwidth().other_cores, pb::machine_fma_peak().other_cores);
  if (probe_others > kContendedCores)
    std::fprintf(out,
                 "WARNING: other processes used %.2f cores during the start-up probes: the "
                 "denominators are understated and every fraction overstated. Re-run when idle.\n",
                 probe_others);
  int contended = 0;
  for (const auto& [name, m] : r) contended += get(m, "others_cores") > kContendedCores;
  if (contended)
    std::fprintf(out,
                 "WARNING: %d of %zu benchmarks ran while other processes used > %.2f cores "
                 "(marked [busy]); their numbers understate the kernel.\n",
                 contended, r.size(), kContendedCores);
  auto busy = [&](const std::map<std::string, double>& m) {
    return get(m, "others_cores") > kContendedCores ? " [busy]" : "";
  };

  int n = 0, met = 0;
  std::fprintf(out, "\n[decode f16/bf16, 32x8: K+V GB/s >= %.0f%% of the read probe]\n",
               kDecodeBandwidthTarget * 100);
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_Decode/kv:f16/heads:32x8") ||
        starts_with(name, "BM_Decode/kv:bf16/heads:32x8")) {
      const bool ok = get(m, "pct_read_bw") >= kDecodeBandwidthTarget * 100;
      ++n;
      met += ok;
      std::fprintf(out, "  %-52s %8.3f ms %6.1f GB/s %5.1f%%  %s%s\n", name.c_str(),
                   get(m, "ms_per_call"), get(m, "KV_GBps"), get(m, "pct_read_bw"), verdict(ok),
                   busy(m));
    }
  if (n) std::fprintf(out, "  %d of %d met\n", met, n);

  std::fprintf(out, "\n[decode fp8/int8 >= %.1fx faster than bf16 at kv_len 16k]\n",
               kQuantSpeedupTarget);
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_DecodeQuantSpeedup"))
      std::fprintf(out, "  %-70s %5.2fx  %s%s\n", name.c_str(), get(m, "speedup"),
                   verdict(get(m, "speedup") >= kQuantSpeedupTarget), busy(m));

  std::fprintf(out,
               "\n[planning every call (AttentionRunner) against a plan made once; no target]\n");
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_DecodeRunnerVsPlanned"))
      std::fprintf(out, "  %-60s runner/planned %.3f, plan_attention %.1f us%s\n", name.c_str(),
                   get(m, "runner_over_planned"), get(m, "plan_attention_us"), busy(m));

  std::fprintf(out, "\n[prefill / chunked prefill >= %.0f%% of the FMA probe]\n",
               kPrefillFmaTarget * 100);
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_Prefill") || starts_with(name, "BM_ChunkedPrefill"))
      std::fprintf(out, "  %-60s %7.1f GFLOP/s %5.1f%%  %s%s\n", name.c_str(), get(m, "GFLOPs"),
                   get(m, "pct_fma_peak"),
                   verdict(get(m, "pct_fma_peak") >= kPrefillFmaTarget * 100), busy(m));

  std::fprintf(out, "\n[GQA 8 <= %.2fx the time of GQA 4]\n", kGqaOverheadTarget);
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_Gqa8VsGqa4"))
      std::fprintf(out, "  %-60s gqa8/gqa4 %.3f  %s%s\n", name.c_str(), get(m, "gqa8_over_gqa4"),
                   verdict(get(m, "gqa8_over_gqa4") <= kGqaOverheadTarget), busy(m));

  std::fprintf(out, "\n[paged (page 16) <= %.0f%% slower than contiguous]\n",
               (kPagedOverheadTarget - 1) * 100);
  for (const auto& [name, m] : r)
    if (starts_with(name, "BM_PagedVsContiguous"))
      std::fprintf(out, "  %-60s paged/contiguous %.3f  %s%s\n", name.c_str(),
                   get(m, "paged_over_contiguous"),
                   verdict(get(m, "paged_over_contiguous") <= kPagedOverheadTarget), busy(m));
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::strchr(".^$|()[]{}*+?\\", ch)) out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse_options(argc, argv);  // before Initialize, which removes flags
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  if (!skipped().empty()) {
    std::fprintf(stderr, "not registered (K/V above the %.2f GiB cap, PAGEDATTN_BENCH_MAX_GIB):\n",
                 double(max_workload_bytes()) / double(kGiB));
    for (const auto& s : skipped()) std::fprintf(stderr, "  %s\n", s.c_str());
  }
  if (options.list_only) {
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
  const std::string load_before = load_average();
  pb::wait_for_quiet(30.0, kContendedCores);
  const auto& bw = pb::machine_read_bandwidth();
  const auto& fma = pb::machine_fma_peak();
  benchmark::AddCustomContext(
      "probe_read_GBps", fixed(bw.best_gbps) + " (best of " + std::to_string(bw.passes) +
                             " passes over " + std::to_string(bw.bytes >> 20) + " MiB, " +
                             std::to_string(bw.threads) + " threads, " + bw.isa + ", others used " +
                             fixed(bw.other_cores, 2) + " cores)");
  benchmark::AddCustomContext("probe_fma_GFLOPs",
                              fixed(fma.best_gflops) + " (best of " + std::to_string(fma.passes) +
                                  " passes, " + std::to_string(fma.threads) + " threads x " +
                                  std::to_string(fma.accumulators) + " chains, " + fma.isa +
                                  ", others used " + fixed(fma.other_cores, 2) + " cores)");
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("l3_MiB", std::to_string(pb::l3_cache_bytes() >> 20));
  benchmark::AddCustomContext("min_working_set_MiB", std::to_string(min_working_set() >> 20));
  benchmark::AddCustomContext("loadavg_at_start", load_before);
  RecordingReporter& reporter = *options.reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  // Benchmarks that only ran while other processes were busy: again, after
  // waiting for a quiet moment (their first results stay in the output).
  for (int retry = 1; retry <= options.retry_busy; ++retry) {
    const std::vector<std::string> busy = busy_benchmarks();
    if (busy.empty()) break;
    std::string spec;
    for (const std::string& name : busy) {
      if (!spec.empty()) spec += '|';
      spec += regex_escape(name);
    }
    std::fprintf(stderr,
                 "\nre-running %zu benchmark(s) that ran on a busy machine (retry %d of %d)\n",
                 busy.size(), retry, options.retry_busy);
    pb::wait_for_quiet(60.0, kContendedCores);
    reporter.set_label(std::string("retry ") + std::to_string(retry));
    std::string filter = "^(";
    filter += spec;
    filter += ")(/min_time:[0-9.]+)?(/manual_time)?$";
    benchmark::RunSpecifiedBenchmarks(&reporter, filter);
  }
  reporter.finish();
  print_summary();
  std::fprintf(stderr, "\nloadavg at end: %s\n", load_average().c_str());
  benchmark::Shutdown();
  return 0;
}
