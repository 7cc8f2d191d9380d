// PagedKVCache::attention: RoPE per the cache's mode, append, attend - one
// layer of the TVM protocol begin_forward / attention per layer / end_forward.
#include "kernels/attention_traits.h"
#include "kernels/rotated_copy.h"
#include "kernels/validate.h"
#include "kv_cache_state.h"
#include "ops/op_checks.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn {
namespace {

// Any token and head strides (head-major views, slices of a fused QKV row)
// as long as no two elements share an address.
void check_layout(const char* call, const char* name, const HeadTensor& x, std::int64_t tokens,
                  std::int64_t heads, std::int64_t dim) {
  ops::TensorView view;
  view.data = x.data;
  view.dtype = x.dtype;
  view.rank = 3;
  view.shape = {tokens, heads, dim, 0};
  view.strides = {x.token_stride, x.head_stride, 1, 0};
  ops::checks::check_rows_contiguous(call, name, view);
}

void validate_tensor(const HeadTensor& x, const char* name, std::int32_t tokens, std::int32_t heads,
                     std::int32_t dim) {
  require(is_activation_dtype(x.dtype), "PagedKVCache::attention: ", name,
          ".dtype = ", dtype_name(x.dtype), " must be float32, float16 or bfloat16");
  require(tokens == 0 || x.data != nullptr, "PagedKVCache::attention: ", name, ".data is null for ",
          tokens, " tokens");
  check_layout("PagedKVCache::attention", name, x, tokens, heads, dim);
}

}  // namespace

void PagedKVCache::attention(std::int32_t layer, const HeadTensor& q, const HeadTensor& k,
                             const HeadTensor& v, const HeadTensor& out,
                             const AttentionOptions& options, float* lse, std::int64_t num_tokens,
                             StepId step) {
  const auto lock = state_->lock();
  state_->attend(layer, q, k, v, out, options, lse, num_tokens, step);
}

void PagedKVCache::State::attend(std::int32_t layer, const HeadTensor& q, const HeadTensor& k,
                                 const HeadTensor& v, const HeadTensor& out,
                                 const AttentionOptions& options, float* lse,
                                 std::int64_t num_tokens, StepId step_id) {
  State& st = *this;
  const KVCacheConfig& c = st.config;
  st.require_step(step_id, "attention");
  require<InvalidState>(num_tokens < 0 || num_tokens == st.plan.num_tokens(),
                        "PagedKVCache::attention: the tensors hold num_tokens = ", num_tokens,
                        " rows but the current step has ", st.plan.num_tokens(),
                        " tokens (another thread ended or restarted the step?)");
  require(layer >= 0 && layer < c.num_layers, "PagedKVCache::attention: layer = ", layer,
          " is outside [0, ", c.num_layers, ")");
  require(options.key_rope == nullptr,
          "PagedKVCache::attention: options.key_rope must be null; "
          "the cache applies RoPE per KVCacheConfig.rope_mode");
  const BatchPlan& plan = st.plan;
  const std::int32_t tokens = plan.num_tokens();
  validate_tensor(q, "q", tokens, c.num_qo_heads, c.head_dim);
  validate_tensor(k, "k", tokens, c.num_kv_heads, c.head_dim);
  if (c.attention_kind == AttentionKind::kMLA)
    require(v.data == nullptr,
            "PagedKVCache::attention: v.data must be null for attention_kind = MLA (V is the "
            "latent, the first v_head_dim elements of each k row)");
  else
    validate_tensor(v, "v", tokens, c.num_kv_heads, c.v_head_dim);
  validate_tensor(out, "out", tokens, c.num_qo_heads, c.v_head_dim);
  AttentionParams p;
  p.q = q;
  p.o = out;
  p.lse = lse;
  p.num_qo_heads = c.num_qo_heads;
  p.table = plan.table();
  p.kv = st.storage.layer(layer);
  p.options = options;
  p.tree_mask = plan.tree_mask();
  kernels::validate_attention_params(p, "PagedKVCache::attention");
  if (st.attention.device) {
    st.attend_on_device(p, k, v);
    st.step.layer_appended[static_cast<std::size_t>(layer)] = 1;
    return;
  }

  // Validated: from here on nothing can fail on the caller's input.
  cache::StepAttention& sa = st.attention;
  HeadTensor k_stored = k;
  if (c.rope_mode != RopeMode::kNone) {
    std::int32_t longest = 1;
    for (std::int32_t len : plan.kv_lens) longest = std::max(longest, len);
    const RopeConfig& rope = sa.rope.covering(c.rope, c.head_dim, longest);
    p.q = kernels::rotated_copy(q, tokens, c.num_qo_heads, c.head_dim, plan.positions.data(), rope,
                                sa.q_rotated);
    if (c.rope_mode == RopeMode::kNormal)
      k_stored = kernels::rotated_copy(k, tokens, c.num_kv_heads, c.head_dim, plan.positions.data(),
                                       rope, sa.k_rotated);
    else
      p.options.key_rope = &rope;
  }
  append_paged_kv({k_stored, v, plan.slot_mapping.data(), tokens, p.kv});
  const AttentionShape shape{c.num_qo_heads, c.num_kv_heads, c.head_dim, c.v_head_dim};
  const AttentionPlan& kernel_plan = sa.plan_for(p.table, shape, p.options, c.attention_plan);
  paged_attention(p, kernel_plan,
                  kernels::aligned_workspace(sa.workspace, kernel_plan.workspace_bytes));
  st.step.layer_appended[static_cast<std::size_t>(layer)] = 1;
}

