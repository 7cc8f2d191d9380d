// Shared, target-independent parts of the CPU attention kernel: the per-call
// context, output writing (with sinks) and the merge of split-KV partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention_traits.h"
#include "kernels/cpu/product_paths.h"
#include "pagedattn/attention.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::kernels {

// Which product paths a call takes (choose_products): each where the plan
// allows it, the CPU and dispatch have it, and (measured_products) it
// measured faster than f32 products.
struct ProductChoice {
  bool bf16_dot = false;     // outer products (prefill tiles) on bf16 dot products
  bool amx_bf16 = false;     // bf16_dot, on AMX tiles (head dims multiples of 32)
  bool bf16_decode = false;  // decode rows on vdpbf16ps (bf16_decode_kernel)
  bool int8_dot = false;     // int8 decode rows on vpdpbusd (head dims multiples of 64)
  bool f16_decode = false;   // decode rows on AVX512-FP16 multiply-adds (f16_decode_kernel)
};

struct KernelContext : ProductChoice {
  std::int32_t group = 1;  // query heads per KV head
  std::int32_t head_dim = 0, v_head_dim = 0;
  std::int32_t dq = 0, dv = 0;   // padded dims (scratch row strides)
  float scale = 1.0f;            // folded into the queries
  bool batch_invariant = false;  // AttentionPlan::batch_invariant: no prefill-only paths
  ScratchLayout layout;
  std::size_t partial_slot_bytes = 0;
  std::size_t partial_lse_offset = 0;  // within a slot
};

KernelContext make_kernel_context(const AttentionParams& p, const AttentionPlan& plan);

// The product paths a plan's calls over KV of shape `s` take: what the
// plan allows, what the CPU, the dispatched target and the kernels for the
// dtype and head dims have, and, with plan.measured_products, what
// product_path_pays measured.
ProductChoice choose_products(const ProductShape& s, const AttentionPlan& plan);

// Makes the choice for attention over KV of shape `s` planned with
// `options` now (the timing of product_path_pays, 5-40 ms a path on its
// first call), so that a cache's first step does not pay it.
void prepare_product_choice(const ProductShape& s, const AttentionPlanOptions& options);

// The shape the product paths are timed for over a cache of `config`.
ProductShape product_shape(const KVCacheConfig& config);

// The paths calls over KV of shape `s` planned with `options` take (timing
// them first where the plan measures and no call has): what a benchmark
// names as the call's instruction class. None under
// PAGEDATTN_FORCE_REFERENCE (every call on the scalar reference).
ProductChoice product_choice(const ProductShape& s, const AttentionPlanOptions& options);

// Whether the CPU and KV dtype have the bf16 decode kernel
// (bf16_decode-inl.h): KV that converts to bf16 exactly (bf16, fp8) or is
// rounded to it (f16), on AVX512-BF16; its fp8 values are converted through
// VBMI byte tables, so it also needs AVX512-VBMI, which every AVX512-BF16
// CPU but Cooper Lake has. Whether it pays is measured (product_paths.h):
// it doubles the FMA rate of Zen 4, where b8 x 16k bf16 decode took 22
// against 30 ms, and issues at half an FMA's rate on the cores that have
// AMX (32 against 27 ms on Sapphire Rapids).
constexpr bool bf16_decode_type(DType kv) {
  return kv == DType::kBF16 || kv == DType::kF16 || is_fp8(kv);
}
constexpr bool bf16_decode_kernel(const CpuFeatures& used, DType kv) {
  return used.avx512_bf16 && used.avx512_vbmi && bf16_decode_type(kv);
}

// Head dims the f16 decode path (f16_decode-inl.h) takes: whole 32-lane
// chunks, and at most kF16DecodeMaxDim / 32 products per f16 lane in QK.
inline constexpr std::int32_t kF16DecodeMaxDim = 256;
constexpr bool f16_decode_dims(std::int32_t head_dim, std::int32_t v_head_dim) {
  return head_dim > 0 && head_dim % 32 == 0 && head_dim <= kF16DecodeMaxDim && v_head_dim > 0 &&
         v_head_dim % 32 == 0;
}
// KV dtypes and head dims the f16 decode kernel takes (e4m3 and f16).
constexpr bool f16_decode_type(DType kv) {
  return kv == DType::kFP8E4M3 || kv == DType::kF16;
}
constexpr bool f16_decode_kernel(DType kv, std::int32_t head_dim, std::int32_t v_head_dim) {
  return f16_decode_type(kv) && f16_decode_dims(head_dim, v_head_dim);
}

