// ONNX Runtime PagedAttention's validation and its translation into the
// kernels' views, shared by the CPU operator (ort.cc) and the CUDA one
// (kernels/cuda/cuda_ops.cc): the CUDA operator runs the same rules on host
// copies of the index arrays and the same translation over device pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "op_checks.h"
#include "op_support.h"
#include "pagedattn/attention.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn::ops::ort::internal {

// Extents of a call, derived from its inputs.
struct Shape {
  std::int32_t tokens = 0, batch = 0, head_size = 0, hq = 0, hkv = 0;
  std::int32_t block_size = 0, max_blocks = 0, rotary_dim = 0;
  std::int32_t rope_rows = 0;  // positions the rotation reads (kFull only)
  std::int64_t num_blocks = 0;
  bool packed = false;
};

// Every rule of the operator, messages starting with `call`. kFull reads the
// index arrays (host memory) and fills batch.qo_indptr, batch.kv_lens and
// s.rope_rows; kMetadata reads no index value and leaves `batch` alone.
Shape validate(const char* call, const PagedAttentionParams& p, checks::Validation validation,
               RaggedBatch& batch);

// The new tokens' q, k, v ([tokens][heads][head_size], packed QKV or
// separate tensors) and the output, over the caller's pointers.
struct HeadViews {
  HeadTensor q, k, v, o;
};
HeadViews head_views(const PagedAttentionParams& p, const Shape& s);

// key_cache / value_cache as the kernels' storage (NHD, the caches' strides).
PagedKVStorage kv_storage(const PagedAttentionParams& p, const Shape& s);

// Slot of each new token: slot_mapping's, or its position past_seqlens[b] + j
// in its sequence's blocks. Needs kFull's batch.
void fill_slots(const PagedAttentionParams& p, const Shape& s, const RaggedBatch& batch,
                std::vector<std::int64_t>& slots);
// Position past_seqlens[b] + j of each new token. Needs kFull's batch.
void fill_positions(const PagedAttentionParams& p, const Shape& s, const RaggedBatch& batch,
                    std::vector<std::int32_t>& positions);

// do_rotary's rotation over f32 cos / sin tables [s.rope_rows][rotary_dim / 2]
// (cos_cache and sin_cache as f32, where the caller keeps them).
RopeConfig rope_config(const PagedAttentionParams& p, const Shape& s, const float* cos,
                       const float* sin);
// Elements of each table rope_config reads.
inline std::int64_t rope_table_elements(const Shape& s) {
  return std::int64_t{s.rope_rows} * (s.rotary_dim / 2);
}

// scale, softcap, local_window_size in the kernels' terms; `sinks`: head_sink
// as f32 [num_heads] where the caller keeps it, or null.
AttentionOptions attention_options(const PagedAttentionParams& p, const float* sinks);

}  // namespace pagedattn::ops::ort::internal
