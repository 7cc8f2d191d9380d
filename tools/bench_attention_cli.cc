// `pagedattn bench-attention`: times the paged attention kernel on one shape
// and reports it as a fraction of this machine's limits, measured in the same
// process (the probes and workloads of perf/, shared with the Google
// Benchmark program bench/bench_attention.cc).
#include "bench_attention_cli.h"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_peak.h"
#include "attention_workload.h"
#include "cli_flags.h"
#include "kernel_shims.h"
#include "machine_probes.h"
#include "pagedattn/attention.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

namespace pagedattn::tools {
namespace {

namespace pb = pagedattn::bench;

constexpr std::int32_t kMinHeadDim = 8, kMaxHeadDim = 1024;

struct Options {
  pb::Config shape;
  double seconds = 2.0;  // timed calls run at least this long
  bool probe = true;
  bool probe_only = false;     // the probes alone, no kernel
  int interleaved_rounds = 0;  // --interleave-probe: kernel and paged read probe in turn
  bool check = true;
  bool hot = false;             // re-read one copy (K/V in cache when it fits) instead of rotating
  bool bf16_products = false;   // AttentionPlanOptions::bf16_products
  bool int8_products = false;   // AttentionPlanOptions::int8_products
  bool f16_products = false;    // AttentionPlanOptions::f16_products
  bool exact_products = false;  // !fp8_fast_products, !fast_prefill_products
  bool every_allowed_path = false;  // !AttentionPlanOptions::measured_products
  std::string max_target;           // --max-target: overrides PAGEDATTN_MAX_TARGET
  std::optional<std::string>
      disable_features;  // --disable-features: overrides PAGEDATTN_DISABLE_FEATURES
  std::vector<std::string>
      shims;  // --shims: builds' kernel shims to alternate instead of this build's kernel
};

std::string target_list() {
  std::string out;
  for (const std::string& t : known_target_names()) {
    if (!out.empty()) out += ' ';
    out += t;
  }
  return out;
}

constexpr DType kKvDtypes[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                               DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};

std::vector<std::string> kv_dtype_names() {
  std::vector<std::string> names;
  for (DType t : kKvDtypes) names.push_back(pb::short_name(t));
  return names;
}

DType kv_dtype_named(const std::string& name) {
  for (DType t : kKvDtypes)
    if (pb::short_name(t) == name) return t;
  throw InvalidArgument(detail::concat("--kv-dtype: unknown dtype '", name, "'"));
}

constexpr std::int32_t kMaxHeads = 1024;

// "QxK": query and KV heads, each in [1, kMaxHeads]; nullopt otherwise.
std::optional<std::pair<std::int32_t, std::int32_t>> heads_of(const std::string& text) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) return std::nullopt;
  auto count = [&](std::size_t begin, std::size_t end) {
    std::int32_t n = 0;
    const auto [stop, error] = std::from_chars(text.data() + begin, text.data() + end, n);
    return error == std::errc() && stop == text.data() + end && n >= 1 && n <= kMaxHeads ? n : 0;
  };
  const std::int32_t q = count(0, x), k = count(x + 1, text.size());
  if (q == 0 || k == 0) return std::nullopt;
  return std::pair{q, k};
}

CLI::Validator heads_check() {
  return flags::value_check([](std::string& text) -> std::string {
    const auto heads = heads_of(text);
    if (!heads)
      return detail::concat(flags::value_is(text), "must be QxK, each in [1, ", kMaxHeads, "]");
    if (heads->first % heads->second != 0)
      return flags::value_is(text) + "must be QxK with Q a multiple of K";
    return "";
  });
}

// "a,,b" -> {"a", "", "b"}.
std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> parts;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    parts.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return parts;
}

