#include "c_api_support.h"

#include <cstring>
#include <string>

#include "pagedattn/errors.h"

namespace pagedattn::capi {
namespace {

thread_local std::string g_last_error;

// Shape and strides of a C tensor into a view's arrays (dense when all strides are 0).
template <typename View>
void copy_geometry(const pagedattn_tensor& t, View& v, std::int32_t max_rank, const char* call,
                   const char* name) {
  require(t.rank >= 1 && t.rank <= max_rank, call, ": ", name, ".rank = ", t.rank,
          " must be in [1, ", max_rank, "]");
  v.rank = t.rank;
  bool all_zero = true;
  for (std::int32_t d = 0; d < t.rank; ++d) {
    require(t.shape[d] >= 0, call, ": ", name, ".shape[", d, "] = ", t.shape[d], " is negative");
    require(t.strides[d] >= 0, call, ": ", name, ".strides[", d, "] = ", t.strides[d],
            " is negative");
    v.shape[static_cast<std::size_t>(d)] = t.shape[d];
    v.strides[static_cast<std::size_t>(d)] = t.strides[d];
    all_zero = all_zero && t.strides[d] == 0;
  }
  if (all_zero) v.strides = ops::dense_strides(v.shape, v.rank);
}

}  // namespace

std::int64_t dtype_value(const pagedattn_dtype& dtype) {
  // As an int, the type of C's enum constants: (pagedattn_dtype)-3 reads -3
  // (the compiler's underlying type may be unsigned).
  int value;
  static_assert(sizeof value == sizeof dtype);
  std::memcpy(&value, &dtype, sizeof value);
  return static_cast<std::int64_t>(value);
}

pagedattn_status fail(pagedattn_status status, const char* message) {
  try {
    g_last_error = message;
  } catch (...) {
    g_last_error.clear();  // keep the status even if the message does not fit
  }
  return status;
}

const char* last_error() {
  return g_last_error.c_str();
}

ops::TensorView to_tensor(const pagedattn_tensor& t, const char* call, const char* name) {
  const std::int64_t dtype = dtype_value(t.dtype);
  require(dtype >= PAGEDATTN_FLOAT32 && dtype <= PAGEDATTN_INT8, call, ": ", name,
          ".dtype = ", dtype, " is not a float or KV storage type");
  ops::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(dtype);
  copy_geometry(t, v, ops::kMaxTensorRank, call, name);
  return v;
}

ops::IndexView to_index(const pagedattn_tensor& t, const char* call, const char* name) {
  const std::int64_t dtype = dtype_value(t.dtype);
  require(dtype == PAGEDATTN_INT32 || dtype == PAGEDATTN_INT64, call, ": ", name,
          ".dtype = ", dtype, " must be PAGEDATTN_INT32 or PAGEDATTN_INT64");
  ops::IndexView v;
  v.data = t.data;
  v.type = dtype == PAGEDATTN_INT32 ? ops::IndexType::kInt32 : ops::IndexType::kInt64;
  copy_geometry(t, v, 2, call, name);
  return v;
}

std::optional<ops::TensorView> to_optional_tensor(const pagedattn_tensor& t, const char* call,
                                                  const char* name) {
  if (t.rank == 0) return std::nullopt;
  return to_tensor(t, call, name);
}

std::optional<ops::IndexView> to_optional_index(const pagedattn_tensor& t, const char* call,
                                                const char* name) {
  if (t.rank == 0) return std::nullopt;
  return to_index(t, call, name);
}

void require_pointer(const void* pointer, const char* call, const char* name) {
  require(pointer != nullptr, call, ": ", name, " is null");
}

}  // namespace pagedattn::capi

extern "C" const char* pagedattn_last_error_message(void) {
  return pagedattn::capi::last_error();
}

extern "C" const char* pagedattn_status_name(pagedattn_status status) {
  if (status == PAGEDATTN_OUT_OF_MEMORY) return "out_of_memory";
  return pagedattn::error_code_name(static_cast<pagedattn::ErrorCode>(status));
}
