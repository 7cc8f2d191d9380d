#pragma once

#include "pagedattn/attention.h"

namespace pagedattn::kernels {

// Checks shapes, dtypes, pointers, the CSR page table (indptr monotone, page
// ids in range, kv_lens consistent with the pages and last_page_len) and the
// options. Throws InvalidArgument naming `call`, the field and the value.
void validate_attention_params(const AttentionParams& p, const char* call);

// 1 / sqrt(head_dim) unless the caller gave a scale.
inline float resolved_scale(const AttentionParams& p) {
  return p.options.scale ? *p.options.scale
                         : 1.0f / __builtin_sqrtf(static_cast<float>(p.kv.head_dim));
}

}  // namespace pagedattn::kernels
