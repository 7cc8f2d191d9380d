// ONNX Runtime's com.microsoft.PagedAttention contrib operator over the CPU
// kernels, with ORT's conventions (docs/ops.md):
//   scale 0 -> 1/sqrt(head_size); softcap 0 -> off; local_window_size L >= 1
//   shows the L most recent keys, the query's own included (current ORT;
//   -1 off, 0 refused); rotary (do_rotary) rotates q and the new k at
//   position past_seqlens[b] + j before they are cached; zero new tokens for
//   any or every sequence is valid.
// Every input is validated before the caches are written; a failed call
// throws pagedattn::InvalidArgument and leaves the caches byte-identical.
#pragma once

#include <cstdint>
#include <optional>

#include "pagedattn/ops/tensor.h"

namespace pagedattn::ops::ort {

// T = tokens of this step, B = sequences, D = head_size, Hq = num_heads,
// Hkv = kv_num_heads. Float tensors must be dense (ORT tensors are).
struct PagedAttentionParams {
  TensorView query;               // (T, Hq*D), or packed QKV (T, (Hq + 2 Hkv)*D) when key is absent
  std::optional<TensorView> key;  // (T, Hkv*D); absent iff query is packed
  std::optional<TensorView> value;  // (T, Hkv*D); present iff key is
  TensorView
      key_cache;  // (num_blocks, block_size, Hkv*D) or (num_blocks, block_size, Hkv, D); written
  TensorView value_cache;                 // same shape and dtype as key_cache; written
  IndexView cumulative_sequence_length;   // (B + 1) int32 offsets of each sequence's new tokens
  IndexView past_seqlens;                 // (B) int32 tokens already cached per sequence
  IndexView block_table;                  // (B, max_blocks_per_sequence) int32 block ids
  std::optional<TensorView> cos_cache;    // (max_position, rotary_dim / 2); with do_rotary
  std::optional<TensorView> sin_cache;    // same
  std::optional<IndexView> slot_mapping;  // (T) int32/int64 cache slot of each new token, -1 =
                                          // skip; absent: the slot of position past_seqlens[b] + j
  std::optional<TensorView> head_sink;    // (Hq) learned sink logit per head
  TensorView output;                      // (T, Hq*D), query's dtype

  // Attributes.
  std::int32_t num_heads = 0;
  std::int32_t kv_num_heads = 0;
  float scale = 0.0f;                   // 0: 1/sqrt(head_size)
  float softcap = 0.0f;                 // 0: off
  std::int32_t local_window_size = -1;  // -1: off; L >= 1: the last L keys (own included)
  bool do_rotary = false;
  bool rotary_interleaved = false;  // false: half split (neox); true: pairs (2t, 2t+1)
};

void paged_attention(const PagedAttentionParams& params);

}  // namespace pagedattn::ops::ort
