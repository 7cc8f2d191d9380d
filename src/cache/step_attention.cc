#include "step_attention.h"

namespace pagedattn::cache {

const AttentionPlan& StepAttention::plan_for(const PagedKVTable& table, const AttentionShape& shape,
                                             const AttentionOptions& options,
                                             const AttentionPlanOptions& plan_options) {
  if (!plan_valid || plan_causal != options.causal || plan_window_left != options.window_left) {
    plan = plan_attention(table, shape, options, plan_options);
    plan_valid = true;
    plan_causal = options.causal;
    plan_window_left = options.window_left;
  }
  return plan;
}

std::span<std::byte> StepAttention::aligned_workspace(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  if (workspace.size() < bytes + kAlign) workspace.resize(bytes + kAlign);
  const auto addr = reinterpret_cast<std::uintptr_t>(workspace.data());
  const std::size_t pad = (kAlign - addr % kAlign) % kAlign;
  return {workspace.data() + pad, bytes};
}

}  // namespace pagedattn::cache
