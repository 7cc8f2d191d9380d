// `pagedattn bench-attention`: times the paged attention kernel on one shape
// and reports it as a fraction of this machine's limits, measured in the same
// process (the probes and workloads of perf/, shared with the Google
// Benchmark program bench/bench_attention.cc).
#include "bench_attention_cli.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention_peak.h"
#include "attention_workload.h"
#include "kernel_shims.h"
#include "machine_probes.h"
#include "pagedattn/attention.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

namespace pagedattn::tools {
namespace {

namespace pb = pagedattn::bench;

constexpr std::int32_t kMinHeadDim = 8, kMaxHeadDim = 256;

struct Options {
  pb::Config shape;
  double seconds = 2.0;  // timed calls run at least this long
  bool probe = true;
  bool probe_only = false;  // the probes alone, no kernel
  bool check = true;
  bool hot = false;            // re-read one copy (K/V in cache when it fits) instead of rotating
  bool bf16_products = false;  // AttentionPlanOptions::bf16_products
  bool int8_products = false;  // AttentionPlanOptions::int8_products
  bool f16_products = false;   // AttentionPlanOptions::f16_products
  std::string max_target;      // --max-target: overrides PAGEDATTN_MAX_TARGET
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

// The defaults printed here are read from Options{} so that help and behaviour
// cannot drift apart.
void print_usage(std::FILE* out) {
  const Options d;
  const pb::Config& c = d.shape;
  std::fprintf(
      out,
      "usage: pagedattn bench-attention [options]\n"
      "  --mode decode|prefill   decode: one query per sequence (default);\n"
      "                          prefill: q_len = kv_len unless --q-len\n"
      "  --kv-dtype T            f32 f16 bf16 fp8_e4m3 fp8_e5m2 int8 (default %s)\n"
      "  --batch N               sequences (default %d)\n"
      "  --kv-len N              keys per sequence (default %d)\n"
      "  --q-len N               queries per sequence (causal, bottom-right)\n"
      "  --heads QxK             query x KV heads (default %dx%d)\n"
      "  --head-dim D            %d..%d (default %d)\n"
      "  --page-size P           (default %d); --contiguous: one page per sequence\n"
      "  --pages-in-order        each sequence's pages side by side in memory (default:\n"
      "                          shuffled over the pool, as a long-running cache has them)\n"
      "  --seconds S             time calls for at least S seconds (default %g)\n"
      "  --threads N             OpenMP threads for kernel and probes (default %d)\n"
      "  --max-target T          cap Highway dispatch at target T (as the environment\n"
      "                          variable PAGEDATTN_MAX_TARGET does): %s\n"
      "  --disable-features L    switch the kernels' optional extensions in L off (as\n"
      "                          PAGEDATTN_DISABLE_FEATURES does): amx_bf16, avx512_bf16,\n"
      "                          avx512_vnni, avx512_fp16, avx512_vbmi, comma-separated;\n"
      "                          \"\" for none\n"
      "  --no-probe              skip the bandwidth / compute-peak probes (read bandwidth\n"
      "                          sequential, and over runs of one page of K for all KV heads\n"
      "                          at random places, prefetched as the kernels do)\n"
      "  --probe-only            run the probes alone (no kernel; the paged read probe\n"
      "                          takes its run length from the shape options)\n"
      "  --no-check              skip the comparison with the scalar reference\n"
      "  --bf16-products         allow bf16 dot products (prefill, and decode over bf16,\n"
      "                          f16 and fp8 KV) where the CPU has AVX512-BF16 (inputs\n"
      "                          rounded to bf16; AttentionPlanOptions)\n"
      "  --int8-products         allow int8 dot products in int8 decode where the CPU has\n"
      "                          AVX512-VNNI (queries and weights rounded to 8 bits)\n"
      "  --f16-products          allow f16 multiply-adds in fp8 e4m3 decode where the CPU\n"
      "                          has AVX512-FP16 (queries and weights rounded to f16)\n"
      "  --hot                   re-read the first copy every call: K/V stay in\n"
      "                          L2/L3 if they fit (the kernel's compute rate)\n"
      "  --shims A,B[,...]       time these builds' kernels (each build's\n"
      "                          perf/libpagedattn_kernel_shim.so) instead of this one's,\n"
      "                          alternating call by call in this process; prints each\n"
      "                          build's median and its speed-up over the first\n"
      "exit status 3 when the kernel disagrees with the reference\n",
      pb::short_name(c.kv).c_str(), c.batch, c.kv_len, c.qo_heads, c.kv_heads, kMinHeadDim,
      kMaxHeadDim, c.head_dim, c.page, d.seconds, omp_get_max_threads(), target_list().c_str());
}

DType parse_dtype(const std::string& s) {
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8})
    if (pb::short_name(t) == s) return t;
  throw InvalidArgument(detail::concat("--kv-dtype: unknown dtype '", s, "'"));
}

std::int32_t parse_int(const char* flag, const std::string& s, std::int32_t lo, std::int32_t hi) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  require<InvalidArgument>(end != s.c_str() && *end == '\0' && v >= lo && v <= hi, flag,
                           ": expected an integer in [", lo, ", ", hi, "], got '", s, "'");
  return static_cast<std::int32_t>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  bool prefill = false;
  std::int32_t q_len = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      require<InvalidArgument>(i + 1 < argc, flag, ": missing value");
      return argv[++i];
    };
    if (flag == "--mode") {
      const std::string m = value();
      require<InvalidArgument>(m == "decode" || m == "prefill",
                               "--mode: expected decode or prefill, got '", m, "'");
      prefill = m == "prefill";
    } else if (flag == "--kv-dtype") {
      o.shape.kv = parse_dtype(value());
    } else if (flag == "--batch") {
      o.shape.batch = parse_int("--batch", value(), 1, 4096);
    } else if (flag == "--kv-len") {
      o.shape.kv_len = parse_int("--kv-len", value(), 1, 1 << 20);
    } else if (flag == "--q-len") {
      q_len = parse_int("--q-len", value(), 1, 1 << 20);
    } else if (flag == "--heads") {
      const std::string h = value();
      const auto x = h.find('x');
      require<InvalidArgument>(x != std::string::npos, "--heads: expected QxK, got '", h, "'");
      o.shape.qo_heads = parse_int("--heads", h.substr(0, x), 1, 1024);
      o.shape.kv_heads = parse_int("--heads", h.substr(x + 1), 1, 1024);
      require<InvalidArgument>(o.shape.qo_heads % o.shape.kv_heads == 0, "--heads: ", h,
                               ": query heads must be a multiple of KV heads");
    } else if (flag == "--head-dim") {
      o.shape.head_dim = parse_int("--head-dim", value(), kMinHeadDim, kMaxHeadDim);
    } else if (flag == "--page-size") {
      o.shape.page = parse_int("--page-size", value(), 1, 1 << 20);
    } else if (flag == "--contiguous") {
      o.shape.contiguous = true;
    } else if (flag == "--pages-in-order") {
      o.shape.pages_in_order = true;
    } else if (flag == "--seconds") {
      o.seconds = std::atof(value().c_str());
      require<InvalidArgument>(o.seconds > 0.0 && o.seconds <= 600.0,
                               "--seconds: expected (0, 600]");
    } else if (flag == "--threads") {
      omp_set_num_threads(parse_int("--threads", value(), 1, 1024));
    } else if (flag == "--disable-features") {
      o.disable_features = value();
    } else if (flag == "--max-target") {
      o.max_target = value();
      require<InvalidArgument>(!o.max_target.empty(), "--max-target: expected a target name");
    } else if (flag == "--no-probe") {
      o.probe = false;
    } else if (flag == "--probe-only") {
      o.probe_only = true;
    } else if (flag == "--no-check") {
      o.check = false;
    } else if (flag == "--hot") {
      o.hot = true;
    } else if (flag == "--bf16-products") {
      o.bf16_products = true;
    } else if (flag == "--int8-products") {
      o.int8_products = true;
    } else if (flag == "--f16-products") {
      o.f16_products = true;
    } else if (flag == "--shims") {
      const std::string list = value();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        o.shims.push_back(list.substr(at, comma - at));
        require<InvalidArgument>(!o.shims.back().empty(), "--shims: empty path in '", list, "'");
        at = comma + 1;
      }
      require<InvalidArgument>(o.shims.size() >= 2, "--shims: expected two or more paths, got '",
                               list, "'");
    } else {
      throw InvalidArgument(
          detail::concat("bench-attention: unknown option '", flag, "' (see --help)"));
    }
  }
  // Each shim holds its own copy of the library's dispatch settings, which
  // read the environment when it loads.
  require<InvalidArgument>(
      o.shims.empty() || (o.max_target.empty() && !o.disable_features),
      "--shims: --max-target and --disable-features would reach this program's kernel, "
      "not the shims'; set ",
      kMaxTargetVariable, " or ", kDisableFeaturesVariable, " in the environment instead");
  o.shape.q_len = q_len > 0 ? q_len : prefill ? o.shape.kv_len : 1;
  require<InvalidArgument>(o.shape.q_len <= o.shape.kv_len, "--q-len ", o.shape.q_len,
                           " exceeds --kv-len ", o.shape.kv_len);
  return o;
}

