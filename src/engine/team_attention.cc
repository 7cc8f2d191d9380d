#include "team_attention.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/own_thread.h"
#include "kernels/append_tokens.h"
#include "kernels/attention_traits.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/validate.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {

bool TeamAttention::supports(const PagedKVCache& cache) {
  const KVCacheConfig& c = cache.config();
  return c.device == KVDevice::kCpu && c.rope_mode == RopeMode::kNone && c.head_dim % 8 == 0 &&
         c.v_head_dim % 8 == 0 && !force_reference_kernels();
}

TeamAttention::Tensors TeamAttention::fused_qkv(const KVCacheConfig& c, float* qkv, float* out) {
  const std::int32_t d = c.head_dim, hq = c.num_qo_heads, hkv = c.num_kv_heads;
  const std::int64_t stride = std::int64_t{hq + 2 * hkv} * d;
  return {{qkv, DType::kF32, stride, d},
          {qkv == nullptr ? nullptr : qkv + std::int64_t{hq} * d, DType::kF32, stride, d},
          {qkv == nullptr ? nullptr : qkv + std::int64_t{hq + hkv} * d, DType::kF32, stride, d},
          {out, DType::kF32, std::int64_t{hq} * c.v_head_dim, c.v_head_dim}};
}

void TeamAttention::prepare(PagedKVCache& cache, std::span<const AttentionOptions> options,
                            const Tensors& t, std::int32_t team_threads) {
  constexpr const char* kCall = "TeamAttention::prepare";
  const KVCacheConfig& c = cache.config();
  require(supports(cache), kCall, ": the cache's attention cannot run in a team (supports())");
  require(std::int64_t(options.size()) == c.num_layers, kCall, ": options has ", options.size(),
          " layers, the cache ", c.num_layers);
  require(team_threads >= 1, kCall, ": team_threads = ", team_threads, " must be >= 1");
  const bool latent = c.attention_kind == AttentionKind::kMLA;
  require(!latent || t.v.data == nullptr, kCall,
          ": tensors.v.data must be null for attention_kind = MLA (V is the latent, the first "
          "v_head_dim elements of each k row)");
  const BatchPlan& step = cache.plan();  // InvalidState outside a step
  const AttentionShape shape{c.num_qo_heads, c.num_kv_heads, c.head_dim, c.v_head_dim};
  AttentionPlanOptions plan_options = c.attention_plan;
  plan_options.num_threads = team_threads;

  std::vector<AttentionPlan> plans;
  std::vector<std::pair<bool, std::int32_t>> planned;  // each plan's (causal, window_left)
  std::vector<Layer> layers(options.size());
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    const AttentionOptions& o = options[std::size_t(layer)];
    require(o.key_rope == nullptr, kCall, ": options[", layer, "].key_rope must be null");
    Layer& l = layers[std::size_t(layer)];
    const PagedKVStorage kv = cache.layer_storage(layer);
    AttentionParams& p = l.params;
    p.q = t.q;
    p.o = t.out;
    p.num_qo_heads = c.num_qo_heads;
    p.table = step.table();
    p.kv = kv;
    p.options = o;
    p.tree_mask = step.tree_mask();
    kernels::validate_attention_params(p, kCall);
    l.append = {t.k, t.v, step.slot_mapping.data(), step.num_tokens(), kv};
    kernels::validate_append(l.append);
    // The step's layers differ only by window (and scale, softcap: not the plan's).
    const std::pair<bool, std::int32_t> key{o.causal, o.window_left};
    const auto same = std::find(planned.begin(), planned.end(), key);
    l.plan = static_cast<std::int32_t>(same - planned.begin());
    if (same == planned.end()) {
      plans.push_back(plan_attention(p.table, shape, o, plan_options));
      planned.push_back(key);
    }
  }
  // The kernels choose their product paths when they first meet a shape,
  // timing them in parallel regions of their own: not possible inside the
  // team, so now, once per shape and options.
  const TimedPaths timed{kernels::product_shape(c), plan_options};
  if (timed_ != timed) {
    core::run_on_own_thread([&] { kernels::prepare_product_choice(timed.shape, timed.options); });
    timed_ = timed;
  }
  std::size_t bytes = 0;
  for (const AttentionPlan& plan : plans) bytes = std::max(bytes, plan.workspace_bytes);
  aligned_ = kernels::aligned_workspace(workspace_, bytes).data();
  layers_ = std::move(layers);
  plans_ = std::move(plans);
  step_ = step.step_id;
}

void TeamAttention::append(std::int32_t layer, std::int32_t begin, std::int32_t end) const {
  kernels::append_tokens(layers_[std::size_t(layer)].append, begin, end);
}

void TeamAttention::attend(std::int32_t layer) {
  const Layer& l = layers_[std::size_t(layer)];
  kernels::run_attention_cpu(l.params, plans_[std::size_t(l.plan)], aligned_);
}

void TeamAttention::finish(PagedKVCache& cache) const {
  for (std::int32_t layer = 0; layer < std::int32_t(layers_.size()); ++layer)
    cache.mark_layer_appended(layer, step_);
}

}  // namespace pagedattn::engine
