// The peer operators on device memory (pagedattn/cuda_ops.h): the CPU
// operators' own validation and translation (ops/ort_translate.h,
// ops/vllm_translate.h), run on host copies of the index arrays, then the
// CUDA backend's kernels on the caller's stream.
#include "pagedattn/cuda_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "ops/op_checks.h"
#include "ops/op_support.h"
#include "ops/ort_translate.h"
#include "ops/vllm_translate.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::cuda::ops {
namespace {

using ::pagedattn::ops::IndexView;
using ::pagedattn::ops::RaggedBatch;
using ::pagedattn::ops::TensorView;
using ::pagedattn::ops::checks::Validation;

constexpr std::size_t kAlignment = 256;

std::size_t align_up(std::size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

cudaStream_t as_cuda(Stream stream) {
  return static_cast<cudaStream_t>(stream);
}

using detail::check_cuda;

// The attention kernels take no f32 K/V; refused before any CUDA call.
void refuse_float32_kv(const char* call, const char* name, DType dtype) {
  require<Unsupported>(dtype != DType::kF32, call, ": ", name,
                       " is float32, which the CUDA attention kernels do not serve; store K/V as "
                       "float16, bfloat16 or fp8");
}

// --- host copies of device index arrays ---------------------------------------------

// Index arrays read on the host: each add() enqueues a device-to-host copy
// on the stream, wait() synchronises the stream once for all of them. The
// copies keep their views' shapes, strides and types.
class HostIndexCopies {
 public:
  static constexpr std::int64_t kMaxIndexSpan = std::int64_t{1} << 40;

  HostIndexCopies(const char* call, cudaStream_t stream) : call_(call), stream_(stream) {}
  HostIndexCopies(const HostIndexCopies&) = delete;
  HostIndexCopies& operator=(const HostIndexCopies&) = delete;
  // Left early (an error after a copy was enqueued): the buffers outlive the copies.
  ~HostIndexCopies() {
    if (pending_) cudaStreamSynchronize(stream_);
  }

  // The host view of `device` (readable after wait()).
  IndexView add(const IndexView& device) {
    IndexView host = device;
    std::int64_t elements = 1;
    for (std::int32_t d = 0; d < device.rank; ++d) elements *= device.dim(d);
    if (device.rank == 0 || elements == 0) return host;  // nothing to read
    // Elements sit at offsets [first, last] from data, negative strides
    // included; element [0] is at 0, so first <= 0 <= last.
    std::int64_t first = 0, last = 0;
    bool overflow = false;
    for (std::int32_t d = 0; d < device.rank; ++d) {
      std::int64_t reach = 0;
      overflow = overflow ||
                 __builtin_mul_overflow(device.strides[std::size_t(d)], device.dim(d) - 1, &reach);
      overflow = overflow || (reach < 0 ? __builtin_add_overflow(first, reach, &first)
                                        : __builtin_add_overflow(last, reach, &last));
    }
    require(!overflow && last - first < kMaxIndexSpan, call_,
            ": an index array's strides span more than 2^40 elements");
    const std::int64_t size = device.type == ::pagedattn::ops::IndexType::kInt32 ? 4 : 8;
    const std::int64_t bytes = (last - first + 1) * size;
    buffers_.emplace_back(static_cast<std::size_t>((bytes + 7) / 8));  // aligned for either type
    std::byte* buffer = reinterpret_cast<std::byte*>(buffers_.back().data());
    check_cuda(cudaMemcpyAsync(buffer, static_cast<const std::byte*>(device.data) + first * size,
                               static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
               call_, "cudaMemcpyAsync of an index array to the host");
    pending_ = true;
    host.data = buffer - first * size;
    return host;
  }

  // The one synchronisation: every copy added has landed.
  void wait() {
    if (!pending_) return;
    pending_ = false;
    check_cuda(cudaStreamSynchronize(stream_), call_, "cudaStreamSynchronize");
  }

 private:
  const char* call_;
  cudaStream_t stream_;
  std::vector<std::vector<std::int64_t>> buffers_;  // a buffer's storage stays put as this grows
  bool pending_ = false;                            // copies enqueued since the last wait()
};

// --- device scratch -----------------------------------------------------------------

// Parts of one device block, each 256-byte aligned: arrays uploaded from the
// host in one copy (of every byte up to the last upload's end: add them
// first), and scratch the kernels write.
class DeviceLayout {
 public:
  template <class T>
  std::size_t upload(const std::vector<T>& host) {
    const std::size_t bytes = host.size() * sizeof(T);
    const std::size_t offset = reserve(bytes);
    image_.resize(offset + bytes);
    if (bytes > 0) std::memcpy(image_.data() + offset, host.data(), bytes);
    return offset;
  }
  std::size_t reserve(std::size_t bytes) {
    const std::size_t offset = size_;
    size_ = align_up(size_ + bytes);
    return offset;
  }
  std::size_t bytes() const { return size_; }
  const std::vector<std::byte>& image() const { return image_; }  // bytes [0, image().size())

 private:
  std::size_t size_ = 0;
  std::vector<std::byte> image_;
};

// A layout's block: cudaMallocAsync on the stream, the image uploaded, and
// cudaFreeAsync on the stream when it goes out of scope (stream order: after
// the work enqueued before). The runtime stages the pageable image before
// cudaMemcpyAsync returns, so the layout may go first.
class DeviceBlock {
 public:
  DeviceBlock(const char* call, const DeviceLayout& layout, cudaStream_t stream) : stream_(stream) {
    if (layout.bytes() == 0) return;
    // Padded so the base can be aligned whatever the pool's alignment.
    check_cuda(cudaMallocAsync(&raw_, layout.bytes() + kAlignment, stream), call,
               "cudaMallocAsync of the call's device scratch");
    const auto address = reinterpret_cast<std::uintptr_t>(raw_);
    base_ = static_cast<std::byte*>(raw_) + (align_up(address) - address);
    const std::vector<std::byte>& image = layout.image();
    if (!image.empty())
      check_cuda(cudaMemcpyAsync(base_, image.data(), image.size(), cudaMemcpyHostToDevice, stream),
                 call, "cudaMemcpyAsync of the call's arrays to the device");
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock() {
    if (raw_ != nullptr) cudaFreeAsync(raw_, stream_);
  }

  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  cudaStream_t stream_;
  void* raw_ = nullptr;
  std::byte* base_ = nullptr;
};

// --- conversions and rotation ---------------------------------------------------------

// A dense f32 [tokens][heads][dim] view of `data`.
HeadTensor dense_f32(float* data, std::int32_t heads, std::int32_t dim) {
  return {data, DType::kF32, std::int64_t{heads} * dim, dim};
}

// Slots 0 .. count - 1: copy_as_f32's slot mapping.
std::vector<std::int64_t> identity_slots(std::int64_t count) {
  std::vector<std::int64_t> values(static_cast<std::size_t>(count));
  std::iota(values.begin(), values.end(), std::int64_t{0});
  return values;
}

// x [tokens][heads][dim] (f32, f16 or bf16, device) copied to dense f32 `out`
// on the device, exactly (as the CPU's convert_row): the append kernel into an
// f32 storage whose page t holds token t, slot_mapping = `identity` (0 ..
// tokens - 1, device); a storage whose V lies in K takes K rows only. The
// backend has no conversion kernel of its own.
HeadTensor copy_as_f32(const HeadTensor& x, std::int32_t tokens, std::int32_t heads,
                       std::int32_t dim, float* out, const std::int64_t* identity,
                       cudaStream_t stream) {
  PagedKVStorage dense =
      PagedKVStorage::dense(out, out, DType::kF32, KVLayout::kNHD, 1, heads, dim, dim, tokens);
  dense.v_in_k = true;
  cuda_append_paged_kv({x, HeadTensor{}, identity, tokens, dense}, stream);
  return dense_f32(out, heads, dim);
}

// A dense [rows][row_length] tensor as f32 on the device: the tensor itself
// when it is f32, else its copy in `scratch` (the CPU operator's as_float).
// `identity` holds at least `rows` slots.
const float* device_f32(const TensorView& t, std::int32_t rows, std::int32_t row_length,
                        float* scratch, const std::int64_t* identity, cudaStream_t stream) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  const HeadTensor x{t.data, t.dtype, row_length, row_length};
  return static_cast<const float*>(
      copy_as_f32(x, rows, 1, row_length, scratch, identity, stream).data);
}

// --- attention ------------------------------------------------------------------------

// The plan's limits from the current device (the stream's).
CudaPlanOptions device_plan_options(const char* call) {
  int device = 0, sms = 0, shared = 0;
  check_cuda(cudaGetDevice(&device), call, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), call,
             "cudaDeviceGetAttribute (SM count)");
  check_cuda(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), call,
             "cudaDeviceGetAttribute (shared memory per block)");
  CudaPlanOptions options;
  options.num_sms = sms;
  options.max_shared_bytes = shared;
  return options;
}

// Attention planned on the host (before anything is written, so a shape the
// kernels refuse leaves the caches as they were): `params` holds the device
// views and the batch's host table, which run_attention replaces.
struct PlannedAttention {
  AttentionParams params;
  CudaAttentionPlan plan;
};

// q, o, kv, options: device pointers; `batch`: validated and gathered.
PlannedAttention plan_attention(const char* call, const HeadTensor& q, const HeadTensor& o,
                                std::int32_t num_qo_heads, const PagedKVStorage& kv,
                                const AttentionOptions& options, const RaggedBatch& batch) {
  PlannedAttention a;
  a.params.q = q;
  a.params.o = o;
  a.params.num_qo_heads = num_qo_heads;
  a.params.table = batch.table(kv.page_size);
  a.params.kv = kv;
  a.params.options = options;
  a.plan = plan_cuda_attention(a.params, device_plan_options(call));
  return a;
}

// Uploads the batch's table next to the plan's workspace and launches.
void run_attention(const char* call, const PlannedAttention& a, const RaggedBatch& batch,
                   cudaStream_t stream) {
  if (a.plan.decode_items.empty() && a.plan.prefill_items.empty()) return;
  DeviceLayout layout;  // the table uploaded, then the workspace (256-byte aligned, not uploaded)
  const std::size_t qo = layout.upload(batch.qo_indptr);
  const std::size_t kv_indptr = layout.upload(batch.kv_indptr);
  const std::size_t kv_indices = layout.upload(batch.kv_indices);
  const std::size_t last = layout.upload(batch.kv_last_page_len);
  const std::size_t lens = layout.upload(batch.kv_lens);
  const std::size_t workspace = layout.reserve(a.plan.workspace_bytes);
  const DeviceBlock block(call, layout, stream);
  AttentionParams device = a.params;
  device.table.qo_indptr = block.at<const std::int32_t>(qo);
  device.table.kv_indptr = block.at<const std::int32_t>(kv_indptr);
  device.table.kv_indices = block.at<const std::int32_t>(kv_indices);
  device.table.kv_last_page_len = block.at<const std::int32_t>(last);
  device.table.kv_lens = block.at<const std::int32_t>(lens);
  cuda_paged_attention(device, a.plan, block.at<std::byte>(workspace), stream);
}

}  // namespace

