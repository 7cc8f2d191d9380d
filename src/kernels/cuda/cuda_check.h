// The CUDA backend's one way of turning a failed runtime call into an
// exception. Host code only; needs <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include "pagedattn/errors.h"

namespace pagedattn::cuda::detail {

// Throws pagedattn::Error (kInternal) "<context>: <what> failed: <CUDA's
// message>" unless `status` is cudaSuccess.
inline void check_cuda(cudaError_t status, const char* context, const char* what) {
  if (status != cudaSuccess)
    throw Error(
        ErrorCode::kInternal,
        ::pagedattn::detail::concat(context, ": ", what, " failed: ", cudaGetErrorString(status)));
}

}  // namespace pagedattn::cuda::detail
