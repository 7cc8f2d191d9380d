// Kernel shims (kernel_shim.h) loaded into this process: several builds of
// the attention kernel side by side, so that a benchmark alternates them call
// by call and a host whose speed drifts slows every build alike.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention_workload.h"
#include "pagedattn/attention.h"

namespace pagedattn::bench {

class KernelShim {
 public:
  // Loads the shared object at `path` (dlopen, RTLD_LOCAL) and creates its
  // runner; throws pagedattn::InvalidArgument naming the path when it cannot
  // be loaded, lacks a symbol or was built with other public structs.
  KernelShim(const std::string& path, const AttentionPlanOptions& options);
  ~KernelShim();
  KernelShim(const KernelShim&) = delete;
  KernelShim& operator=(const KernelShim&) = delete;

  // One call; throws pagedattn::InvalidArgument with the shim's message.
  void run(const AttentionParams& params);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* library_ = nullptr;
  void* runner_ = nullptr;
  const char* (*run_)(void*, const AttentionParams*) = nullptr;
  void (*destroy_)(void*) = nullptr;
};

// Shims timed in turn on one workload: round r runs every shim once, in an
// order that rotates by one each round, each call on the next copy of the
// workload (copy 0 every call when `hot`), until `seconds` have passed.
struct ShimComparison {
  int rounds = 0;
  std::vector<double> median_ms;  // [shim]
  // [shim] time of shim 0 / time of the shim in the same round: quartiles over the rounds
  std::vector<double> speedup_q1, speedup_median, speedup_q3;
};
ShimComparison compare_shims(const std::vector<std::unique_ptr<KernelShim>>& shims, Workload& w,
                             double seconds, bool hot);

}  // namespace pagedattn::bench