// --- ONNX Runtime ----------------------------------------------------------------------

namespace ort {
namespace {

namespace translate = ::pagedattn::ops::ort::internal;

// What the host reads and derives before the device work: the validated
// shape and batch (pages gathered), each new token's slot (unique) and, with
// do_rotary, its position.
struct HostStep {
  translate::Shape shape;
  RaggedBatch batch;
  std::vector<std::int64_t> slots;
  std::vector<std::int32_t> positions;
};

HostStep read_step(const char* call, const PagedAttentionParams& p, cudaStream_t stream) {
  HostStep step;
  translate::validate(call, p, Validation::kMetadata, step.batch);
  refuse_float32_kv(call, "key_cache", p.key_cache.dtype);
  HostIndexCopies copies(call, stream);
  PagedAttentionParams view = p;
  view.cumulative_sequence_length = copies.add(p.cumulative_sequence_length);
  view.past_seqlens = copies.add(p.past_seqlens);
  view.block_table = copies.add(p.block_table);
  if (p.slot_mapping) view.slot_mapping = copies.add(*p.slot_mapping);
  copies.wait();
  step.shape = translate::validate(call, view, Validation::kFull, step.batch);
  const translate::Shape& s = step.shape;
  step.batch.gather_pages(view.block_table, s.block_size);
  translate::fill_slots(view, s, step.batch, step.slots);
  ::pagedattn::ops::checks::check_unique_slots(
      call, p.slot_mapping ? "slot_mapping" : "the new tokens' slots (from block_table)",
      step.slots);
  if (p.do_rotary) translate::fill_positions(view, s, step.batch, step.positions);
  return step;
}

// The step's device block: slots, positions and conversion slots uploaded;
// f32 scratch for the rotated q and k, the cos / sin tables and head_sink
// where they are not f32 already.
struct DeviceStep {
  std::size_t slots = 0, positions = 0, identity = 0;
  std::size_t q = 0, k = 0, cos = 0, sin = 0, sinks = 0;
};

DeviceStep lay_out_step(const PagedAttentionParams& p, const HostStep& host, DeviceLayout& layout) {
  const translate::Shape& s = host.shape;
  const auto converts = [](const std::optional<TensorView>& t) {
    return t && t->dtype != DType::kF32;  // device_f32's condition
  };
  const auto f32_bytes = [](std::int64_t count) { return std::size_t(count) * sizeof(float); };
  DeviceStep d;
  d.slots = layout.upload(host.slots);
  d.positions = layout.upload(host.positions);
  if (p.do_rotary || converts(p.head_sink))
    d.identity = layout.upload(identity_slots(std::max<std::int64_t>({s.tokens, s.rope_rows, 1})));
  if (p.do_rotary) {
    d.q = layout.reserve(f32_bytes(std::int64_t{s.tokens} * s.hq * s.head_size));
    d.k = layout.reserve(f32_bytes(std::int64_t{s.tokens} * s.hkv * s.head_size));
  }
  if (p.do_rotary && converts(p.cos_cache))
    d.cos = layout.reserve(f32_bytes(translate::rope_table_elements(s)));
  if (p.do_rotary && converts(p.sin_cache))
    d.sin = layout.reserve(f32_bytes(translate::rope_table_elements(s)));
  if (converts(p.head_sink)) d.sinks = layout.reserve(f32_bytes(s.hq));
  return d;
}

// do_rotary: q and the new k (`inputs`) copied to their f32 scratch and
// rotated at their positions there, as the CPU operator's rotated_copy (the
// inputs stay as they are).
void rotate(const PagedAttentionParams& p, const translate::Shape& s, const DeviceStep& d,
            const DeviceBlock& block, const translate::HeadViews& inputs, cudaStream_t stream) {
  const auto* identity = block.at<const std::int64_t>(d.identity);
  const std::int32_t half = s.rotary_dim / 2;
  const RopeConfig rope = translate::rope_config(
      p, s, device_f32(*p.cos_cache, s.rope_rows, half, block.at<float>(d.cos), identity, stream),
      device_f32(*p.sin_cache, s.rope_rows, half, block.at<float>(d.sin), identity, stream));
  const auto* positions = block.at<const std::int32_t>(d.positions);
  const HeadTensor q =
      copy_as_f32(inputs.q, s.tokens, s.hq, s.head_size, block.at<float>(d.q), identity, stream);
  cuda_apply_rope(q, s.tokens, s.hq, s.head_size, positions, rope, stream);
  const HeadTensor k =
      copy_as_f32(inputs.k, s.tokens, s.hkv, s.head_size, block.at<float>(d.k), identity, stream);
  cuda_apply_rope(k, s.tokens, s.hkv, s.head_size, positions, rope, stream);
}

}  // namespace

void paged_attention(const PagedAttentionParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::ort::paged_attention";
  const cudaStream_t cs = as_cuda(stream);
  const HostStep host = read_step(kCall, p, cs);
  const translate::Shape& s = host.shape;
  if (s.tokens == 0) return;  // validated; nothing to write or attend (as on the CPU)

  DeviceLayout layout;
  const DeviceStep d = lay_out_step(p, host, layout);
  const DeviceBlock block(kCall, layout, cs);
  const translate::HeadViews inputs = translate::head_views(p, s);
  translate::HeadViews x = inputs;  // what is appended and attended
  if (p.do_rotary) {
    x.q = dense_f32(block.at<float>(d.q), s.hq, s.head_size);
    x.k = dense_f32(block.at<float>(d.k), s.hkv, s.head_size);
  }
  const PagedKVStorage kv = translate::kv_storage(p, s);
  const float* sinks = p.head_sink ? device_f32(*p.head_sink, 1, s.hq, block.at<float>(d.sinks),
                                                block.at<const std::int64_t>(d.identity), cs)
                                   : nullptr;
  const PlannedAttention attention =
      plan_attention(kCall, x.q, x.o, s.hq, kv, translate::attention_options(p, sinks), host.batch);

  if (p.do_rotary) rotate(p, s, d, block, inputs, cs);
  cuda_append_paged_kv({x.k, x.v, block.at<const std::int64_t>(d.slots), s.tokens, kv}, stream);
  run_attention(kCall, attention, host.batch, cs);
}

}  // namespace ort