CLI::Validator shims_check() {
  return flags::value_check([](std::string& text) -> std::string {
    const std::vector<std::string> paths = split_commas(text);
    if (std::find(paths.begin(), paths.end(), "") != paths.end())
      return flags::value_is(text) + "has an empty path";
    if (paths.size() < 2)
      return flags::value_is(text) + "must be two or more comma-separated paths";
    return "";
  });
}

// The command line as given; options() turns it into Options.
struct Flags {
  Options o;
  std::string mode = "decode";
  std::string kv_dtype = pb::short_name(o.shape.kv);
  std::string heads = detail::concat(o.shape.qo_heads, "x", o.shape.kv_heads);
  std::int32_t q_len = 0;  // 0: 1 for decode, --kv-len for prefill
  int threads = omp_get_max_threads();
  std::string shims;
};

void add_shape_flags(CLI::App& app, Flags& f) {
  using flags::integer_in;
  pb::Config& c = f.o.shape;
  app.add_option("--mode", f.mode,
                 "decode: one query per sequence; prefill: q_len = kv_len unless --q-len")
      ->type_name("decode|prefill")
      ->check(flags::one_of({"decode", "prefill"}));
  std::string dtypes;
  for (const std::string& name : kv_dtype_names()) dtypes += (dtypes.empty() ? "" : " ") + name;
  app.add_option("--kv-dtype", f.kv_dtype, dtypes)
      ->type_name("T")
      ->check(flags::one_of(kv_dtype_names()));
  app.add_option("--batch", c.batch, "sequences")->type_name("N")->transform(integer_in(1, 4096));
  app.add_option("--kv-len", c.kv_len, "keys per sequence")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--q-len", f.q_len,
                 "queries per sequence, causal, bottom-right (default: 1, or --kv-len "
                 "with --mode prefill)")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20))
      ->default_str("");
  app.add_option("--heads", f.heads, "query x KV heads")->type_name("QxK")->check(heads_check());
  app.add_option("--head-dim", c.head_dim, detail::concat(kMinHeadDim, "..", kMaxHeadDim))
      ->type_name("D")
      ->transform(integer_in(kMinHeadDim, kMaxHeadDim));
  app.add_option("--v-head-dim", c.v_dim, "V head dim when it differs from --head-dim")
      ->type_name("D")
      ->transform(integer_in(kMinHeadDim, kMaxHeadDim));
  app.add_option("--mla", c.mla_latent,
                 "multi-head latent attention: one row of --head-dim per token ([latent | rope "
                 "key]), V = its first LATENT elements, one KV head (DeepSeek-V2/V3: --heads 16x1 "
                 "--head-dim 576 --mla 512)")
      ->type_name("LATENT")
      ->transform(integer_in(1, kMaxHeadDim));
  app.add_option("--page-size", c.page, "tokens per page")
      ->type_name("P")
      ->transform(integer_in(1, 1 << 20));
  app.add_flag("--contiguous", c.contiguous, "one page per sequence");
  app.add_flag("--pages-in-order", c.pages_in_order,
               "each sequence's pages side by side in memory (default: shuffled over the pool, "
               "as a long-running cache has them)");
}

