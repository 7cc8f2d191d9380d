// Buffers cache-level attention keeps across layers of one step and across
// steps: the kernel plan (made once per step and options), its workspace,
// RoPE copies of q/k, and the cos/sin table for the cache's RoPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/rope_table.h"
#include "pagedattn/attention.h"
#include "pagedattn/rope.h"

namespace pagedattn::cache {

struct StepAttention {
  // Kernel plan of the current step, valid for (causal, window_left).
  AttentionPlan plan;
  bool plan_valid = false;
  bool plan_causal = true;
  std::int32_t plan_window_left = -1;
  std::vector<std::byte> workspace;  // over-allocated by 64 for alignment

  std::vector<float> q_rotated;  // [num_tokens][num_qo_heads][head_dim]
  std::vector<float> k_rotated;  // [num_tokens][num_kv_heads][head_dim]

  kernels::RopeTable rope;  // the cache's RoPE and its cos/sin rows

  void invalidate_plan() { plan_valid = false; }
  // The plan for this step and options (made on the first call).
  const AttentionPlan& plan_for(const PagedKVTable& table, const AttentionShape& shape,
                                const AttentionOptions& options,
                                const AttentionPlanOptions& plan_options);
  std::span<std::byte> aligned_workspace(std::size_t bytes);
};

}  // namespace pagedattn::cache
