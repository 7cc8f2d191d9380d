// The C interface of a kernel shim: one build's attention kernel in a
// shared object of its own (kernel_shim.cc), so that a driver can load two
// builds into one process and alternate them call by call (KernelShim and
// compare_shims in kernel_shims.h, behind `bench-attention --shims`).
// The shim and the driver share the public structs of include/pagedattn:
// pagedattn_shim_layout() lets the driver refuse a shim whose structs differ.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagedattn/attention.h"

extern "C" {

// Sizes and offsets of the structs the driver passes in, folded into one number.
std::uint64_t pagedattn_shim_layout();
// An AttentionRunner planning with `options`; null on failure.
void* pagedattn_shim_create(const pagedattn::AttentionPlanOptions* options);
// Runs one call; returns null, or the message of the exception it threw
// (valid until the next call).
const char* pagedattn_shim_run(void* runner, const pagedattn::AttentionParams* params);
void pagedattn_shim_destroy(void* runner);

}  // extern "C"

// What pagedattn_shim_layout folds: both sides compute it from their own headers.
inline std::uint64_t pagedattn_struct_layout() {
  using namespace pagedattn;
  const std::uint64_t parts[] = {sizeof(AttentionParams),
                                 sizeof(AttentionPlanOptions),
                                 sizeof(AttentionOptions),
                                 sizeof(PagedKVStorage),
                                 sizeof(PagedKVTable),
                                 sizeof(HeadTensor),
                                 sizeof(TokenTreeMask),
                                 offsetof(AttentionParams, table),
                                 offsetof(AttentionParams, kv),
                                 offsetof(AttentionParams, options),
                                 offsetof(AttentionParams, tree_mask)};
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the parts
  for (std::uint64_t p : parts) h = (h ^ p) * 1099511628211ull;
  return h;
}
