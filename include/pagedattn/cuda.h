// The CUDA backend (libpagedattn_cuda, SM80 and newer): paged attention and
// the K/V block ops on NVIDIA GPUs, over the same views as the CPU kernels
// (PagedKVStorage, PagedKVTable, HeadTensor) with device pointers.
//
//   plan = plan_cuda_attention(host_view, options)   host side, pure, no GPU needed
//   bytes = plan.workspace_bytes                     caller allocates on the device
//   cuda_paged_attention(device_params, plan, workspace, stream)
//
// As FlashInfer's plan/run split: the plan reads the page table's index
// arrays on the host (the caller keeps host copies, as it built them there),
// validates them, and cuts the batch into work items; the run copies the
// plan's items to the workspace on `stream` and launches. This header needs
// no CUDA headers: streams are passed as `Stream` (a cudaStream_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/kv_device.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn::cuda {

using Stream = void*;  // a cudaStream_t; nullptr is the legacy default stream

// --- devices ------------------------------------------------------------------

// Devices the CUDA runtime sees: 0 where there is no driver or no GPU (never throws).
int device_count() noexcept;
// Why device_count() is 0 (the runtime's error string), or "" when a device exists.
std::string no_device_reason();

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  std::size_t max_shared_bytes_per_block =
      0;  // opt-in maximum (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  std::size_t global_bytes = 0;
};
// The current device's properties; throws Unsupported without one.
DeviceInfo current_device_info();

// --- attention: plan (host) ---------------------------------------------------

// One CTA's work: query heads [qo_head_begin, qo_head_end) of one KV head and
// query tokens [q_begin, q_end) (offsets within sequence `batch`), packed into
// rows r = (token - q_begin) * heads + (head - qo_head_begin), against keys
// [kv_begin, kv_end). partial >= 0: the item writes its normalised output and
// LSE to that partial slot, and a merge task combines the slots. Plain
// int32 fields: copied to the device as they are.
struct CudaWorkItem {
  std::int32_t batch = 0;
  std::int32_t qo_head_begin = 0, qo_head_end = 0;
  std::int32_t q_begin = 0, q_end = 0;
  std::int32_t kv_begin = 0, kv_end = 0;
  std::int32_t partial = -1;
};

// Merges partial slots [first_partial, first_partial + num_partials) of one
// (batch, query heads, query tokens) tile into its output rows, then the
// learned sinks, if any.
struct CudaMergeTask {
  std::int32_t batch = 0;
  std::int32_t qo_head_begin = 0, qo_head_end = 0;
  std::int32_t q_begin = 0, q_end = 0;
  std::int32_t first_partial = 0, num_partials = 0;
  std::int32_t unused = 0;
};

// A kernel launch's shape.
struct LaunchConfig {
  std::uint32_t grid = 0;     // CTAs (0: nothing to launch)
  std::uint32_t threads = 0;  // per CTA
  std::uint32_t shared_bytes = 0;
};

struct CudaPlanOptions {
  // SMs to fill with work items (KV splits where a few long sequences would
  // leave SMs idle); 0: the current device's count, which planning without
  // a device cannot read (it then needs a value here).
  std::int32_t num_sms = 0;
  // Shared memory a CTA may use; 0: the current device's opt-in maximum
  // (227 KiB on H100/H200, 163 KiB on A100). Planning without a device
  // needs a value here.
  std::int32_t max_shared_bytes = 0;
  std::int32_t min_kv_chunk = 256;  // smallest KV chunk a split creates
  // > 0: split every tile's keys into chunks of exactly this many, whatever
  // the batch (a row's result then does not depend on the batch).
  std::int32_t fixed_kv_chunk = 0;
};

// Which kernel serves a work item: decode (CUDA cores, at most
// kDecodeMaxRows rows, every K/V byte read once per group of query heads)
// or prefill (tensor cores, tiles of kPrefillRows rows).
enum class CudaKernel : std::uint8_t { kDecode = 0, kPrefill = 1 };

struct CudaAttentionPlan {
  AttentionShape shape;
  DType kv_dtype = DType::kF16;
  DType q_dtype = DType::kF16;
  std::int32_t batch_size = 0;
  std::int32_t num_tokens = 0;
  std::int32_t num_table_pages = 0;         // kv_indptr[batch_size]: kv_indices may be null when 0
  std::int32_t max_rows = 0;                // rows of the largest item (partial slot height)
  std::vector<CudaWorkItem> decode_items;   // longest first
  std::vector<CudaWorkItem> prefill_items;  // longest first
  std::vector<CudaMergeTask> merges;
  std::int32_t num_partials = 0;
  LaunchConfig decode, prefill, merge;
  // Device workspace: [decode items][prefill items][merges][partial outputs
  // f32 [num_partials][max_rows][v_head_dim]][partial LSE f32
  // [num_partials][max_rows]], each part 256-byte aligned.
  std::size_t decode_items_offset = 0, prefill_items_offset = 0, merges_offset = 0;
  std::size_t partial_out_offset = 0, partial_lse_offset = 0;
  std::size_t workspace_bytes = 0;
  // Bytes [0, partial_out_offset) of the workspace as the run copies them
  // to the device: the items and merges at their offsets.
  std::vector<std::byte> host_image;
};

