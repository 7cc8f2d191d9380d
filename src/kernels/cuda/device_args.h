// What the attention kernels receive: one by-value argument struct shared by
// the host side (cuda_attention.cc fills it) and the kernels (.cu). Plain C++
// with no CUDA types, so host code and tests compile it without nvcc.
#pragma once

#include <cstdint>

#include "pagedattn/cuda.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn::cuda::detail {

// Rows a decode CTA serves at most: (query tokens x query heads) of one KV head.
inline constexpr std::int32_t kDecodeMaxRows = 16;
// Rows of a prefill CTA's tile (tensor-core kernel).
inline constexpr std::int32_t kPrefillRows = 64;

struct AttentionArgs {
  // Queries [num_tokens][num_qo_heads][head_dim] and outputs
  // [num_tokens][num_qo_heads][v_head_dim], device memory.
  HeadTensor q;
  HeadTensor o;
  float* lse = nullptr;  // [num_tokens][num_qo_heads] natural-log LSE, or null
  std::int32_t num_qo_heads = 0;
  std::int32_t group = 1;  // num_qo_heads / num_kv_heads

  // The page table, device memory (see PagedKVTable).
  const std::int32_t* qo_indptr = nullptr;     // [batch_size + 1]
  const std::int32_t* kv_indptr = nullptr;     // [batch_size + 1]
  const std::int32_t* kv_indices = nullptr;    // [kv_indptr[batch_size]]
  const std::int32_t* kv_lens = nullptr;       // [batch_size]
  const std::int32_t* kv_sink_lens = nullptr;  // [batch_size] or null (no gap)
  const std::int32_t* kv_gap_lens = nullptr;   // [batch_size] or null (no gap)

  // The layer's pages; pointers (data, scales, NaN flags) are device memory.
  PagedKVStorage kv;

  // Options, resolved on the host.
  float scale = 1.0f;    // logit scale (1 / sqrt(head_dim) when the caller gave none)
  float softcap = 0.0f;  // > 0: s = softcap * tanh(s / softcap)
  std::int32_t window_left = -1;
  bool causal = true;
  const float* alibi_slopes = nullptr;  // [num_qo_heads] or null
  const float* sinks = nullptr;         // [num_qo_heads] or null

  // The plan's arrays in the workspace (device memory).
  const CudaWorkItem* items = nullptr;  // the launch's items (decode or prefill)
  std::int32_t num_items = 0;
  const CudaMergeTask* merges = nullptr;
  std::int32_t num_merges = 0;
  // Partial slot p, row r: partial_out[(p * max_rows + r) * v_head_dim + d],
  // partial_lse[p * max_rows + r].
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  std::int32_t max_rows = 0;
};

// Key j of sequence b sits at physical slot slot_of_key(j) of the sequence's
// pages; both kernels address K/V through these (host and device).
#if defined(__CUDACC__)
#define PAGEDATTN_HOST_DEVICE __host__ __device__
#else
#define PAGEDATTN_HOST_DEVICE
#endif

PAGEDATTN_HOST_DEVICE inline std::int64_t slot_of_key(const AttentionArgs& a, std::int32_t b,
                                                      std::int64_t j) {
  if (a.kv_gap_lens == nullptr || j < a.kv_sink_lens[b]) return j;
  return j + a.kv_gap_lens[b];
}

// The first and one-past-last key visible to a query at absolute position
// q_pos (bottom-right causal: q_pos = kv_len - q_len + i).
PAGEDATTN_HOST_DEVICE inline std::int64_t first_visible_key(const AttentionArgs& a,
                                                            std::int64_t q_pos) {
  return a.window_left >= 0 && q_pos - a.window_left > 0 ? q_pos - a.window_left : 0;
}
PAGEDATTN_HOST_DEVICE inline std::int64_t end_visible_key(const AttentionArgs& a,
                                                          std::int64_t q_pos, std::int64_t kv_len) {
  return a.causal && q_pos + 1 < kv_len ? q_pos + 1 : kv_len;
}

// Launch functions (one per .cu file). Each enqueues on `stream` and throws
// pagedattn::Error when the launch fails. Items are read from args.items.
void launch_decode(const AttentionArgs& args, const LaunchConfig& launch, Stream stream);
void launch_prefill(const AttentionArgs& args, const LaunchConfig& launch, Stream stream);
void launch_merge(const AttentionArgs& args, const LaunchConfig& launch, Stream stream);

// Launch shapes, used by the planner (host) and checked by the launchers.
// Decode: threads per CTA and shared memory for a head_dim / v_head_dim.
LaunchConfig decode_launch(std::int32_t head_dim, std::int32_t v_head_dim, DType kv_dtype);
// Prefill: threads and shared memory of a kPrefillRows-row tile; the key
// tile shrinks for large head dims. shared_bytes above the device's limit
// means the shape is not served (the planner refuses it).
LaunchConfig prefill_launch(std::int32_t head_dim, std::int32_t v_head_dim, DType kv_dtype);
// Merge: threads per (task, row) CTA.
LaunchConfig merge_launch(std::int32_t v_head_dim);

}  // namespace pagedattn::cuda::detail
