// KVDeviceBackend: where a device cache's page bytes live and the data
// movement and kernels on them. A PagedKVCache built with a backend
// (KVCacheConfig.device != kCpu) keeps its metadata (page pool, sequences,
// plans, prefix index) on the host as always, and every byte of K/V it
// moves or reads goes through these calls. pagedattn::cuda::kv_device_backend
// (pagedattn/cuda.h) is the CUDA one.
//
// "Device memory" below is memory the backend allocated with
// allocate_zeroed (or, for views into it, pointers inside it); "host memory"
// is ordinary process memory. Calls are ordered: each takes effect after
// every earlier call on the same backend (a CUDA backend enqueues them on
// one stream), so only to_host and synchronize ever wait.
//
// Threading: a backend may serve several caches, each calling it under its
// own lock, so its calls must be safe from several threads at once (the
// CUDA backend's are: it holds no mutable state). The caches own their
// buffers; the backend keeps nothing of theirs between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "pagedattn/attention.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn {

// `rows` runs of `row_bytes` bytes within device memory: run r goes from
// src + r * src_pitch to dst + r * dst_pitch (pitches >= row_bytes when
// rows > 1). Source and destination runs must not overlap.
struct DeviceCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t row_bytes = 0;
  std::size_t rows = 1;
  std::size_t dst_pitch = 0;
  std::size_t src_pitch = 0;
};

// Which side of a copy_pages is the device.
enum class PageCopyDirection : std::uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };

// A backend's attention plan for one batch, options and dtypes: opaque to
// the cache, which keeps it for the layers of a step.
class KVAttentionPlan {
 public:
  virtual ~KVAttentionPlan() = default;
  // Device workspace attention() needs (the cache allocates it).
  virtual std::size_t workspace_bytes() const = 0;
};

class KVDeviceBackend {
 public:
  virtual ~KVDeviceBackend() = default;

  // The KVCacheConfig.device a cache built with this backend names.
  virtual KVDevice device() const = 0;
  // Throws Unsupported, naming the field, for a (validated, resolved)
  // config whose caches this backend cannot serve. Called by the cache's
  // constructor before anything is allocated; needs no device.
  virtual void check_config(const KVCacheConfig& config) const = 0;

  // --- memory ------------------------------------------------------------------
  // `bytes` (> 0) of zeroed device memory, 256-byte aligned. OutOfPages when
  // the device has no room.
  virtual void* allocate_zeroed(std::size_t bytes) = 0;
  // Frees what allocate_zeroed returned, after every call that uses it.
  virtual void release(void* data, std::size_t bytes) noexcept = 0;
  // `bytes` (> 0) of zeroed host memory for a cache's host tier (pinned
  // for the CUDA backend, so page swaps overlap). OutOfPages without room.
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void release_host(void* data, std::size_t bytes) noexcept = 0;
  // Device-to-device copy (see DeviceCopy).
  virtual void copy(const DeviceCopy& copy) = 0;
  // Device to host: returns once the bytes are in `dst`.
  virtual void to_host(void* dst, const void* src, std::size_t bytes) = 0;
  // Host to device: `src` may be reused as soon as this returns.
  virtual void from_host(void* dst, const void* src, std::size_t bytes) = 0;
  // Returns once every call made so far has taken effect.
  virtual void synchronize() = 0;

  // --- kernels -------------------------------------------------------------------
  // copy_pages (kv_ops.h) between a host storage and a device storage; the
  // pairs are host memory. The copies may still be in flight when it
  // returns: synchronize before the host side is read, written or freed.
  virtual void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                          std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                          PageCopyDirection direction) = 0;
  // append_paged_kv (kv_ops.h); every pointer, the slot mapping included,
  // is device memory.
  virtual void append(const AppendParams& params) = 0;
  // apply_rope (rope.h) in place on device memory: x and positions are
  // device memory, the config's freq_factors host memory (no cos/sin cache).
  virtual void apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                          std::int32_t head_dim, const std::int32_t* positions,
                          const RopeConfig& config) = 0;
  // Plans attention over `host_view`: its table arrays (and tree mask) are
  // host memory; its other pointers are the device ones the run will get
  // (read by no one here). Validates as the kernels do; Unsupported for
  // what the backend does not serve.
  virtual std::unique_ptr<KVAttentionPlan> plan_attention(const AttentionParams& host_view,
                                                          const AttentionPlanOptions& options) = 0;
  // Runs `plan` (made from the same batch, shapes, dtypes and options) over
  // `params`, whose every pointer (table arrays, q, o, lse, pages, scales,
  // options.alibi_slopes and sinks) is device memory; `workspace` is device
  // memory of plan.workspace_bytes().
  virtual void attention(const AttentionParams& params, const KVAttentionPlan& plan,
                         void* workspace) = 0;
};

}  // namespace pagedattn
