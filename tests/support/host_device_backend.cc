#include "support/host_device_backend.h"

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::test {
namespace {

void* map_zeroed(std::size_t bytes, const char* what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw OutOfPages(
        detail::concat("HostDeviceBackend::", what, ": could not map ", bytes, " bytes"));
  return p;
}

void protect(const std::byte* p, std::size_t bytes, int protection) {
  if (mprotect(const_cast<std::byte*>(p), bytes, protection) != 0)
    throw InternalError("HostDeviceBackend: mprotect failed");
}

class CpuPlan final : public KVAttentionPlan {
 public:
  explicit CpuPlan(AttentionPlan plan) : plan_(std::move(plan)) {}
  std::size_t workspace_bytes() const override { return plan_.workspace_bytes; }
  const AttentionPlan& plan() const { return plan_; }

 private:
  AttentionPlan plan_;
};

}  // namespace

// Holds the backend's lock for one call with every device allocation
// readable and writable, and makes them inaccessible again after it.
class HostDeviceBackend::Unlocked {
 public:
  explicit Unlocked(const HostDeviceBackend& backend) : backend_(backend), lock_(backend.mutex_) {
    for (const auto& [start, bytes] : backend_.allocations_)
      protect(start, bytes, PROT_READ | PROT_WRITE);
  }
  ~Unlocked() {
    for (const auto& [start, bytes] : backend_.allocations_)
      mprotect(const_cast<std::byte*>(start), bytes, PROT_NONE);
  }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  const HostDeviceBackend& backend_;
  std::unique_lock<std::mutex> lock_;
};

HostDeviceBackend::~HostDeviceBackend() {
  for (const auto& [start, bytes] : allocations_) munmap(const_cast<std::byte*>(start), bytes);
}

HostDeviceBackend::Counts HostDeviceBackend::counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::int64_t HostDeviceBackend::live_allocations() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return std::ssize(allocations_);
}

void HostDeviceBackend::check_config(const KVCacheConfig& /*config*/) const {}

// --- pointer checks ---------------------------------------------------------------------

void HostDeviceBackend::require_device(const void* p, std::size_t bytes, const char* call,
                                       const char* what) const {
  const auto* b = static_cast<const std::byte*>(p);
  auto it = allocations_.upper_bound(b);
  const bool inside = p != nullptr && it != allocations_.begin() &&
                      b + bytes <= std::prev(it)->first + std::prev(it)->second;
  if (!inside)
    throw InternalError(detail::concat("HostDeviceBackend::", call, ": ", what, " = ", p, " (",
                                       bytes, " bytes) is not device memory"));
}

void HostDeviceBackend::require_host(const void* p, const char* call, const char* what) const {
  const auto* b = static_cast<const std::byte*>(p);
  auto it = allocations_.upper_bound(b);
  const bool device =
      it != allocations_.begin() && b < std::prev(it)->first + std::prev(it)->second;
  if (device)
    throw InternalError(detail::concat("HostDeviceBackend::", call, ": ", what, " = ", p,
                                       " is device memory, host memory expected"));
}

void HostDeviceBackend::require_device_storage(const PagedKVStorage& kv, const char* call) const {
  require_device(kv.k_data, 0, call, "kv.k_data");
  require_device(kv.v_data, 0, call, "kv.v_data");
  for (const void* p :
       {static_cast<const void*>(kv.k_token_scales), static_cast<const void*>(kv.v_token_scales),
        static_cast<const void*>(kv.k_head_scales), static_cast<const void*>(kv.v_head_scales),
        static_cast<const void*>(kv.page_may_hold_nan)})
    if (p != nullptr) require_device(p, 0, call, "a kv scale or flag array");
}

void HostDeviceBackend::require_host_storage(const PagedKVStorage& kv, const char* call) const {
  require_host(kv.k_data, call, "kv.k_data");
  require_host(kv.v_data, call, "kv.v_data");
  require_host(kv.k_token_scales, call, "kv.k_token_scales");
  require_host(kv.v_token_scales, call, "kv.v_token_scales");
}

