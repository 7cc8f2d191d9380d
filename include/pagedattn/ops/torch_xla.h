// torch_xla's ragged paged attention (torch_xla.experimental.custom_kernel.
// ragged_paged_attention) over the CPU kernels, with its conventions
// (docs/ops.md): sm_scale defaults to 1.0 (not 1/sqrt(D)); sliding_window = W
// shows W keys; soft_cap must not be 0; entries past num_seqs[0] are padding
// and ignored (their output rows are zeroed); fp8 pages dequantise as
// stored * k_scale. Its validation rules are checked first, plus the bounds
// it leaves unchecked; failures throw pagedattn::InvalidArgument.
#pragma once

#include <cstdint>
#include <optional>

#include "pagedattn/ops/tensor.h"

namespace pagedattn::ops::torch_xla {

struct RaggedPagedAttentionParams {
  TensorView
      q;  // [T, Hq, D] (T = max_num_batched_tokens; rows past cu_q_lens[num_seqs] are padding)
  // Pages: either kv_pages [P, page_size, 2 Hkv, D] with the K heads at even
  // and the V heads at odd combined indices (v2), or split k_pages / v_pages
  // [P, page_size, Hkv * D].
  std::optional<TensorView> kv_pages;
  std::optional<TensorView> k_pages, v_pages;
  IndexView kv_lens;       // [max_num_seqs] int32
  IndexView page_indices;  // [max_num_seqs, pages_per_seq] int32
  IndexView cu_q_lens;     // [max_num_seqs + 1] int32
  IndexView num_seqs;      // [1] int32
  float sm_scale = 1.0f;
  std::optional<std::int32_t> sliding_window;  // W > 0
  std::optional<float> soft_cap;               // != 0
  std::optional<float> k_scale, v_scale;       // fp8 pages only
  TensorView output;                           // [T, Hq, D], q's dtype
};

void ragged_paged_attention(const RaggedPagedAttentionParams& params);

}  // namespace pagedattn::ops::torch_xla
