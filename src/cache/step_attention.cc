#include "step_attention.h"


namespace pagedattn::cache {

void StepAttention::ensure_rope_table(const RopeConfig& base, std::int32_t head_dim,
                                      std::int32_t positions) {
  const std::int32_t r = base.rotary_dim == 0 ? head_dim : base.rotary_dim, half = r / 2;
  std::int32_t have = rope.cache_max_position;
  if (rope_cos.empty()) have = 0;
  if (positions <= have) return;
  const std::int32_t target = std::max(positions, 2 * have);  // amortised growth
  rope = base;
  rope_cos.resize(std::size_t(target) * half);
  rope_sin.resize(std::size_t(target) * half);
  for (std::int32_t p = have; p < target; ++p)
    for (std::int32_t i = 0; i < half; ++i)  // base has no cache: computed in double
      rope_cos_sin(base, r, p, i, rope_cos[std::size_t(p) * half + i],
                   rope_sin[std::size_t(p) * half + i]);
  rope.cos_cache = rope_cos.data();
  rope.sin_cache = rope_sin.data();
  rope.cache_max_position = target;
}

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