// --- memory -------------------------------------------------------------------------------

void* HostDeviceBackend::allocate_zeroed(std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++counts_.allocations;
  if (bytes == 0) throw InvalidArgument("HostDeviceBackend::allocate_zeroed: bytes = 0");
  auto* p = static_cast<std::byte*>(map_zeroed(bytes, "allocate_zeroed"));
  protect(p, bytes, PROT_NONE);  // device memory: only this backend's calls touch it
  allocations_.emplace(p, bytes);
  return p;
}

void HostDeviceBackend::release(void* data, std::size_t bytes) noexcept {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++counts_.releases;
  auto it = allocations_.find(static_cast<const std::byte*>(data));
  if (it == allocations_.end() || it->second != bytes) std::abort();  // a release of nothing
  munmap(data, bytes);
  allocations_.erase(it);
}

void* HostDeviceBackend::allocate_host(std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++counts_.host_allocations;
  return map_zeroed(bytes, "allocate_host");
}

void HostDeviceBackend::release_host(void* data, std::size_t bytes) noexcept {
  munmap(data, bytes);
}

void HostDeviceBackend::copy(const DeviceCopy& c) {
  const Unlocked unlocked(*this);
  ++counts_.copies;
  if (c.rows == 0 || c.row_bytes == 0) return;
  const std::size_t dst_span = (c.rows - 1) * c.dst_pitch + c.row_bytes;
  const std::size_t src_span = (c.rows - 1) * c.src_pitch + c.row_bytes;
  require_device(c.dst, dst_span, "copy", "dst");
  require_device(c.src, src_span, "copy", "src");
  require<InternalError>(c.rows == 1 || (c.dst_pitch >= c.row_bytes && c.src_pitch >= c.row_bytes),
                         "HostDeviceBackend::copy: pitches below row_bytes");
  for (std::size_t r = 0; r < c.rows; ++r)
    std::memcpy(static_cast<std::byte*>(c.dst) + r * c.dst_pitch,
                static_cast<const std::byte*>(c.src) + r * c.src_pitch, c.row_bytes);
}

void HostDeviceBackend::to_host(void* dst, const void* src, std::size_t bytes) {
  const Unlocked unlocked(*this);
  ++counts_.to_host;
  if (bytes == 0) return;
  require_device(src, bytes, "to_host", "src");
  require_host(dst, "to_host", "dst");
  std::memcpy(dst, src, bytes);
}

void HostDeviceBackend::from_host(void* dst, const void* src, std::size_t bytes) {
  const Unlocked unlocked(*this);
  ++counts_.from_host;
  if (bytes == 0) return;
  require_device(dst, bytes, "from_host", "dst");
  require_host(src, "from_host", "src");
  std::memcpy(dst, src, bytes);
}

void HostDeviceBackend::synchronize() {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++counts_.synchronizes;
}

// --- kernels ------------------------------------------------------------------------------

void HostDeviceBackend::copy_pages(
    const PagedKVStorage& src, const PagedKVStorage& dst,
    std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
    PageCopyDirection direction) {
  const Unlocked unlocked(*this);
  ++counts_.copy_pages;
  if (direction == PageCopyDirection::kHostToDevice) {
    require_host_storage(src, "copy_pages");
    require_device_storage(dst, "copy_pages");
  } else {
    require_device_storage(src, "copy_pages");
    require_host_storage(dst, "copy_pages");
  }
  pagedattn::copy_pages(src, dst, src_dst_pages);
}

void HostDeviceBackend::append(const AppendParams& p) {
  const Unlocked unlocked(*this);
  ++counts_.appends;
  if (p.num_tokens > 0) {
    require_device(p.k.data, 0, "append", "k.data");
    if (p.v.data != nullptr) require_device(p.v.data, 0, "append", "v.data");
    require_device(p.slot_mapping, std::size_t(p.num_tokens) * sizeof(std::int64_t), "append",
                   "slot_mapping");
  }
  require_device_storage(p.kv, "append");
  append_paged_kv(p);
}