// `p` validated, with the plan's host table and the caller's device
// pointers: plans (which may still refuse, changing nothing), rotates
// copies of q and k, appends and attends, all through the backend.
void PagedKVCache::State::attend_on_device(AttentionParams p, const HeadTensor& k,
                                           const HeadTensor& v) {
  const KVCacheConfig& c = config;
  cache::DeviceStep& device = *attention.device;
  const KVAttentionPlan& kernel_plan = device.plan_for(plan.step_id, p, c.attention_plan);
  const cache::DeviceStep::Arrays& arrays = device.upload(plan);
  const std::int32_t tokens = plan.num_tokens();
  HeadTensor k_stored = k;
  if (c.rope_mode == RopeMode::kNormal) {  // kInline: refused by the constructor
    using Copy = cache::DeviceStep::Copy;
    p.q = device.rotated_copy(Copy::kQ, p.q, tokens, c.num_qo_heads, c.head_dim, arrays.positions,
                              c.rope);
    k_stored = device.rotated_copy(Copy::kK, k, tokens, c.num_kv_heads, c.head_dim,
                                   arrays.positions, c.rope);
  }
  device.backend().append({k_stored, v, arrays.slot_mapping, tokens, p.kv});
  p.table = arrays.table;
  p.tree_mask = arrays.tree;
  device.backend().attention(p, kernel_plan, device.workspace(kernel_plan.workspace_bytes()));
}

void PagedKVCache::attention_with_fused_qkv(std::int32_t layer, const HeadTensor& qkv,
                                            const HeadTensor& out, const AttentionOptions& options,
                                            float* lse, std::int64_t num_tokens, StepId step) {
  const KVCacheConfig& c = state_->config;
  require(c.v_head_dim == c.head_dim, "PagedKVCache::attention_with_fused_qkv: needs v_head_dim (",
          c.v_head_dim, ") == head_dim (", c.head_dim, ")");
  const auto es = static_cast<std::int64_t>(dtype_size(qkv.dtype));
  auto at_head = [&](std::int64_t head) {
    HeadTensor t = qkv;
    if (t.data) t.data = static_cast<std::byte*>(qkv.data) + head * qkv.head_stride * es;
    return t;
  };
  const auto lock = state_->lock();
  // The parts are heads of one tensor: it must not overlap itself as a whole.
  check_layout("PagedKVCache::attention_with_fused_qkv", "qkv", qkv,
               num_tokens >= 0 ? num_tokens : state_->plan.num_tokens(),
               std::int64_t{c.num_qo_heads} + 2 * c.num_kv_heads, c.head_dim);
  state_->attend(layer, at_head(0), at_head(c.num_qo_heads),
                 at_head(c.num_qo_heads + c.num_kv_heads), out, options, lse, num_tokens, step);
}

}  // namespace pagedattn