// Head dims the AMX tile path takes: whole 32-dim tiles of bf16 queries (V
// dims of any size: padded to 16 in the packed values and the outputs).
inline constexpr std::int32_t kAmxHeadDimMultiple = 32;
constexpr bool amx_head_dims(std::int32_t head_dim) {
  return head_dim > 0 && head_dim % kAmxHeadDimMultiple == 0;
}

// Rows of a work item or merge task are head-major:
//   row = (kv_head - kv_head_begin) * per_head + token_in_tile * group + g
struct RowMap {
  std::int32_t group = 1;
  std::int32_t per_head = 1;  // tokens in the tile x group
  std::int32_t kv_head_begin = 0;
  std::int64_t first_token = 0;  // global index of the tile's first query token

  std::int32_t token_in_tile(std::int32_t row) const { return (row % per_head) / group; }
  std::int64_t token(std::int32_t row) const { return first_token + token_in_tile(row); }
  std::int32_t kv_head(std::int32_t row) const { return kv_head_begin + row / per_head; }
  std::int64_t qo_head(std::int32_t row) const {
    return std::int64_t{kv_head(row)} * group + (row % per_head) % group;
  }
};

inline RowMap row_map(const AttentionParams& p, const KernelContext& c, std::int32_t batch,
                      std::int32_t kv_head_begin, std::int32_t q_begin, std::int32_t q_end) {
  return {c.group, (q_end - q_begin) * c.group, kv_head_begin,
          std::int64_t{p.table.qo_indptr[batch]} + q_begin};
}

// Writes one finished row: merges the learned sink (a state with no value and
// logit sink_h), stores o in the output dtype and the LSE if requested.
// `o` holds v_head_dim normalised floats and may be modified.
void write_output_row(const AttentionParams& p, std::int64_t token, std::int64_t head, float* o,
                      float lse);

// Merges a task's partial slots in order and writes its output rows
// [row_begin, min(row_end, its rows)): a row's result does not depend on the
// range it is merged in.
void merge_partials(const AttentionParams& p, const KernelContext& c, const AttentionMergeTask& m,
                    std::byte* partials, std::int32_t row_begin, std::int32_t row_end);

// Rows a merge covers at most per call of merge_partials inside a run: the
// merges go out in blocks of this many rows, so that a tile of many heads
// (latent attention's 16-128 per row) merges on every thread, not one.
inline constexpr std::int32_t kMergeRowBlock = 16;

// The merge blocks of a plan: block i is merge i / blocks_per_merge, rows
// from (i % blocks_per_merge) * kMergeRowBlock (empty where a merge has
// fewer rows than plan.max_rows).
inline std::size_t merge_blocks_per_merge(const AttentionPlan& plan) {
  return std::size_t((plan.max_rows + kMergeRowBlock - 1) / kMergeRowBlock);
}
inline void merge_block(const AttentionParams& p, const KernelContext& c, const AttentionPlan& plan,
                        std::byte* partials, std::size_t block) {
  const std::size_t per_merge = merge_blocks_per_merge(plan);
  const auto row_begin = static_cast<std::int32_t>(block % per_merge) * kMergeRowBlock;
  merge_partials(p, c, plan.merges[block / per_merge], partials, row_begin,
                 row_begin + kMergeRowBlock);
}

// Highway-dispatched entry (attention_cpu.cc): the plan's items and merges
// over a region of plan.num_threads threads. Inside a team (core/team.h)
// every thread of the team calls it, and it runs as one of the team's
// pieces, on the team's threads with a barrier after: no region of its own.
void run_attention_cpu(const AttentionParams& params, const AttentionPlan& plan,
                       std::byte* workspace);

}  // namespace pagedattn::kernels
