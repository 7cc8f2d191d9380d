// append_paged_kv: new K/V rows into pages through a slot mapping.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/convert.h"
#include "kernels/append_tokens.h"
#include "kernels/nan_flags.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn {
namespace kernels {

void validate_append(const AppendParams& p) {
  const PagedKVStorage& kv = p.kv;
  require(p.num_tokens >= 0, "append_paged_kv: num_tokens = ", p.num_tokens, " must be >= 0");
  if (p.num_tokens == 0) return;
  require(p.slot_mapping && p.k.data && (p.v.data || kv.v_in_k) && kv.k_data && kv.v_data,
          "append_paged_kv: slot_mapping, k, v and the storage must be non-null");
  require(!kv.v_in_k || p.v.data == nullptr,
          "append_paged_kv: v.data must be null for a storage whose V lies in K (MLA)");
  require(is_activation_dtype(p.k.dtype) && (kv.v_in_k || is_activation_dtype(p.v.dtype)),
          "append_paged_kv: k.dtype = ", dtype_name(p.k.dtype),
          " and v.dtype = ", dtype_name(p.v.dtype), " must be float32, float16 or bfloat16");
  require(kv.dtype != DType::kINT8 || (kv.k_token_scales && kv.v_token_scales),
          "append_paged_kv: int8 storage needs k_token_scales and v_token_scales");
  const bool fp8 = is_fp8(kv.dtype);
  for (std::int32_t h = 0; fp8 && h < kv.num_kv_heads; ++h) {
    const float ks = kv.k_head_scales ? kv.k_head_scales[h] : kv.k_scale;
    const float vs = kv.v_head_scales ? kv.v_head_scales[h] : kv.v_scale;
    require(ks > 0.0f && vs > 0.0f && std::isfinite(ks) && std::isfinite(vs),
            "append_paged_kv: fp8 scales of head ", h, " are ", ks, ", ", vs,
            "; they must be finite and > 0");
  }
  const std::int64_t slots = kv.num_pages * kv.page_size;
  std::vector<std::int64_t> used;
  used.reserve(static_cast<std::size_t>(p.num_tokens));
  for (std::int32_t t = 0; t < p.num_tokens; ++t) {
    const std::int64_t s = p.slot_mapping[t];
    require(s == -1 || (s >= 0 && s < slots), "append_paged_kv: slot_mapping[", t, "] = ", s,
            " is outside [0, ", slots, ") and not -1");
    if (s >= 0) used.push_back(s);
  }
  std::sort(used.begin(), used.end());
  const auto dup = std::adjacent_find(used.begin(), used.end());
  require(dup == used.end(), "append_paged_kv: slot ", dup == used.end() ? 0 : *dup,
          " appears more than once in slot_mapping");
}

}  // namespace kernels

namespace {

// Writes one head row: float storage converts, fp8 divides by its scale,
// int8 derives and stores a per-row scale.
void write_row(const void* src, DType src_dtype, std::int32_t dim, void* dst, DType dst_dtype,
               float fp8_scale, float* int8_scale) {
  if (dst_dtype == DType::kINT8) {
    const float scale = kernels::abs_max_row(src, src_dtype, dim) / 127.0f;
    *int8_scale = scale;
    kernels::convert_row(src, src_dtype, dst, dst_dtype, dim, scale > 0.0f ? 1.0f / scale : 0.0f);
  } else if (is_fp8(dst_dtype)) {
    kernels::convert_row(src, src_dtype, dst, dst_dtype, dim, 1.0f / fp8_scale);
  } else {
    kernels::convert_row(src, src_dtype, dst, dst_dtype, dim, 1.0f);
  }
}

}  // namespace

void append_paged_kv(const AppendParams& p) {
  kernels::validate_append(p);
#pragma omp parallel for schedule(static) if (std::int64_t{p.num_tokens} * p.kv.num_kv_heads > 4096)
  for (std::int32_t t = 0; t < p.num_tokens; ++t) kernels::append_tokens(p, t, t + 1);
}

namespace kernels {

void append_tokens(const AppendParams& p, std::int32_t begin, std::int32_t end) {
  const PagedKVStorage& kv = p.kv;
  const auto es = static_cast<std::int64_t>(dtype_size(kv.dtype));
  const auto ks = static_cast<std::int64_t>(dtype_size(p.k.dtype));
  const auto vs = static_cast<std::int64_t>(dtype_size(p.v.dtype));
  for (std::int32_t t = begin; t < end; ++t) {
    const std::int64_t s = p.slot_mapping[t];
    if (s < 0) continue;
    const std::int64_t page = s / kv.page_size, slot = s % kv.page_size;
    for (std::int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const std::int64_t ti = kv.token_scale_index(page, h, slot);
      const auto* k_src = static_cast<const std::byte*>(p.k.data) +
                          (t * p.k.token_stride + h * p.k.head_stride) * ks;
      const auto* v_src = static_cast<const std::byte*>(p.v.data) +
                          (t * p.v.token_stride + h * p.v.head_stride) * vs;
      write_row(k_src, p.k.dtype, kv.head_dim,
                static_cast<std::byte*>(kv.k_data) + kv.k_offset(page, h, slot) * es, kv.dtype,
                kv.k_head_scales ? kv.k_head_scales[h] : kv.k_scale,
                kv.k_token_scales ? kv.k_token_scales + ti : nullptr);
      if (kv.v_in_k) continue;
      write_row(v_src, p.v.dtype, kv.v_head_dim,
                static_cast<std::byte*>(kv.v_data) + kv.v_offset(page, h, slot) * es, kv.dtype,
                kv.v_head_scales ? kv.v_head_scales[h] : kv.v_scale,
                kv.v_token_scales ? kv.v_token_scales + ti : nullptr);
    }
    flag_e4m3_nan_slot(kv, page, slot);
  }
}

}  // namespace kernels
}  // namespace pagedattn
