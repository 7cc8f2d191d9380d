// One build's attention kernel behind a C interface (kernel_shim.h), linked
// into a shared object with the build's static library hidden inside it, so
// that two builds load side by side (dlopen, RTLD_LOCAL) without sharing a
// symbol.
#include "kernel_shim.h"

#include <exception>
#include <string>

#define PAGEDATTN_SHIM_EXPORT __attribute__((visibility("default")))

extern "C" {

PAGEDATTN_SHIM_EXPORT std::uint64_t pagedattn_shim_layout() {
  return pagedattn_struct_layout();
}

PAGEDATTN_SHIM_EXPORT void* pagedattn_shim_create(const pagedattn::AttentionPlanOptions* options) {
  try {
    return new pagedattn::AttentionRunner(*options);
  } catch (...) {
    return nullptr;
  }
}

PAGEDATTN_SHIM_EXPORT const char* pagedattn_shim_run(void* runner,
                                                     const pagedattn::AttentionParams* params) {
  static thread_local std::string error;
  try {
    static_cast<pagedattn::AttentionRunner*>(runner)->run(*params);
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}

PAGEDATTN_SHIM_EXPORT void pagedattn_shim_destroy(void* runner) {
  delete static_cast<pagedattn::AttentionRunner*>(runner);
}

}  // extern "C"
