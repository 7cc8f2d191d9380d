#include <cstring>

#include "attention_cpu.h"
#include "convert.h"
#include "kernels/cpu/product_paths.h"
#include "kernels/softmax_state.h"
#include "kernels/validate.h"
#include "pagedattn/cpu_features.h"

namespace pagedattn::kernels {

ProductChoice choose_products(const ProductShape& s, const AttentionPlan& plan) {
  const CpuFeatures used = dispatched_features();
  const DType kv = s.kv_dtype;
  const bool fp8_fast = plan.fp8_fast_products && is_fp8(kv);
  auto pays = [&](ProductPath path) {
    return !plan.measured_products || product_path_pays(s, path);
  };
  const bool bf16_kv = used.avx512_bf16 && kv != DType::kF32;
  // Prefill and decode are allowed apart: fast_prefill_products lets the
  // compute-bound prefill round to bf16 for every such KV dtype, decode
  // (bound by reading K/V) only where a flag asks or fp8 KV hides it.
  const bool bf16_prefill_allowed =
      bf16_kv && (plan.bf16_products || fp8_fast || plan.fast_prefill_products);
  const bool bf16_decode_allowed = bf16_kv && (plan.bf16_products || fp8_fast);
  ProductChoice c;
  c.bf16_dot = bf16_prefill_allowed && pays(ProductPath::kBf16Prefill);
  c.amx_bf16 = c.bf16_dot && used.amx_bf16 && amx_head_dims(s.head_dim);
  c.bf16_decode =
      bf16_decode_allowed && bf16_decode_kernel(used, kv) && pays(ProductPath::kBf16Decode);
  c.int8_dot = plan.int8_products && used.avx512_vnni && kv == DType::kINT8 &&
               s.head_dim % 64 == 0 && s.v_head_dim % 64 == 0 && pays(ProductPath::kInt8Decode);
  c.f16_decode = (plan.f16_products || (fp8_fast && kv == DType::kFP8E4M3)) && used.avx512_fp16 &&
                 f16_decode_kernel(kv, s.head_dim, s.v_head_dim) && pays(ProductPath::kF16Decode);
  return c;
}

ProductShape product_shape(const KVCacheConfig& c) {
  return {c.kv_dtype,
          c.layout,
          c.head_dim,
          c.v_head_dim,
          c.num_qo_heads / c.num_kv_heads,
          c.attention_kind == AttentionKind::kMLA};
}

void prepare_product_choice(const ProductShape& s, const AttentionPlanOptions& options) {
  product_choice(s, options);
}

ProductChoice product_choice(const ProductShape& s, const AttentionPlanOptions& options) {
  // Every call runs the scalar reference then: no path to choose, and
  // timing the reference would take seconds.
  if (force_reference_kernels()) return {};
  const std::int32_t zero = 0;  // an empty batch: the plan's product flags are what matter
  PagedKVTable empty;
  empty.page_size = 1;
  empty.qo_indptr = &zero;
  empty.kv_lens = &zero;
  const AttentionShape shape{s.group, 1, s.head_dim, s.v_head_dim};
  return choose_products(s, plan_attention(empty, shape, {}, options));
}

KernelContext make_kernel_context(const AttentionParams& p, const AttentionPlan& plan) {
  KernelContext c;
  c.group = p.num_qo_heads / p.kv.num_kv_heads;
  c.head_dim = p.kv.head_dim;
  c.v_head_dim = p.kv.v_head_dim;
  c.dq = padded_dim(c.head_dim);
  c.dv = padded_dim(c.v_head_dim);
  c.scale = resolved_scale(p);
  c.batch_invariant = plan.batch_invariant;
  static_cast<ProductChoice&>(c) = choose_products(
      {p.kv.dtype, p.kv.layout, c.head_dim, c.v_head_dim, c.group, p.kv.v_in_k}, plan);
  c.layout = scratch_layout(plan.max_rows, c.head_dim, c.v_head_dim);
  c.partial_slot_bytes = partial_slot_bytes(plan.max_rows, c.v_head_dim);
  c.partial_lse_offset = align_up(static_cast<std::size_t>(plan.max_rows) *
                                  static_cast<std::size_t>(c.dv) * sizeof(float));
  return c;
}

void write_output_row(const AttentionParams& p, std::int64_t token, std::int64_t head, float* o,
                      float lse) {
  const std::int32_t dv = p.kv.v_head_dim;
  // The sink is a state with a zero value and LSE = the sink logit.
  if (p.options.sinks) merge_into(o, lse, nullptr, p.options.sinks[head], dv);
  const std::int64_t off = token * p.o.token_stride + head * p.o.head_stride;
  convert_row(o, DType::kF32,
              static_cast<std::byte*>(p.o.data) + off * std::int64_t(dtype_size(p.o.dtype)),
              p.o.dtype, dv, 1.0f);
  if (p.lse) p.lse[token * p.num_qo_heads + head] = lse;
}

void merge_partials(const AttentionParams& p, const KernelContext& c, const AttentionMergeTask& m,
                    std::byte* partials, std::int32_t row_begin, std::int32_t row_end) {
  const RowMap map = row_map(p, c, m.batch, m.kv_head_begin, m.q_begin, m.q_end);
  const std::int32_t rows = map.per_head * (m.kv_head_end - m.kv_head_begin);
  auto slot_o = [&](std::int32_t s, std::int32_t row) {
    return reinterpret_cast<float*>(partials +
                                    std::size_t(m.first_partial + s) * c.partial_slot_bytes) +
           std::size_t(row) * c.dv;
  };
  auto slot_lse = [&](std::int32_t s) {
    return reinterpret_cast<float*>(
        partials + std::size_t(m.first_partial + s) * c.partial_slot_bytes + c.partial_lse_offset);
  };
  for (std::int32_t row = row_begin; row < std::min(rows, row_end); ++row) {
    float* o = slot_o(0, row);
    float lse = slot_lse(0)[row];
    for (std::int32_t s = 1; s < m.num_partials; ++s)
      merge_into(o, lse, slot_o(s, row), slot_lse(s)[row], c.v_head_dim);
    write_output_row(p, map.token(row), map.qo_head(row), o, lse);
  }
}

}  // namespace pagedattn::kernels
