// Paged attention over a ragged batch: one entry point serves decode
// (q_len 1), prefill, chunked prefill and mixed batches. Implements exactly
// the canonical definition in docs/semantics.md (from ../shared/SEMANTICS.md).
//
//   plan   = plan_attention(table, shape, num_threads)     host side, pure
//   bytes  = plan.workspace_bytes                           caller allocates
//   paged_attention(params, plan, workspace)                never allocates
//
// AttentionRunner bundles the three for callers that want one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn {

// A [num_tokens][num_heads][dim] tensor with the last axis contiguous.
struct HeadTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  std::int64_t token_stride = 0;  // elements between consecutive tokens
  std::int64_t head_stride = 0;   // elements between consecutive heads
};

struct AttentionOptions {
  std::optional<float> scale;           // logit scale; none means 1 / sqrt(head_dim)
  bool causal = true;                   // bottom-right aligned: query i sees keys j <= kv_len - q_len + i
  std::int32_t window_left = -1;        // -1 = off; W: query at p sees keys [p - W, p]
  float softcap = 0.0f;                 // > 0: s = softcap * tanh(s / softcap)
  const float* alibi_slopes = nullptr;  // [num_qo_heads] or null: s += slope * (j - p)
  const float* sinks = nullptr;         // [num_qo_heads] or null: learned sink logits
};

struct AttentionParams {
  HeadTensor q;                // [num_tokens][num_qo_heads][head_dim]
  HeadTensor o;                // [num_tokens][num_qo_heads][v_head_dim]
  float* lse = nullptr;        // [num_tokens][num_qo_heads] natural-log LSE, or null
  std::int32_t num_qo_heads = 0;
  PagedKVTable table;          // ragged batch: qo_indptr and the CSR page table
  PagedKVStorage kv;           // the layer's pages (num_kv_heads, head dims, dtype)
  AttentionOptions options;
};

// --- the canonical reference (double accumulation; the oracle) ---------------
void paged_attention_reference(const AttentionParams& params);

// --- merging partial softmax states (split-KV, cascade) ------------------------
// v_* [num_rows][dim] normalised outputs, s_* [num_rows] natural-log LSE; an
// empty state has s = -inf. Writes the merged state to v_out, s_out (which may
// alias a). Validates sizes (InvalidArgument).
void merge_states(std::span<const float> v_a, std::span<const float> s_a,
                  std::span<const float> v_b, std::span<const float> s_b,
                  std::span<float> v_out, std::span<float> s_out, std::int32_t dim);

}  // namespace pagedattn
