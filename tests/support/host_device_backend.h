// HostDeviceBackend: a KVDeviceBackend over host memory and the CPU kernels,
// for testing device caches where there is no GPU. Its "device memory" is
// memory it mapped itself and keeps inaccessible (PROT_NONE) except inside
// its own calls, so a cache that touched page bytes without going through
// the backend crashes at once; and every call checks that each pointer it
// gets is on the side the interface says (device memory inside one of its
// allocations, host memory outside them). It counts its calls, so a test
// can see which kinds of byte movement a cache made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>

#include "pagedattn/kv_device.h"

namespace pagedattn::test {

class HostDeviceBackend final : public KVDeviceBackend {
 public:
  struct Counts {
    std::int64_t allocations = 0, releases = 0, host_allocations = 0;
    std::int64_t copies = 0, to_host = 0, from_host = 0, synchronizes = 0;
    std::int64_t copy_pages = 0, appends = 0, ropes = 0, plans = 0, attentions = 0;
  };

  // `device`: what device() reports (the cache checks it against its config).
  explicit HostDeviceBackend(KVDevice device = KVDevice::kCuda) : device_(device) {}
  ~HostDeviceBackend() override;

  Counts counts() const;
  // Device allocations not yet released.
  std::int64_t live_allocations() const;

  KVDevice device() const override { return device_; }
  void check_config(const KVCacheConfig& config) const override;

  void* allocate_zeroed(std::size_t bytes) override;
  void release(void* data, std::size_t bytes) noexcept override;
  void* allocate_host(std::size_t bytes) override;
  void release_host(void* data, std::size_t bytes) noexcept override;
  void copy(const DeviceCopy& copy) override;
  void to_host(void* dst, const void* src, std::size_t bytes) override;
  void from_host(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override;

  void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                  std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                  PageCopyDirection direction) override;
  void append(const AppendParams& params) override;
  void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                  std::int32_t head_dim, const std::int32_t* positions,
                  const RopeConfig& config) override;
  std::unique_ptr<KVAttentionPlan> plan_attention(const AttentionParams& host_view,
                                                  const AttentionPlanOptions& options) override;
  void attention(const AttentionParams& params, const KVAttentionPlan& plan,
                 void* workspace) override;

 private:
  class Unlocked;  // the device allocations made accessible for one call

  // Throws InternalError naming `call` and `what` unless [p, p + bytes) lies
  // inside one device allocation (require_device) or p is outside every
  // device allocation (require_host).
  void require_device(const void* p, std::size_t bytes, const char* call, const char* what) const;
  void require_host(const void* p, const char* call, const char* what) const;
  void require_device_storage(const PagedKVStorage& kv, const char* call) const;
  void require_host_storage(const PagedKVStorage& kv, const char* call) const;

  KVDevice device_;
  mutable std::mutex mutex_;
  std::map<const std::byte*, std::size_t> allocations_;  // device: start -> mapped bytes
  Counts counts_;
};

}  // namespace pagedattn::test
