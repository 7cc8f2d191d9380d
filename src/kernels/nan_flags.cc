#include "kernels/nan_flags.h"

#include <atomic>
#include <cstddef>

#include "cpu/convert.h"

namespace pagedattn::kernels {

bool slot_holds_e4m3_nan(const PagedKVStorage& s, std::int64_t page, std::int64_t slot) {
  const auto* k = static_cast<const std::byte*>(s.k_data);
  const auto* v = static_cast<const std::byte*>(s.v_data);
  for (std::int32_t h = 0; h < s.num_kv_heads; ++h) {
    if (e4m3_has_nan(k + s.k_offset(page, h, slot), s.head_dim)) return true;
    if (!s.v_in_k && e4m3_has_nan(v + s.v_offset(page, h, slot), s.v_head_dim)) return true;
  }
  return false;
}

bool page_holds_e4m3_nan(const PagedKVStorage& s, std::int64_t page) {
  for (std::int64_t slot = 0; slot < s.page_size; ++slot)
    if (slot_holds_e4m3_nan(s, page, slot)) return true;
  return false;
}

void flag_e4m3_nan_slot(const PagedKVStorage& s, std::int64_t page, std::int64_t slot) {
  std::uint8_t* flag = nan_flag(s, page);
  if (flag && slot_holds_e4m3_nan(s, page, slot))
    std::atomic_ref<std::uint8_t>(*flag).store(1, std::memory_order_relaxed);
}

}  // namespace pagedattn::kernels