void add_run_flags(CLI::App& app, Flags& f) {
  Options& o = f.o;
  app.add_option("--seconds", o.seconds, "time calls for at least S seconds")
      ->type_name("S")
      ->check(flags::positive(600));
  app.add_option("--threads", f.threads, "OpenMP threads for kernel and probes")
      ->type_name("N")
      ->transform(flags::integer_in(1, 1024));
  app.add_option("--max-target", o.max_target,
                 detail::concat("cap Highway dispatch at target T (as the environment variable ",
                                kMaxTargetVariable, " does): ", target_list()))
      ->type_name("T")
      ->check(flags::non_empty());
  app.add_option_function<std::string>(
         "--disable-features", [&o](const std::string& list) { o.disable_features = list; },
         detail::concat(
             "switch the kernels' optional extensions in L off (as ", kDisableFeaturesVariable,
             " does): amx_bf16, amx_int8, avx512_bf16, avx512_vnni, avx_vnni, avx512_fp16, "
             "avx512_vbmi, comma-separated; \"\" for none"))
      ->type_name("L");
  app.add_flag("!--no-probe", o.probe,
               "skip the bandwidth / compute-peak probes (read bandwidth sequential, and over "
               "runs of one page of K for all KV heads at random places, prefetched as the "
               "kernels do)");
  app.add_flag("--probe-only", o.probe_only,
               "run the probes alone (no kernel; the paged read probe takes its run length from "
               "the shape options)");
  app.add_flag("!--no-check", o.check, "skip the comparison with the scalar reference");
  app.add_option("--interleave-probe", o.interleaved_rounds,
                 "N rounds, each timing the kernel for --seconds / N, then 5 passes of the paged "
                 "read probe: the kernel as a fraction of the probe in the same minutes, round "
                 "by round (on a host whose bandwidth drifts)")
      ->type_name("N")
      ->transform(flags::integer_in(2, 100));
}

void add_kernel_flags(CLI::App& app, Flags& f) {
  Options& o = f.o;
  app.add_flag("--bf16-products", o.bf16_products,
               "allow bf16 dot products (prefill, and decode over bf16, f16 and fp8 KV) where "
               "the CPU has AVX512-BF16 (inputs rounded to bf16; AttentionPlanOptions)");
  app.add_flag("--int8-products", o.int8_products,
               "allow int8 dot products in int8 decode where the CPU has AVX512-VNNI (queries "
               "and weights rounded to 8 bits)");
  app.add_flag("--f16-products", o.f16_products,
               "allow f16 multiply-adds in fp8 e4m3 decode where the CPU has AVX512-FP16 "
               "(queries and weights rounded to f16)");
  flags::add_exact_products_flag(app, o.exact_products);
  app.add_flag("--every-allowed-path", o.every_allowed_path,
               "take every allowed product path the CPU has, without timing which pay "
               "(default: only those a one-time timing found faster than f32 products)");
  app.add_flag("--hot", o.hot,
               "re-read the first copy every call: K/V stay in L2/L3 if they fit (the kernel's "
               "compute rate)");
  app.add_option("--shims", f.shims,
                 "time these builds' kernels (each build's perf/libpagedattn_kernel_shim.so) "
                 "instead of this one's, alternating call by call in this process; prints each "
                 "build's median and its speed-up over the first")
      ->type_name("A,B[,...]")
      ->check(shims_check());
}

// bench-attention's flags, bound to `f` (whose initial values are the defaults).
std::unique_ptr<CLI::App> bench_attention_flags(Flags& f) {
  auto app = flags::make_app("bench-attention",
                             "Time the paged attention kernel on one shape, as a fraction of "
                             "this machine's read bandwidth and FMA peak.");
  add_shape_flags(*app, f);
  add_run_flags(*app, f);
  add_kernel_flags(*app, f);
  app->footer("exit status 3 when the kernel disagrees with the reference");
  return app;
}

