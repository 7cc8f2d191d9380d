// The C ABI's boundary: run a C++ call with every exception turned into a
// status and a thread-local message, and convert C tensors to ops views.
#pragma once

#include <cstring>
#include <optional>

#include "pagedattn/c_api.h"
#include "pagedattn/ops/tensor.h"

namespace pagedattn::capi {

// This thread's last error message ("" if none).
const char* last_error();

// Records `message` as this thread's last error and returns `status`.
pagedattn_status fail(pagedattn_status status, const char* message);

// Runs `body`; maps pagedattn::Error to its code, std::bad_alloc to
// PAGEDATTN_OUT_OF_MEMORY and anything else to PAGEDATTN_INTERNAL.
template <typename Body>
pagedattn_status guarded(Body&& body) noexcept;

// A float tensor; InvalidArgument naming `name` for bad rank, extents or dtype.
ops::TensorView to_tensor(const pagedattn_tensor& t, const char* call, const char* name);
// An index tensor (int32 / int64, rank 1 or 2).
ops::IndexView to_index(const pagedattn_tensor& t, const char* call, const char* name);
// rank 0 = absent.
std::optional<ops::TensorView> to_optional_tensor(const pagedattn_tensor& t, const char* call,
                                                  const char* name);
std::optional<ops::IndexView> to_optional_index(const pagedattn_tensor& t, const char* call,
                                                const char* name);

// The integer a C caller stored in an enum field. C lets any int through, but
// C++ reading an enum object outside the enum's range is undefined behaviour,
// so the bytes are copied into an int before any check.
template <typename Enum>
int raw_enum_value(const Enum& field) noexcept {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized on this ABI");
  int value;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

// Throws InvalidArgument when `pointer` is null.
void require_pointer(const void* pointer, const char* call, const char* name);

}  // namespace pagedattn::capi

#include "c_api_support-inl.h"