// --- vLLM ------------------------------------------------------------------------------

namespace vllm {
namespace {

namespace translate = ::pagedattn::ops::vllm::internal;

// A validated forward: pages gathered, planned, run.
void attend(const char* call, const translate::ForwardAttention& a, const IndexView& block_tables,
            RaggedBatch& batch, cudaStream_t stream) {
  batch.gather_pages(block_tables, a.kv.page_size);
  const PlannedAttention planned =
      plan_attention(call, a.q, a.o, a.num_qo_heads, a.kv, a.options, batch);
  run_attention(call, planned, batch, stream);
}

// Whether `data` is device memory (managed memory counts as device).
bool on_device(const char* call, const void* data) {
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, data), call, "cudaPointerGetAttributes");
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace

void forward_decode(const ForwardDecodeParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::vllm::forward_decode";
  const cudaStream_t cs = as_cuda(stream);
  RaggedBatch batch;
  translate::validate_decode(kCall, p, Validation::kMetadata, batch);
  refuse_float32_kv(kCall, "key_cache", p.kv.key_cache.dtype);
  HostIndexCopies copies(kCall, cs);
  ForwardDecodeParams view = p;
  view.block_tables = copies.add(p.block_tables);
  view.seq_lens = copies.add(p.seq_lens);
  copies.wait();
  const translate::ForwardAttention a =
      translate::validate_decode(kCall, view, Validation::kFull, batch);
  attend(kCall, a, view.block_tables, batch, cs);
}

void forward_prefix(const ForwardPrefixParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::vllm::forward_prefix";
  const cudaStream_t cs = as_cuda(stream);
  RaggedBatch batch;
  translate::validate_prefix(kCall, p, Validation::kMetadata, batch);
  refuse_float32_kv(kCall, "key_cache", p.kv.key_cache.dtype);
  HostIndexCopies copies(kCall, cs);
  ForwardPrefixParams view = p;
  view.block_tables = copies.add(p.block_tables);
  view.query_start_loc = copies.add(p.query_start_loc);
  view.seq_lens = copies.add(p.seq_lens);
  copies.wait();
  const translate::ForwardAttention a =
      translate::validate_prefix(kCall, view, Validation::kFull, batch);
  attend(kCall, a, view.block_tables, batch, cs);
}

void write_to_paged_cache(const WriteToPagedCacheParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::vllm::write_to_paged_cache";
  const cudaStream_t cs = as_cuda(stream);
  std::vector<std::int64_t> slots;
  translate::validate_write(kCall, p, Validation::kMetadata, slots);
  HostIndexCopies copies(kCall, cs);
  WriteToPagedCacheParams view = p;
  view.slot_mapping = copies.add(p.slot_mapping);
  copies.wait();
  AppendParams append = translate::validate_write(kCall, view, Validation::kFull, slots);
  ::pagedattn::ops::checks::check_unique_slots(kCall, "slot_mapping", slots);
  if (append.num_tokens == 0) return;
  DeviceLayout layout;
  const std::size_t at = layout.upload(slots);  // dense, as validated
  const DeviceBlock block(kCall, layout, cs);
  append.slot_mapping = block.at<const std::int64_t>(at);
  cuda_append_paged_kv(append, stream);
}

void copy_blocks(const CopyBlocksParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::vllm::copy_blocks";
  translate::validate_copy_blocks(kCall, p, Validation::kMetadata);
  HostIndexCopies copies(kCall, as_cuda(stream));
  CopyBlocksParams view = p;
  view.block_mapping = copies.add(p.block_mapping);
  copies.wait();
  const std::vector<PagedKVStorage> storages =
      translate::validate_copy_blocks(kCall, view, Validation::kFull);
  const auto pairs = translate::block_pairs(view.block_mapping);
  for (const PagedKVStorage& s : storages) cuda_copy_pages(s, s, pairs, stream);
}

void swap_blocks(const SwapBlocksParams& p, Stream stream) {
  constexpr const char* kCall = "cuda::vllm::swap_blocks";
  const translate::SwapStorages s = translate::validate_swap_blocks(kCall, p, Validation::kFull);
  const bool src_on_device = on_device(kCall, p.src.data);
  const bool dst_on_device = on_device(kCall, p.dst.data);
  require(src_on_device || dst_on_device, kCall,
          ": src and dst are both host memory; one of them must be device memory");
  const auto pairs = translate::block_pairs(p.block_mapping);
  if (src_on_device && dst_on_device)
    cuda_copy_pages(s.src, s.dst, pairs, stream);
  else
    cuda_swap_pages(s.src, s.dst, pairs,
                    src_on_device ? SwapDirection::kDeviceToHost : SwapDirection::kHostToDevice,
                    stream);
}

}  // namespace vllm
}  // namespace pagedattn::cuda::ops