// The checks between flags, then the run's Options.
Options options(const Flags& f, const CLI::App& app) {
  Options o = f.o;
  o.shape.kv = kv_dtype_named(f.kv_dtype);
  // e4m3 K/V carry the page flags a PagedKVCache keeps (none set: the
  // pattern holds no NaN code), so the kernels decide NaN handling from them
  // as they do in serving, not from a scan of every block.
  o.shape.page_flags = o.shape.kv == DType::kFP8E4M3;
  std::tie(o.shape.qo_heads, o.shape.kv_heads) = *heads_of(f.heads);
  if (!f.shims.empty()) o.shims = split_commas(f.shims);
  // Each shim holds its own copy of the library's dispatch settings, which
  // read the environment when it loads.
  require<InvalidArgument>(
      o.shims.empty() || (o.max_target.empty() && !o.disable_features),
      "bench-attention: --shims: --max-target and --disable-features would reach this "
      "program's kernel, not the shims'; set ",
      kMaxTargetVariable, " or ", kDisableFeaturesVariable, " in the environment instead");
  require<InvalidArgument>(
      !o.shape.mla() || (o.shape.kv_heads == 1 && o.shape.mla_latent <= o.shape.head_dim),
      "bench-attention: --mla ", o.shape.mla_latent,
      " needs --heads Qx1 and a latent <= --head-dim ", o.shape.head_dim);
  require<InvalidArgument>(o.interleaved_rounds == 0 || (o.shims.empty() && !o.probe_only),
                           "bench-attention: --interleave-probe times this build's kernel; leave "
                           "out --shims and --probe-only");
  require<InvalidArgument>(!o.shape.mla() || o.shape.v_dim == 0,
                           "bench-attention: --mla gives V's dim; leave out --v-head-dim");
  o.shape.q_len = f.q_len > 0 ? f.q_len : f.mode == "prefill" ? o.shape.kv_len : 1;
  require<InvalidArgument>(o.shape.q_len <= o.shape.kv_len, "bench-attention: --q-len ",
                           o.shape.q_len, " exceeds --kv-len ", o.shape.kv_len);
  if (app.count("--threads") > 0) omp_set_num_threads(f.threads);
  return o;
}

