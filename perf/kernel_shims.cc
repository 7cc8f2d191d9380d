#include "kernel_shims.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "kernel_shim.h"
#include "pagedattn/errors.h"

namespace pagedattn::bench {
namespace {

template <class F>
F symbol(void* library, const std::string& path, const char* name) {
  void* s = dlsym(library, name);
  require<InvalidArgument>(s != nullptr, "--shims: ", path, " has no symbol ", name);
  return reinterpret_cast<F>(s);
}

}  // namespace

KernelShim::KernelShim(const std::string& path, const AttentionPlanOptions& options) : path_(path) {
  // RTLD_LOCAL: each shim binds to its own copy of the kernel.
  library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* why = dlerror();
    throw InvalidArgument(detail::concat("--shims: cannot load ", path, ": ", why ? why : "?"));
  }
  try {
    const auto layout = symbol<std::uint64_t (*)()>(library_, path, "pagedattn_shim_layout");
    require<InvalidArgument>(
        layout() == pagedattn_struct_layout(), "--shims: ", path,
        " was built with other public structs (include/pagedattn) than this program");
    const auto create =
        symbol<void* (*)(const AttentionPlanOptions*)>(library_, path, "pagedattn_shim_create");
    run_ = symbol<const char* (*)(void*, const AttentionParams*)>(library_, path,
                                                                  "pagedattn_shim_run");
    destroy_ = symbol<void (*)(void*)>(library_, path, "pagedattn_shim_destroy");
    runner_ = create(&options);
    require<InvalidArgument>(runner_ != nullptr, "--shims: ", path, " could not create a runner");
  } catch (...) {
    dlclose(library_);
    throw;
  }
}

KernelShim::~KernelShim() {
  destroy_(runner_);
  // Left loaded: the OpenMP runtime may still hold threads that ran its code.
}

void KernelShim::run(const AttentionParams& params) {
  if (const char* error = run_(runner_, &params))
    throw InvalidArgument(detail::concat(path_, ": ", error));
}

ShimComparison compare_shims(const std::vector<std::unique_ptr<KernelShim>>& shims, Workload& w,
                             double seconds, bool hot) {
  using Clock = std::chrono::steady_clock;
  const std::size_t n = shims.size();
  for (const auto& shim : shims) shim->run(w.params(0));  // warm-up: workspace, OpenMP team
  std::vector<std::vector<double>> times(n), speedups(n);
  const auto start = Clock::now();
  std::int64_t call = 0;
  for (std::size_t round = 0;
       round < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds;
       ++round) {
    std::vector<double> t(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t s = (round + k) % n;
      const AttentionParams p = w.params(hot ? 0 : static_cast<std::int32_t>(call++ % w.copies()));
      const auto t0 = Clock::now();
      shims[s]->run(p);
      t[s] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    for (std::size_t s = 0; s < n; ++s) {
      times[s].push_back(t[s]);
      speedups[s].push_back(t[0] / t[s]);
    }
  }
  auto quantile = [](std::vector<double> x, double q) {
    std::sort(x.begin(), x.end());
    return x[static_cast<std::size_t>(q * double(x.size() - 1) + 0.5)];
  };
  ShimComparison r;
  r.rounds = static_cast<int>(times[0].size());
  for (std::size_t s = 0; s < n; ++s) {
    r.median_ms.push_back(quantile(times[s], 0.5) * 1e3);
    r.speedup_q1.push_back(quantile(speedups[s], 0.25));
    r.speedup_median.push_back(quantile(speedups[s], 0.5));
    r.speedup_q3.push_back(quantile(speedups[s], 0.75));
  }
  return r;
}

}  // namespace pagedattn::bench
