// cuda_paged_attention: checks the run's params against its plan, copies the
// plan's items to the workspace and launches the decode, prefill and merge
// kernels on one stream.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/device_args.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda {
namespace {

constexpr const char* kCall = "cuda_paged_attention";

// The params must describe the batch and shapes the plan was made for; the
// table's values live on the device and were validated by the plan.
void check_against_plan(const AttentionParams& p, const CudaAttentionPlan& plan,
                        const void* workspace) {
  const PagedKVStorage& kv = p.kv;
  const AttentionShape& s = plan.shape;
  require(p.num_qo_heads == s.num_qo_heads && kv.num_kv_heads == s.num_kv_heads &&
              kv.head_dim == s.head_dim && kv.v_head_dim == s.v_head_dim,
          kCall, ": params have num_qo_heads = ", p.num_qo_heads,
          ", num_kv_heads = ", kv.num_kv_heads, ", head_dim = ", kv.head_dim,
          ", v_head_dim = ", kv.v_head_dim, "; the plan was made for ", s.num_qo_heads, ", ",
          s.num_kv_heads, ", ", s.head_dim, ", ", s.v_head_dim);
  require(kv.dtype == plan.kv_dtype && p.q.dtype == plan.q_dtype, kCall,
          ": kv.dtype = ", dtype_name(kv.dtype), " and q.dtype = ", dtype_name(p.q.dtype),
          " differ from the plan's ", dtype_name(plan.kv_dtype), " and ", dtype_name(plan.q_dtype));
  require(p.table.batch_size == plan.batch_size && p.table.page_size == kv.page_size, kCall,
          ": table.batch_size = ", p.table.batch_size, " (plan: ", plan.batch_size,
          "), table.page_size = ", p.table.page_size, " (kv.page_size: ", kv.page_size, ")");
  require(p.table.qo_indptr && p.table.kv_indptr && p.table.kv_lens &&
              (p.table.kv_indices || plan.num_table_pages == 0),
          kCall, ": table qo_indptr, kv_indptr, kv_indices and kv_lens must be device pointers");
  require((p.table.kv_sink_lens == nullptr) == (p.table.kv_gap_lens == nullptr), kCall,
          ": table.kv_sink_lens and kv_gap_lens must both be given or both be null");
  require(plan.num_tokens == 0 || (p.q.data && p.o.data), kCall,
          ": q.data and o.data must be non-null for ", plan.num_tokens, " tokens");
  require(kv.k_data && kv.v_data, kCall, ": kv.k_data and kv.v_data must be non-null");
  require(kv.dtype != DType::kINT8 || (kv.k_token_scales && kv.v_token_scales), kCall,
          ": int8 KV needs kv.k_token_scales and kv.v_token_scales");
  require(is_activation_dtype(p.o.dtype), kCall, ": o.dtype = ", dtype_name(p.o.dtype),
          " must be float32, float16 or bfloat16");
  require(p.options.key_rope == nullptr && !p.tree_mask.active(), kCall,
          ": options.key_rope and tree masks are not served on CUDA (the plan refuses them)");
  require(plan.workspace_bytes == 0 ||
              (workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 256 == 0),
          kCall, ": workspace must be a 256-byte aligned device buffer of ", plan.workspace_bytes,
          " bytes");
}

detail::AttentionArgs make_args(const AttentionParams& p, const CudaAttentionPlan& plan,
                                void* workspace) {
  detail::AttentionArgs a;
  a.q = p.q;
  a.o = p.o;
  a.lse = p.lse;
  a.num_qo_heads = p.num_qo_heads;
  a.group = p.num_qo_heads / p.kv.num_kv_heads;
  a.qo_indptr = p.table.qo_indptr;
  a.kv_indptr = p.table.kv_indptr;
  a.kv_indices = p.table.kv_indices;
  a.kv_lens = p.table.kv_lens;
  a.kv_sink_lens = p.table.kv_sink_lens;
  a.kv_gap_lens = p.table.kv_gap_lens;
  a.kv = p.kv;
  a.scale =
      p.options.scale ? *p.options.scale : 1.0f / std::sqrt(static_cast<float>(p.kv.head_dim));
  a.softcap = p.options.softcap;
  a.window_left = p.options.window_left;
  a.causal = p.options.causal;
  a.alibi_slopes = p.options.alibi_slopes;
  a.sinks = p.options.sinks;
  auto* base = static_cast<std::byte*>(workspace);
  a.merges = reinterpret_cast<const CudaMergeTask*>(base + plan.merges_offset);
  a.num_merges = static_cast<std::int32_t>(plan.merges.size());
  a.partial_out = reinterpret_cast<float*>(base + plan.partial_out_offset);
  a.partial_lse = reinterpret_cast<float*>(base + plan.partial_lse_offset);
  a.max_rows = plan.max_rows;
  return a;
}

}  // namespace

void cuda_paged_attention(const AttentionParams& params, const CudaAttentionPlan& plan,
                          void* workspace, Stream stream) {
  check_against_plan(params, plan, workspace);
  if (plan.decode_items.empty() && plan.prefill_items.empty()) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t copied = cudaMemcpyAsync(workspace, plan.host_image.data(),
                                             plan.host_image.size(), cudaMemcpyHostToDevice, s);
  if (copied != cudaSuccess)
    throw Error(ErrorCode::kInternal, std::string(kCall) + ": copying the plan to the device: " +
                                          cudaGetErrorString(copied));
  detail::AttentionArgs args = make_args(params, plan, workspace);
  auto* base = static_cast<std::byte*>(workspace);
  if (!plan.decode_items.empty()) {
    args.items = reinterpret_cast<const CudaWorkItem*>(base + plan.decode_items_offset);
    args.num_items = static_cast<std::int32_t>(plan.decode_items.size());
    detail::launch_decode(args, plan.decode, stream);
  }
  if (!plan.prefill_items.empty()) {
    args.items = reinterpret_cast<const CudaWorkItem*>(base + plan.prefill_items_offset);
    args.num_items = static_cast<std::int32_t>(plan.prefill_items.size());
    detail::launch_prefill(args, plan.prefill, stream);
  }
  if (!plan.merges.empty()) detail::launch_merge(args, plan.merge, stream);
}

}  // namespace pagedattn::cuda
