// Kernels that move K/V data: append through a slot mapping (quantising on
// write) and page copy / swap (RoPE is in rope.h). Each validates all its input first.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "pagedattn/attention.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn {

// --- append -------------------------------------------------------------------------

struct AppendParams {
  HeadTensor k;                                // [num_tokens][num_kv_heads][head_dim]
  HeadTensor v;                                // [num_tokens][num_kv_heads][v_head_dim]
  const std::int64_t* slot_mapping = nullptr;  // [num_tokens] page * page_size + offset; -1 skips
  std::int32_t num_tokens = 0;
  PagedKVStorage kv;  // destination pages of one layer
};

// Writes each token's K/V rows to its slot, converting to kv.dtype with round
// to nearest even. fp8 stores value / scale (per head or per tensor),
// saturating at the format's max; int8 stores round(value / s) with
// s = max|row| / 127 per token and head, written to kv.{k,v}_token_scales.
// Slots must be unique (a duplicate would make the result order-dependent).
// e4m3 storage with page_may_hold_nan: the pages written a NaN code get their
// flag set.
void append_paged_kv(const AppendParams& params);

// --- page copy / swap -----------------------------------------------------------------

// Copies pages (K, V and int8 token scales) from `src` to `dst`, pairs
// (src_page, dst_page). The two storages must have the same page geometry
// and dtype; they may be the same storage (copy-on-write, vLLM copy_blocks)
// or a device/host pair (vLLM swap_blocks). Destinations must be distinct
// and, within one storage, no page may be both a source and a destination.
// An e4m3 destination with page_may_hold_nan gets the source page's flag (or,
// where the source keeps none, whether the page's bytes hold a NaN code).
void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages);

}  // namespace pagedattn
