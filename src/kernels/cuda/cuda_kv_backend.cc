// cuda::kv_device_backend: PagedKVCache's device storage on a GPU. Memory
// from cudaMalloc / cudaHostAlloc, copies and kernels enqueued on one
// stream, attention planned on the host by plan_cuda_attention. The backend
// keeps no mutable state but the device's planning limits, read once.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_device.h"

namespace pagedattn::cuda {
namespace {

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "pagedattn::cuda::kv_device_backend", what);
}

// An allocation the device (or host) has no room for: OutOfPages, as a
// CPU cache's failed mapping is; no device at all: Unsupported.
void check_allocation(cudaError_t status, const char* what, std::size_t bytes) {
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls start clean
    throw OutOfPages(::pagedattn::detail::concat("pagedattn::cuda::kv_device_backend: ", what,
                                                 " of ", bytes, " bytes failed: out of memory"));
  }
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    throw Unsupported(::pagedattn::detail::concat("pagedattn::cuda::kv_device_backend: ", what,
                                                  " failed: no CUDA device (",
                                                  cudaGetErrorString(status), ")"));
  }
  check_cuda(status, what);
}

class CudaAttentionPlanHolder final : public KVAttentionPlan {
 public:
  explicit CudaAttentionPlanHolder(CudaAttentionPlan plan) : plan_(std::move(plan)) {}
  std::size_t workspace_bytes() const override { return plan_.workspace_bytes; }
  const CudaAttentionPlan& plan() const { return plan_; }

 private:
  CudaAttentionPlan plan_;
};

class CudaKVBackend final : public KVDeviceBackend {
 public:
  explicit CudaKVBackend(Stream stream) : stream_(static_cast<cudaStream_t>(stream)) {}

  KVDevice device() const override { return KVDevice::kCuda; }

  void check_config(const KVCacheConfig& config) const override {
    require<Unsupported>(config.kv_dtype != DType::kF32,
                         "cuda::kv_device_backend: KVCacheConfig.kv_dtype = float32 is not served "
                         "on CUDA; store K/V as float16, bfloat16, float8_e4m3fn, float8_e5m2 or "
                         "int8");
  }

  void* allocate_zeroed(std::size_t bytes) override {
    void* data = nullptr;
    check_allocation(cudaMalloc(&data, bytes), "cudaMalloc", bytes);
    const cudaError_t zeroed = cudaMemsetAsync(data, 0, bytes, stream_);
    if (zeroed != cudaSuccess) cudaFree(data);
    check_cuda(zeroed, "cudaMemsetAsync zeroing a new allocation");
    return data;
  }
  // Queued work may still use the memory: the stream finishes first.
  void release(void* data, std::size_t /*bytes*/) noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFree(data);
  }
  void* allocate_host(std::size_t bytes) override {
    void* data = nullptr;
    check_allocation(cudaHostAlloc(&data, bytes, cudaHostAllocDefault), "cudaHostAlloc", bytes);
    std::memset(data, 0, bytes);
    return data;
  }
  void release_host(void* data, std::size_t /*bytes*/) noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFreeHost(data);
  }

  void copy(const DeviceCopy& c) override {
    if (c.rows == 0 || c.row_bytes == 0) return;
    if (c.rows == 1) {
      check_cuda(cudaMemcpyAsync(c.dst, c.src, c.row_bytes, cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpyAsync (device to device)");
      return;
    }
    check_cuda(cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.row_bytes, c.rows,
                                 cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpy2DAsync (device to device)");
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync (device to host)");
    synchronize();
  }
  // The cache passes pageable host memory, which the runtime stages before
  // it returns: `src` may be reused at once.
  void from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync (host to device)");
  }
  void synchronize() override {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                  std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                  PageCopyDirection direction) override {
    cuda_swap_pages(src, dst, src_dst_pages,
                    direction == PageCopyDirection::kHostToDevice ? SwapDirection::kHostToDevice
                                                                  : SwapDirection::kDeviceToHost,
                    stream_);
  }
  void append(const AppendParams& params) override { cuda_append_paged_kv(params, stream_); }
  void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                  std::int32_t head_dim, const std::int32_t* positions,
                  const RopeConfig& config) override {
    cuda_apply_rope(x, num_tokens, num_heads, head_dim, positions, config, stream_);
  }

  std::unique_ptr<KVAttentionPlan> plan_attention(const AttentionParams& host_view,
                                                  const AttentionPlanOptions& options) override {
    CudaPlanOptions o = limits();
    o.min_kv_chunk = options.min_kv_chunk;
    o.fixed_kv_chunk = options.fixed_kv_chunk;
    return std::make_unique<CudaAttentionPlanHolder>(plan_cuda_attention(host_view, o));
  }
  void attention(const AttentionParams& params, const KVAttentionPlan& plan,
                 void* workspace) override {
    const auto* cuda_plan = dynamic_cast<const CudaAttentionPlanHolder*>(&plan);
    require<InternalError>(cuda_plan != nullptr,
                           "cuda::kv_device_backend: attention was given a plan another backend "
                           "made");
    cuda_paged_attention(params, cuda_plan->plan(), workspace, stream_);
  }

 private:
  // The SM count and shared-memory limit the planner needs, read from the
  // current device on first use (planning without them would query the
  // device on every call).
  CudaPlanOptions limits() {
    std::call_once(limits_read_, [this] {
      const DeviceInfo info = current_device_info();
      limits_.num_sms = info.sm_count;
      limits_.max_shared_bytes = static_cast<std::int32_t>(info.max_shared_bytes_per_block);
    });
    return limits_;
  }

  cudaStream_t stream_;
  std::once_flag limits_read_;
  CudaPlanOptions limits_;
};

}  // namespace

std::shared_ptr<KVDeviceBackend> kv_device_backend(Stream stream) {
  return std::make_shared<CudaKVBackend>(stream);
}

}  // namespace pagedattn::cuda
