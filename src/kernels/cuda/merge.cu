// Merging softmax states on the device: the split-KV partials of the
// attention kernels (launch_merge) and the public cuda_merge_states.
//
// A state is (o, lse): o the normalised output over some keys, lse the
// natural log of their softmax denominator, -inf for an empty state. States
// merge by LSE-weighted averaging; a learned sink is a state of value 0 and
// LSE sinks[head] (docs/semantics.md).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_args.h"
#include "kernels/cuda/dtype.cuh"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda::detail {
namespace {

constexpr int kMaxMergeThreads = 256;
constexpr int kStatesThreads = 256;  // cuda_merge_states: one warp per row
constexpr int kStatesMaxBlocks = 1 << 16;
constexpr float kInf = __builtin_huge_valf();

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "merge attention", what);
}

// One CTA per (merge task, row): blockIdx.x = task * max_rows + row; CTAs
// whose row the task does not have return. Threads stride over the dims.
__global__ void merge_partials_kernel(const __grid_constant__ AttentionArgs args) {
  const int task_index = static_cast<int>(blockIdx.x) / args.max_rows;
  const int row = static_cast<int>(blockIdx.x) % args.max_rows;
  if (task_index >= args.num_merges) return;
  const CudaMergeTask task = args.merges[task_index];
  const int heads = task.qo_head_end - task.qo_head_begin;
  const int tokens = task.q_end - task.q_begin;
  if (heads <= 0 || row >= heads * tokens) return;
  const std::int64_t token = std::int64_t{args.qo_indptr[task.batch]} + task.q_begin + row / heads;
  const std::int64_t head = task.qo_head_begin + row % heads;
  const int v_head_dim = args.kv.v_head_dim;
  const auto slot_row = [&](int i) {
    return std::int64_t{task.first_partial + i} * args.max_rows + row;
  };

  // The largest LSE, NaN if any is NaN (fmaxf alone would drop it).
  float max_lse = -kInf;
  bool nan = false;
  for (int i = 0; i < task.num_partials; ++i) {
    const float s = args.partial_lse[slot_row(i)];
    nan = nan || isnan(s);
    max_lse = fmaxf(max_lse, s);
  }
  // As the decode kernel: a row without keys outputs zeros, and LSE -inf or its sink.
  const float* sink = args.sinks ? args.sinks + head : nullptr;
  const bool has_keys = nan || max_lse != -kInf;
  if (nan)
    max_lse = __int_as_float(0x7fc00000);
  else if (sink)
    max_lse = fmaxf(max_lse, *sink);

  // Denominator: exp(lse_i - max) over the non-empty states, and the sink's.
  float denominator = sink ? expf(*sink - max_lse) : 0.0f;
  for (int i = 0; i < task.num_partials; ++i) {
    const float s = args.partial_lse[slot_row(i)];
    if (s != -kInf) denominator += expf(s - max_lse);
  }
  const HeadTensor& o = args.o;
  const std::int64_t o_base = token * o.token_stride + head * o.head_stride;
  for (int d = static_cast<int>(threadIdx.x); d < v_head_dim; d += static_cast<int>(blockDim.x)) {
    float sum = 0.0f;
    for (int i = 0; i < task.num_partials; ++i) {
      const float s = args.partial_lse[slot_row(i)];
      if (s == -kInf) continue;  // an empty state adds nothing, not even 0 x its value
      sum = fmaf(expf(s - max_lse), args.partial_out[slot_row(i) * v_head_dim + d], sum);
    }
    store_activation(o.data, o.dtype, o_base + d, has_keys ? sum / denominator : 0.0f);
  }
  if (threadIdx.x == 0 && args.lse) {
    const float no_keys_lse = sink ? *sink : -kInf;
    args.lse[token * args.num_qo_heads + head] =
        has_keys ? max_lse + logf(denominator) : no_keys_lse;
  }
}

