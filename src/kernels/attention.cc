// paged_attention: validation, the reference switch, and dispatch.
#include <cstdlib>
#include <cstring>

#include "attention_traits.h"
#include "cpu/attention_cpu.h"
#include "pagedattn/attention.h"
#include "pagedattn/errors.h"
#include "validate.h"

namespace pagedattn {
namespace {

bool env_forces_reference() {
  const char* v = std::getenv("PAGEDATTN_FORCE_REFERENCE");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}

bool g_force_reference = env_forces_reference();

// The plan must describe this batch: same shape, items inside the table.
void validate_plan(const AttentionParams& p, const AttentionPlan& plan, std::size_t workspace_bytes,
                   const void* workspace) {
  const AttentionShape& s = plan.shape;
  require(s.num_qo_heads == p.num_qo_heads && s.num_kv_heads == p.kv.num_kv_heads &&
              s.head_dim == p.kv.head_dim && s.v_head_dim == p.kv.v_head_dim,
          "paged_attention: plan was made for heads (", s.num_qo_heads, ", ", s.num_kv_heads,
          ") dims (", s.head_dim, ", ", s.v_head_dim, "), params have (", p.num_qo_heads, ", ",
          p.kv.num_kv_heads, ") (", p.kv.head_dim, ", ", p.kv.v_head_dim, ")");
  require(plan.num_threads >= 1,
          "paged_attention: plan is malformed (num_threads = ", plan.num_threads, ")");
  const std::int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  for (const AttentionWorkItem& w : plan.items) {
    const bool inside =
        w.batch >= 0 && w.batch < p.table.batch_size && w.kv_head_begin >= 0 &&
        w.kv_head_begin < w.kv_head_end && w.kv_head_end <= p.kv.num_kv_heads && 0 <= w.q_begin &&
        w.q_begin < w.q_end && w.q_end <= p.table.q_len(w.batch) && 0 <= w.kv_begin &&
        w.kv_begin <= w.kv_end && w.kv_end <= p.table.kv_lens[w.batch] &&
        (w.kv_head_end - w.kv_head_begin) * (w.q_end - w.q_begin) * group <= plan.max_rows &&
        w.partial < plan.num_partials;
    require(inside, "paged_attention: plan item for batch ", w.batch,
            " does not fit this table; plan_attention must see the same table");
  }
  require(workspace_bytes >= plan.workspace_bytes, "paged_attention: workspace has ",
          workspace_bytes, " bytes, the plan needs ", plan.workspace_bytes);
  require(reinterpret_cast<std::uintptr_t>(workspace) % kernels::AttentionTraits::kAlign == 0,
          "paged_attention: workspace must be 64-byte aligned");
}

}  // namespace

void set_force_reference_kernels(bool force) {
  g_force_reference = force;
}
bool force_reference_kernels() {
  return g_force_reference;
}

void paged_attention(const AttentionParams& params, const AttentionPlan& plan,
                     std::span<std::byte> workspace) {
  kernels::validate_attention_params(params, "paged_attention");
  // The SIMD kernels read K/V rows 8 elements at a time straight from the
  // caller's cache, so a head dim that is not a multiple of 8 (rare: models
  // use 64-256) would read past the last row: such shapes run the reference.
  const bool vector_rows = params.kv.head_dim % 8 == 0 && params.kv.v_head_dim % 8 == 0;
  if (g_force_reference || !vector_rows) return paged_attention_reference(params);
  validate_plan(params, plan, workspace.size(), workspace.data());
  kernels::run_attention_cpu(params, plan, workspace.data());
}

AttentionRunner::AttentionRunner(AttentionPlanOptions plan_options) : plan_options_(plan_options) {}

void AttentionRunner::run(const AttentionParams& params) {
  kernels::validate_attention_params(params, "AttentionRunner::run");
  const AttentionShape shape{params.num_qo_heads, params.kv.num_kv_heads, params.kv.head_dim,
                             params.kv.v_head_dim};
  plan_ = plan_attention(params.table, shape, params.options, plan_options_);
  paged_attention(params, plan_, kernels::aligned_workspace(storage_, plan_.workspace_bytes));
}

}  // namespace pagedattn