// Largest |kernel - reference| over the outputs of copy 0, relative to the
// largest |reference| (both read back as float); `run` calls the kernel.
double relative_error_vs_reference(pb::Workload& w,
                                   const std::function<void(const AttentionParams&)>& run) {
  AttentionParams p = w.params(0);
  const std::size_t n =
      std::size_t(w.config().batch) * w.config().q_len * p.num_qo_heads * w.config().v_head_dim();
  run(p);
  std::vector<float> fast(n), ref(n);
  for (std::size_t i = 0; i < n; ++i) fast[i] = load_as_float(p.o.data, p.o.dtype, i);
  paged_attention_reference(p);
  double max_err = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    ref[i] = load_as_float(p.o.data, p.o.dtype, i);
    max_err = std::max(max_err, double(std::fabs(fast[i] - ref[i])));
    max_ref = std::max(max_ref, double(std::fabs(ref[i])));
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

struct Timing {
  double best = 0.0, median = 0.0;
  int calls = 0;
};

// Calls the kernel (plan + run, as a serving step would) rotating through the
// workload's copies (or on copy 0 alone when `hot`), for at least `seconds`.
Timing time_calls(pb::Workload& w, double seconds, bool hot,
                  const AttentionPlanOptions& plan_options) {
  using Clock = std::chrono::steady_clock;
  AttentionRunner runner(plan_options);
  runner.run(w.params(0));  // warm-up: workspace, page faults
  std::vector<double> times;
  const auto start = Clock::now();
  for (int i = 0;
       times.size() < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds;
       ++i) {
    const AttentionParams p = w.params(hot ? 0 : i % w.copies());
    const auto t0 = Clock::now();
    runner.run(p);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const pb::Spread spread = pb::spread_of(times);
  return {spread.min, spread.median, static_cast<int>(times.size())};
}

// What runs: the dispatched target, where its cap came from, the ISA
// extensions that target may use and those the CPU has.
void print_dispatch(const Options& o) {
  const std::string cap = max_target();
  const std::string source = cap.empty()             ? "none"
                             : !o.max_target.empty() ? "--max-target " + cap
                                                     : std::string(kMaxTargetVariable) + "=" + cap;
  std::printf("target: %s (Highway dynamic dispatch; cap: %s)\n", dispatched_target_name().c_str(),
              source.c_str());
  const CpuFeatures used = pb::attention_kernel_features(dispatched_features());
  const int lanes = pb::attention_kernel_lanes(used);
  std::printf("isa in use: %s; attention computes on %s\n", feature_names(used).c_str(),
              lanes ? (std::to_string(lanes) + " fp32 lanes (" + std::to_string(lanes * 32) +
                       "-bit vectors)")
                          .c_str()
                    : "portable C++");
  std::printf("cpu has: %s; switched off (%s): %s\n", feature_names(cpu_features()).c_str(),
              kDisableFeaturesVariable, disabled_features().c_str());
}

// Every probe: read bandwidth, sequential and over the shape's pages at
// random places, and each compute class (min / median / max over its passes).
void print_probes(const pb::Config& c) {
  const pb::ReadBandwidthResult& bw = pb::machine_read_bandwidth();
  std::printf(
      "probe: read bandwidth: min %.1f, median %.1f, max %.1f GB/s (%d passes over %zu MiB, %d "
      "threads, %s loads)\n",
      bw.min_gbps, bw.median_gbps, bw.best_gbps, bw.passes, bw.bytes >> 20, bw.threads,
      bw.isa.c_str());
  const pb::ReadBandwidthResult& paged = pb::machine_paged_read_bandwidth(c.k_page_bytes());
  std::printf(
      "probe: paged read, runs of %zu KiB (a page's K) in shuffled order, prefetched to L2 two "
      "runs ahead: "
      "min %.1f, median %.1f, max %.1f GB/s (%d passes over %zu MiB, %d threads)\n",
      paged.run_bytes >> 10, paged.min_gbps, paged.median_gbps, paged.best_gbps, paged.passes,
      paged.bytes >> 20, paged.threads);
  for (pb::PeakClass k : pb::kAllPeakClasses) {
    const pb::ComputePeakResult& p = pb::machine_compute_peak(k);
    if (!p.available) {
      std::printf("probe: %s: not on this CPU\n", pb::peak_class_name(k));
      continue;
    }
    std::printf(
        "probe: %s: min %.1f, median %.1f, max %.1f %s (%d passes, %d threads x %d chains)\n",
        pb::peak_class_name(k), p.min_gflops, p.median_gflops, p.best_gflops,
        pb::peak_class_unit(k), p.passes, p.threads, p.accumulators);
  }
}

// The run as fractions of the probes: the median call against the median
// probe pass, the best call against the best pass (a shared host's median
// also counts time taken by others). The compute peak is that of the
// instruction class the dispatched kernel computes with (attention_peak.h).
void print_fractions(const pb::Config& c, const Timing& t, pb::PeakClass k) {
  print_probes(c);
  const pb::ReadBandwidthResult& bw = pb::machine_read_bandwidth();
  const pb::ReadBandwidthResult& paged = pb::machine_paged_read_bandwidth(c.k_page_bytes());
  const pb::ComputePeakResult& peak = pb::machine_compute_peak(k);
  auto gbps = [&](double seconds) { return c.kv_bytes_per_call() / seconds / 1e9; };
  auto gflops = [&](double seconds) { return c.flops_per_call() / seconds / 1e9; };
  std::printf(
      "fraction of the machine: %.1f%% of read bandwidth (%.1f%% of the paged read), %.1f%% of "
      "compute peak "
      "(median call / median probe pass)\n",
      100.0 * gbps(t.median) / bw.median_gbps, 100.0 * gbps(t.median) / paged.median_gbps,
      100.0 * gflops(t.median) / peak.median_gflops);
  std::printf(
      "best call against the same probes: %.1f%% of read bandwidth (%.1f%% of the paged read), "
      "%.1f%% of "
      "compute peak (best call / best pass)\n",
      100.0 * gbps(t.best) / bw.best_gbps, 100.0 * gbps(t.best) / paged.best_gbps,
      100.0 * gflops(t.best) / peak.best_gflops);
}

// --interleave-probe: rounds of kernel calls, each followed by a few passes
// of the paged read probe, so that each round's fraction compares the same
// minutes of the host; the fractions' min / median / max.
void print_interleaved(const Options& o, pb::Workload& w, const AttentionPlanOptions& plan) {
  const pb::Config& c = o.shape;
  constexpr int kProbePasses = 5;
  const pb::PagedReadProbe probe(c.k_page_bytes());
  std::vector<double> fractions;
  for (int round = 1; round <= o.interleaved_rounds; ++round) {
    const Timing t = time_calls(w, o.seconds / o.interleaved_rounds, o.hot, plan);
    const double kernel_gbps = c.kv_bytes_per_call() / t.median / 1e9;
    const pb::ReadBandwidthResult paged = probe.measure(kProbePasses);
    fractions.push_back(kernel_gbps / paged.median_gbps);
    std::printf(
        "round %d: K+V read %.2f GB/s (median of %d calls), paged read probe %.2f GB/s "
        "(median of %d passes): %.1f%%\n",
        round, kernel_gbps, t.calls, paged.median_gbps, kProbePasses, 100.0 * fractions.back());
  }
  const pb::Spread spread = pb::spread_of(fractions);
  std::printf(
      "interleaved: K+V read as a fraction of the paged read probe, min %.1f%%, median "
      "%.1f%%, max %.1f%% (%d rounds)\n",
      100.0 * spread.min, 100.0 * spread.median, 100.0 * spread.max, o.interleaved_rounds);
}

// --shims: each build's kernel checked against the reference, then all
// timed in turn (pb::compare_shims).
template <class Check>
int run_shims(const Options& o, const std::vector<std::unique_ptr<pb::KernelShim>>& shims,
              pb::Workload& w, const Check& check) {
  bool ok = true;
  for (std::size_t s = 0; s < shims.size(); ++s)
    if (o.check) {
      const std::string who = "shim " + std::to_string(s) + ": ";
      ok = check(who.c_str(), [&](const AttentionParams& p) { shims[s]->run(p); }) && ok;
    }
  if (!ok) return 3;
  const pb::ShimComparison r = pb::compare_shims(shims, w, o.seconds, o.hot);
  std::printf("alternating %zu builds call by call, %d rounds%s\n", shims.size(), r.rounds,
              o.hot ? " (hot: every call re-reads copy 0)" : "");
  for (std::size_t s = 0; s < shims.size(); ++s) {
    std::printf("shim %zu (%s): median %.3f ms", s, shims[s]->path().c_str(), r.median_ms[s]);
    if (s > 0)
      std::printf("; speed-up over shim 0: median %.3f (quartiles %.3f-%.3f)", r.speedup_median[s],
                  r.speedup_q1[s], r.speedup_q3[s]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int run_bench_attention(int argc, char** argv) {
  Flags f;
  const std::unique_ptr<CLI::App> app = bench_attention_flags(f);
  if (flags::parse(*app, argc, argv, 0)) {
    std::fputs(app->help().c_str(), stdout);
    return 0;
  }
  const Options o = options(f, *app);
  apply_max_target_from_environment();  // an unknown value fails here, before any work
  apply_disabled_features_from_environment();
  if (!o.max_target.empty()) set_max_target(o.max_target);
  if (o.disable_features) set_disabled_features(*o.disable_features);
  const pb::Config& c = o.shape;
  print_dispatch(o);
  if (o.probe_only) {
    print_probes(c);
    return 0;
  }
  const bool prefill = c.q_len * (c.qo_heads / c.kv_heads) > 8;
  const AttentionPlanOptions plan_options{.bf16_products = o.bf16_products,
                                          .int8_products = o.int8_products,
                                          .f16_products = o.f16_products,
                                          .fp8_fast_products = !o.exact_products,
                                          .fast_prefill_products = !o.exact_products,
                                          .measured_products = !o.every_allowed_path};
  const kernels::ProductChoice chosen = kernels::product_choice(
      {.kv_dtype = c.kv,
       .layout = KVLayout::kHND,  // the workload's pages (perf/attention_workload.h)
       .head_dim = c.head_dim,
       .v_head_dim = c.v_head_dim(),
       .group = c.qo_heads / c.kv_heads,
       .v_in_k = c.mla()},
      plan_options);
  const pb::PeakClass k = pb::attention_peak_class(chosen, prefill, dispatched_features());
  std::printf("compute class: %s (the kernel's inner products for %s KV %s at this target%s%s%s)\n",
              pb::peak_class_name(k), pb::short_name(c.kv).c_str(), prefill ? "prefill" : "decode",
              o.bf16_products ? ", bf16 products allowed" : "",
              o.int8_products ? ", int8 products allowed" : "",
              o.f16_products ? ", f16 products allowed" : "");
  // Shims load before the workload is built, so a bad path fails at once.
  std::vector<std::unique_ptr<pb::KernelShim>> shims;
  for (const std::string& path : o.shims)
    shims.push_back(std::make_unique<pb::KernelShim>(path, plan_options));
  std::printf(
      "shape: %s KV, heads %dx%d, head_dim %d%s, batch %d, q_len %d, kv_len %d, %s, %d threads\n",
      pb::short_name(c.kv).c_str(), c.qo_heads, c.kv_heads, c.head_dim,
      c.mla() ? (" (MLA: V = the first " + std::to_string(c.mla_latent) + ")").c_str() : "",
      c.batch, c.q_len, c.kv_len,
      c.contiguous
          ? "contiguous"
          : ("page " + std::to_string(c.page) + (c.keeps_page_order() ? " in order" : "")).c_str(),
      omp_get_max_threads());
  pb::Workload w(c);
  std::printf("working set: %d copies, %.0f MiB of K/V (L3 %.0f MiB)\n", w.copies(),
              double(w.bytes()) / double(1 << 20), double(pb::l3_cache_bytes()) / double(1 << 20));
  // Outputs are stored in f16 / bf16 / f32: rounding alone stays well below
  // 1e-2; int8 products round the queries and weights to 8 bits, allowed
  // up to kInt8ProductsTolerance of a row's largest output (the kernel
  // tests' allowance, tests/kernels/attention_case.h).
  constexpr double kTolerance = 1e-2, kInt8ProductsTolerance = 3e-2;
  const double tolerance = o.int8_products ? kInt8ProductsTolerance : kTolerance;
  auto check = [&](const char* who, const std::function<void(const AttentionParams&)>& run) {
    const double err = relative_error_vs_reference(w, run);
    std::printf("%smax |kernel - reference| / max |reference|: %.2e (%s)\n", who, err,
                err <= tolerance ? "ok" : "FAILED");
    return err <= tolerance;
  };
  if (!shims.empty()) return run_shims(o, shims, w, check);
  if (o.check &&
      !check("", [&](const AttentionParams& p) { AttentionRunner(plan_options).run(p); }))
    return 3;

  if (o.interleaved_rounds > 0) {
    print_interleaved(o, w, plan_options);
    return 0;
  }
  const Timing t = time_calls(w, o.seconds, o.hot, plan_options);
  if (o.hot)
    std::printf("hot: every call re-reads copy 0 (%.1f MiB of K/V)\n",
                c.kv_bytes_per_call() / double(1 << 20));
  auto gbps = [&](double seconds) { return c.kv_bytes_per_call() / seconds / 1e9; };
  auto gflops = [&](double seconds) { return c.flops_per_call() / seconds / 1e9; };
  std::printf("time per call: median %.3f ms, best %.3f ms (%d calls)\n", t.median * 1e3,
              t.best * 1e3, t.calls);
  std::printf("K+V read: %.2f GB/s   compute: %.1f GFLOP/s\n", gbps(t.median), gflops(t.median));
  if (o.probe) print_fractions(c, t, k);
  return 0;
}

}  // namespace pagedattn::tools