// Row r of cuda_merge_states, by one warp, exactly as the CPU merge_into:
// an empty b leaves a, an empty a takes b, else LSE-weighted averaging.
// Each lane reads and writes its own elements, and the LSEs are read before
// lane 0 writes, so v_out / s_out may alias a (or b).
__global__ void merge_states_kernel(const float* v_a, const float* s_a, const float* v_b,
                                    const float* s_b, float* v_out, float* s_out,
                                    std::int64_t num_rows, std::int32_t dim) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t r = blockIdx.x * warps_per_block + threadIdx.x / 32; r < num_rows;
       r += gridDim.x * warps_per_block) {
    const float lse_a = s_a[r], lse_b = s_b[r];
    __syncwarp();
    const float* a = v_a + r * dim;
    const float* b = v_b + r * dim;
    float* out = v_out + r * dim;
    float lse;
    if (lse_b == -kInf) {
      for (int d = lane; d < dim; d += 32) out[d] = a[d];
      lse = lse_a;
    } else if (lse_a == -kInf) {
      for (int d = lane; d < dim; d += 32) out[d] = b[d];
      lse = lse_b;
    } else {
      const float m = lse_a > lse_b ? lse_a : lse_b;
      const float w_a = expf(lse_a - m), w_b = expf(lse_b - m);
      const float inv = 1.0f / (w_a + w_b);
      for (int d = lane; d < dim; d += 32) out[d] = (a[d] * w_a + b[d] * w_b) * inv;
      lse = m + logf(w_a + w_b);
    }
    if (lane == 0) s_out[r] = lse;
    __syncwarp();
  }
}

}  // namespace

// Threads: the v_head_dim rounded up to warps, at most kMaxMergeThreads
// (threads then stride over the dims); no shared memory. Grid, set by the
// planner: num_merges x max_rows CTAs, CTA task * max_rows + row serving row
// `row` of merge task `task` (CTAs past a task's rows return at once).
LaunchConfig merge_launch(std::int32_t v_head_dim) {
  LaunchConfig config;
  const std::int32_t warps = v_head_dim < 1 ? 1 : (v_head_dim + 31) / 32;
  config.threads =
      static_cast<std::uint32_t>(warps * 32 < kMaxMergeThreads ? warps * 32 : kMaxMergeThreads);
  config.shared_bytes = 0;
  return config;
}

void launch_merge(const AttentionArgs& args, const LaunchConfig& launch, Stream stream) {
  if (launch.grid == 0 || args.num_merges == 0) return;
  require<InternalError>(args.max_rows >= 1 && args.merges != nullptr &&
                             args.partial_out != nullptr && args.partial_lse != nullptr,
                         "launch_merge: ", args.num_merges, " merges need max_rows >= 1 (",
                         args.max_rows, ") and the workspace's merges and partial slots");
  require<InternalError>(launch.threads >= 32 && launch.threads % 32 == 0 && launch.threads <= 1024,
                         "launch_merge: ", launch.threads, " threads per CTA");
  merge_partials_kernel<<<launch.grid, launch.threads, launch.shared_bytes,
                          static_cast<cudaStream_t>(stream)>>>(args);
  check_cuda(cudaGetLastError(), "merge_partials_kernel launch");
}

}  // namespace pagedattn::cuda::detail

namespace pagedattn::cuda {

// Validates before any CUDA call, so bad arguments throw the same with or
// without a GPU. Pointers may be null only when there are no rows.
void cuda_merge_states(const float* v_a, const float* s_a, const float* v_b, const float* s_b,
                       float* v_out, float* s_out, std::int64_t num_rows, std::int32_t dim,
                       Stream stream) {
  require(dim >= 1, "cuda_merge_states: dim = ", dim, " must be >= 1");
  require(num_rows >= 0, "cuda_merge_states: num_rows = ", num_rows, " must be >= 0");
  if (num_rows == 0) return;
  const std::pair<const void*, const char*> pointers[] = {
      {v_a, "v_a"}, {s_a, "s_a"}, {v_b, "v_b"}, {s_b, "s_b"}, {v_out, "v_out"}, {s_out, "s_out"}};
  for (const auto& [pointer, name] : pointers)
    require(pointer != nullptr, "cuda_merge_states: ", name, " must be non-null (", num_rows,
            " rows)");
  const std::int64_t warps_per_block = detail::kStatesThreads / 32;
  const std::int64_t blocks = (num_rows + warps_per_block - 1) / warps_per_block;
  const auto grid =
      static_cast<unsigned>(blocks < detail::kStatesMaxBlocks ? blocks : detail::kStatesMaxBlocks);
  detail::
      merge_states_kernel<<<grid, detail::kStatesThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          v_a, s_a, v_b, s_b, v_out, s_out, num_rows, dim);
  detail::check_cuda(cudaGetLastError(), "cuda_merge_states", "merge_states_kernel launch");
}

}  // namespace pagedattn::cuda
