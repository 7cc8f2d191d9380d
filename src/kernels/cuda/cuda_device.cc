// Device queries of the CUDA backend. Without a driver or a GPU the runtime
// answers with an error, which device_count() turns into 0.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda {

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("the CUDA runtime reports ") + cudaGetErrorName(status) + ": " +
           cudaGetErrorString(status);
  }
  return count == 0 ? "the CUDA runtime sees no device" : "";
}

namespace {

DeviceInfo read_device_info(int device) {
  cudaDeviceProp prop{};
  int shared_optin = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    throw Error(ErrorCode::kInternal, std::string("pagedattn::cuda: reading the device's "
                                                  "properties failed: ") +
                                          cudaGetErrorString(cudaGetLastError()));
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.max_shared_bytes_per_block = static_cast<std::size_t>(shared_optin);
  info.global_bytes = prop.totalGlobalMem;
  return info;
}

}  // namespace

// Read once per device: cudaGetDeviceProperties takes milliseconds, and the
// planner asks on every plan that does not give the SM count itself.
DeviceInfo current_device_info() {
  require<Unsupported>(device_count() > 0, "pagedattn::cuda: no CUDA device (", no_device_reason(),
                       ")");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw Error(ErrorCode::kInternal, std::string("pagedattn::cuda: cudaGetDevice failed: ") +
                                          cudaGetErrorString(cudaGetLastError()));
  static std::mutex mutex;
  static std::map<int, DeviceInfo> known;
  const std::lock_guard lock(mutex);
  auto it = known.find(device);
  if (it == known.end()) it = known.emplace(device, read_device_info(device)).first;
  return it->second;
}

}  // namespace pagedattn::cuda
