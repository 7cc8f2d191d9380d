// PagedKVStorage::page_may_hold_nan: the checks its writers make, on bytes
// they wrote or copied without going through append_paged_kv.
#pragma once

#include <cstdint>

#include "pagedattn/paged_kv.h"

namespace pagedattn::kernels {

// The flag of `page`, or null where the storage keeps none (not e4m3, or no
// flag array).
inline std::uint8_t* nan_flag(const PagedKVStorage& s, std::int64_t page) {
  return s.dtype == DType::kFP8E4M3 && s.page_may_hold_nan ? s.page_may_hold_nan + page : nullptr;
}

// Whether the K or V row of any head at (page, slot) holds an e4m3 NaN code.
bool slot_holds_e4m3_nan(const PagedKVStorage& s, std::int64_t page, std::int64_t slot);
// The same for every slot of the page, written or not.
bool page_holds_e4m3_nan(const PagedKVStorage& s, std::int64_t page);

// Sets the flag of `page` where the storage keeps one and the slot's rows
// hold a NaN code; atomically, as threads writing other slots of the page
// (append_paged_kv) may set it too. Never clears it.
void flag_e4m3_nan_slot(const PagedKVStorage& s, std::int64_t page, std::int64_t slot);

}  // namespace pagedattn::kernels