void HostDeviceBackend::apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                                   std::int32_t head_dim, const std::int32_t* positions,
                                   const RopeConfig& config) {
  const Unlocked unlocked(*this);
  ++counts_.ropes;
  require<InternalError>(config.cos_cache == nullptr,
                         "HostDeviceBackend::apply_rope: a cos/sin cache is not part of the "
                         "interface");
  if (num_tokens > 0) {
    require_device(x.data, 0, "apply_rope", "x.data");
    require_device(positions, std::size_t(num_tokens) * sizeof(std::int32_t), "apply_rope",
                   "positions");
  }
  pagedattn::apply_rope(x, num_tokens, num_heads, head_dim, positions, config);
}

std::unique_ptr<KVAttentionPlan> HostDeviceBackend::plan_attention(
    const AttentionParams& host_view, const AttentionPlanOptions& options) {
  const Unlocked unlocked(*this);
  ++counts_.plans;
  const PagedKVTable& t = host_view.table;
  for (const void* p :
       {static_cast<const void*>(t.qo_indptr), static_cast<const void*>(t.kv_indptr),
        static_cast<const void*>(t.kv_indices), static_cast<const void*>(t.kv_lens),
        static_cast<const void*>(t.kv_sink_lens), static_cast<const void*>(t.kv_gap_lens),
        static_cast<const void*>(host_view.tree_mask.tree_begin)})
    require_host(p, "plan_attention", "a table array");
  require_device_storage(host_view.kv, "plan_attention");
  const AttentionShape shape{host_view.num_qo_heads, host_view.kv.num_kv_heads,
                             host_view.kv.head_dim, host_view.kv.v_head_dim};
  return std::make_unique<CpuPlan>(pagedattn::plan_attention(t, shape, host_view.options, options));
}

void HostDeviceBackend::attention(const AttentionParams& p, const KVAttentionPlan& plan,
                                  void* workspace) {
  const Unlocked unlocked(*this);
  ++counts_.attentions;
  const auto* cpu_plan = dynamic_cast<const CpuPlan*>(&plan);
  require<InternalError>(cpu_plan != nullptr, "HostDeviceBackend::attention: a foreign plan");
  const char* call = "attention";
  const PagedKVTable& t = p.table;
  require_device(t.qo_indptr, 0, call, "table.qo_indptr");
  require_device(t.kv_indptr, 0, call, "table.kv_indptr");
  require_device(t.kv_indices, 0, call, "table.kv_indices");
  require_device(t.kv_last_page_len, 0, call, "table.kv_last_page_len");
  require_device(t.kv_lens, 0, call, "table.kv_lens");
  for (const void* a :
       {static_cast<const void*>(t.kv_sink_lens), static_cast<const void*>(t.kv_gap_lens),
        static_cast<const void*>(p.tree_mask.tree_begin),
        static_cast<const void*>(p.tree_mask.node_indptr),
        static_cast<const void*>(p.tree_mask.enter), static_cast<const void*>(p.tree_mask.exit),
        static_cast<const void*>(p.tree_mask.positions),
        static_cast<const void*>(p.options.alibi_slopes), static_cast<const void*>(p.options.sinks),
        static_cast<const void*>(p.lse), static_cast<const void*>(p.q.data),
        static_cast<const void*>(p.o.data)})
    if (a != nullptr) require_device(a, 0, call, "an array of the params");
  require_device_storage(p.kv, call);
  const std::size_t bytes = cpu_plan->plan().workspace_bytes;
  if (bytes > 0) require_device(workspace, bytes, call, "workspace");
  paged_attention(p, cpu_plan->plan(), {static_cast<std::byte*>(workspace), bytes});
}

}  // namespace pagedattn::test