// Largest |kernel - reference| over the outputs of copy 0, relative to the
// largest |reference| (both read back as float); `run` calls the kernel.
double relative_error_vs_reference(pb::Workload& w,
                                   const std::function<void(const AttentionParams&)>& run) {
  AttentionParams p = w.params(0);
  const std::size_t n =
      std::size_t(w.config().batch) * w.config().q_len * p.num_qo_heads * w.config().head_dim;
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
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2], static_cast<int>(times.size())};
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
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      print_usage(stdout);
      return 0;
    }
  const Options o = parse(argc, argv);
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
  const pb::PeakClass k = pb::attention_peak_class({.kv = c.kv,
                                                    .prefill = prefill,
                                                    .bf16_products = o.bf16_products,
                                                    .int8_products = o.int8_products,
                                                    .f16_products = o.f16_products,
                                                    .head_dim = c.head_dim},
                                                   dispatched_features());
  const AttentionPlanOptions plan_options{.bf16_products = o.bf16_products,
                                          .int8_products = o.int8_products,
                                          .f16_products = o.f16_products};
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
      "shape: %s KV, heads %dx%d, head_dim %d, batch %d, q_len %d, kv_len %d, %s, %d threads\n",
      pb::short_name(c.kv).c_str(), c.qo_heads, c.kv_heads, c.head_dim, c.batch, c.q_len, c.kv_len,
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
