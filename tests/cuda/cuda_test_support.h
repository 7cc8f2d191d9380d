// Helpers of the CUDA suite: skipping without a GPU, and device buffers
// filled from and read back to host vectors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedattn/cuda.h"

// Skips the test where no GPU can run it, naming why (CI has none).
#define PAGEDATTN_REQUIRE_GPU()                                                    \
  do {                                                                             \
    if (::pagedattn::cuda::device_count() == 0)                                    \
      GTEST_SKIP() << "no CUDA device: " << ::pagedattn::cuda::no_device_reason(); \
  } while (0)

namespace pagedattn::testing {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Device memory of `bytes`, freed on destruction.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBytes(const void* host, std::size_t bytes) : DeviceBytes(bytes) {
    if (bytes > 0) check_cuda(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "upload");
  }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& host)
      : DeviceBytes(host.data(), host.size() * sizeof(T)) {}
  DeviceBytes(DeviceBytes&& other) noexcept { *this = std::move(other); }
  DeviceBytes& operator=(DeviceBytes&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBytes() {
    if (data_) cudaFree(data_);
  }
  void* get() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  // Fills every byte with `value` (0xff makes NaNs of every float type).
  void fill(int value) { check_cuda(cudaMemset(data_, value, bytes_), "cudaMemset"); }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    check_cuda(cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
               "download");
    return host;
  }
  void download_to(void* host) const {
    check_cuda(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "download");
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Waits for the device and turns an asynchronous kernel fault into a failure.
inline void synchronize() {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace pagedattn::testing
