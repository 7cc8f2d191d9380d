// copy_pages: whole pages (K, V, int8 token scales) between or within storages.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/nan_flags.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn {
namespace {

bool same_geometry(const PagedKVStorage& a, const PagedKVStorage& b) {
  return a.dtype == b.dtype && a.layout == b.layout && a.page_size == b.page_size &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.v_head_dim == b.v_head_dim && a.k_page_stride == b.k_page_stride &&
         a.v_page_stride == b.v_page_stride && a.v_in_k == b.v_in_k;
}

void validate_copy(const PagedKVStorage& src, const PagedKVStorage& dst,
                   std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  require(same_geometry(src, dst),
          "copy_pages: source and destination storages differ in dtype, "
          "layout, page size, heads or head dims");
  require(src.k_data && src.v_data && dst.k_data && dst.v_data,
          "copy_pages: storage data pointers must be non-null");
  require(src.dtype != DType::kINT8 || (src.k_token_scales && dst.k_token_scales &&
                                        src.v_token_scales && dst.v_token_scales),
          "copy_pages: int8 storages need token scales on both sides");
  std::vector<std::int64_t> dsts, srcs;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto [s, d] = pairs[i];
    require(s >= 0 && s < src.num_pages, "copy_pages: pair ", i, " source page ", s,
            " is outside [0, ", src.num_pages, ")");
    require(d >= 0 && d < dst.num_pages, "copy_pages: pair ", i, " destination page ", d,
            " is outside [0, ", dst.num_pages, ")");
    dsts.push_back(d);
    srcs.push_back(s);
  }
  std::sort(dsts.begin(), dsts.end());
  const auto dup = std::adjacent_find(dsts.begin(), dsts.end());
  require(dup == dsts.end(), "copy_pages: destination page ", dup == dsts.end() ? 0 : *dup,
          " appears more than once");
  if (src.k_data != dst.k_data) return;
  std::sort(srcs.begin(), srcs.end());
  for (std::int64_t d : dsts)
    require(!std::binary_search(srcs.begin(), srcs.end(), d), "copy_pages: page ", d,
            " is both a source and a destination");
}

}  // namespace

void copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  validate_copy(src, dst, pairs);
  const auto es = static_cast<std::int64_t>(dtype_size(src.dtype));
  const auto k_bytes = static_cast<std::size_t>(src.k_page_stride * es);
  const auto v_bytes = static_cast<std::size_t>(src.v_page_stride * es);
  const std::size_t scales = static_cast<std::size_t>(src.num_kv_heads) * src.page_size;
  for (const auto& [s, d] : pairs) {
    // The copy holds what the source page holds: its flag, or what its bytes say.
    if (std::uint8_t* flag = kernels::nan_flag(dst, d))
      *flag = src.page_may_hold_nan ? src.page_may_hold_nan[s]
                                    : std::uint8_t{kernels::page_holds_e4m3_nan(src, s)};
    std::memcpy(static_cast<std::byte*>(dst.k_data) + dst.k_offset(d, 0, 0) * es,
                static_cast<const std::byte*>(src.k_data) + src.k_offset(s, 0, 0) * es, k_bytes);
    if (src.v_in_k) {  // MLA: the row is K and V; one scale per row
      if (src.dtype == DType::kINT8)
        std::copy_n(src.k_token_scales + src.token_scale_index(s, 0, 0), scales,
                    dst.k_token_scales + dst.token_scale_index(d, 0, 0));
      continue;
    }
    std::memcpy(static_cast<std::byte*>(dst.v_data) + dst.v_offset(d, 0, 0) * es,
                static_cast<const std::byte*>(src.v_data) + src.v_offset(s, 0, 0) * es, v_bytes);
    if (src.dtype != DType::kINT8) continue;
    std::copy_n(src.k_token_scales + src.token_scale_index(s, 0, 0), scales,
                dst.k_token_scales + dst.token_scale_index(d, 0, 0));
    std::copy_n(src.v_token_scales + src.token_scale_index(s, 0, 0), scales,
                dst.v_token_scales + dst.token_scale_index(d, 0, 0));
  }
}

}  // namespace pagedattn