// Plans `host_view`: an AttentionParams whose table arrays (qo_indptr,
// kv_indptr, kv_indices, kv_lens, kv_last_page_len, kv_sink_lens,
// kv_gap_lens) are host memory with the values the device copies will hold;
// its other pointers may be device pointers (they are checked for null,
// never read). Validates as the CPU kernels do, plus what the CUDA kernels
// do not serve (Unsupported, naming it): f32 K/V, inline key RoPE,
// token-tree masks, shared memory beyond max_shared_bytes.
CudaAttentionPlan plan_cuda_attention(const AttentionParams& host_view,
                                      const CudaPlanOptions& options = {});

// --- attention: run (device) ----------------------------------------------------

// `params`: every pointer is device memory (q, o, lse, the table arrays, K/V,
// scales, alibi_slopes, sinks), with the shapes, dtypes and options that
// `plan` was made from (checked: InvalidArgument). `workspace`: device
// memory of plan.workspace_bytes, 256-byte aligned. Enqueues the plan copy
// and the kernels on `stream` and returns; errors of the launch throw
// (pagedattn::Error naming the kernel and the CUDA error).
//
// Products: decode items multiply in f32 on CUDA cores (f16/bf16/fp8/int8
// K/V converted exactly); prefill items multiply on tensor cores in bf16
// when K/V are bf16, else f16 (fp8 and int8 codes convert exactly; queries
// and softmax weights are rounded to that type; sums in f32). The scales of
// fp8 and int8 K/V multiply logits and outputs in f32.
void cuda_paged_attention(const AttentionParams& params, const CudaAttentionPlan& plan,
                          void* workspace, Stream stream = nullptr);

// merge_states on the device: [num_rows][dim] f32 outputs and [num_rows]
// natural-log LSE, as the CPU merge_states; v_out / s_out may alias a.
void cuda_merge_states(const float* v_a, const float* s_a, const float* v_b, const float* s_b,
                       float* v_out, float* s_out, std::int64_t num_rows, std::int32_t dim,
                       Stream stream = nullptr);

// --- block ops (device) -----------------------------------------------------------

// append_paged_kv on the device (vLLM's reshape_and_cache, both layouts):
// params.k/v and params.slot_mapping and the pages are device memory; fp8
// and int8 quantise on write exactly as the CPU append does (bit for bit).
// e4m3 storage with page_may_hold_nan (device memory): flags are set.
void cuda_append_paged_kv(const AppendParams& params, Stream stream = nullptr);

// copy_pages within one device storage or between two (vLLM copy_blocks):
// (src_page, dst_page) pairs in host memory; K, V and int8 token scales.
void cuda_copy_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                     std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                     Stream stream = nullptr);

// Host <-> device page moves (vLLM swap_blocks), asynchronous on `stream`:
// one of src / dst is host memory (pinned for the copy to overlap), the
// other device memory; same checks as copy_pages.
enum class SwapDirection : std::uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };
void cuda_swap_pages(const PagedKVStorage& src, const PagedKVStorage& dst,
                     std::span<const std::pair<std::int64_t, std::int64_t>> src_dst_pages,
                     SwapDirection direction, Stream stream = nullptr);

// apply_rope on the device: x and positions are device memory; the config's
// freq_factors are host memory (pair frequencies are computed on the host in
// double, as the CPU apply_rope does, and passed with the launch); its
// cos / sin caches, when given, are device memory.
void cuda_apply_rope(HeadTensor x, std::int32_t num_tokens, std::int32_t num_heads,
                     std::int32_t head_dim, const std::int32_t* positions, const RopeConfig& config,
                     Stream stream = nullptr);

// --- device storage for PagedKVCache ------------------------------------------------

// The KVDeviceBackend of a KVCacheConfig.device = kCuda cache: pages from
// cudaMalloc (zeroed), the host tier from cudaHostAlloc, and the kernels
// above, everything enqueued on `stream` (which must outlive the backend).
// Calls come from threads whose current device is the stream's. Refuses
// kv_dtype float32 (the attention kernels do not serve it). Constructing it
// needs no GPU.
std::shared_ptr<KVDeviceBackend> kv_device_backend(Stream stream = nullptr);

}  // namespace pagedattn::cuda
