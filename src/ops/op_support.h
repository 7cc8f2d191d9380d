// Translation from peer conventions to the kernels' views, shared by the
// peer operators: a CSR page table built from a dense block table, cache
// tensors described as PagedKVStorage by their strides, and per-thread
// buffers reused across calls (the runner still plans per call).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/ops/tensor.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn::ops {

// The kernels' ragged batch, built from a peer's lengths and dense block table.
struct RaggedBatch {
  std::vector<std::int32_t> qo_indptr;         // [batch + 1] offsets of new tokens (caller fills)
  std::vector<std::int32_t> kv_lens;           // [batch] keys after the append (caller fills)
  std::vector<std::int32_t> kv_indptr;         // [batch + 1] offsets into kv_indices
  std::vector<std::int32_t> kv_indices;        // the used pages of every sequence, in order
  std::vector<std::int32_t> kv_last_page_len;  // [batch]

  // Fills the CSR page table from `block_table` [batch][max_pages]: sequence
  // b uses its first ceil(kv_lens[b] / page_size) entries (validated before).
  void gather_pages(const IndexView& block_table, std::int32_t page_size);
  PagedKVTable table(std::int32_t page_size) const;
};

// Element strides of one K or V cache tensor along its page, token and head axes.
struct CacheAxes {
  std::int64_t page = 0, token = 0, head = 0;
};

// One layer's pages described by the caches' own strides (no copy).
struct CacheGeometry {
  std::int32_t page_size = 0, num_kv_heads = 0, head_dim = 0;
  std::int64_t num_pages = 0;
};
PagedKVStorage cache_storage(void* k_data, CacheAxes k_axes, void* v_data, CacheAxes v_axes,
                             DType dtype, KVLayout layout, const CacheGeometry& geometry);

// A [tokens][heads][dim] view of a tensor whose tokens are `token_stride`
// apart and heads `head_stride`, starting `offset` elements in.
HeadTensor head_tensor(const TensorView& t, std::int64_t token_stride, std::int64_t head_stride,
                       std::int64_t offset = 0);

// Converts a dense vector of an activation dtype to float (`out` is reused).
const float* as_float(const TensorView& t, std::int64_t count, std::vector<float>& out);

// Reusable buffers of the calling thread.
struct OpScratch {
  RaggedBatch batch;
  // f32 products for every cache dtype and phase: callers of a peer's
  // operator check it against the peer's own kernel
  // (AttentionPlanOptions::fp8_fast_products, ::fast_prefill_products).
  AttentionRunner runner{
      AttentionPlanOptions{.fp8_fast_products = false, .fast_prefill_products = false}};
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> slots;
  std::vector<float> q_rotated, k_rotated, cos, sin, sinks, alibi;
};
OpScratch& thread_scratch();

// Attention over scratch.batch (gathered) and `kv` with the thread's runner.
void run_attention(const HeadTensor& q, const HeadTensor& o, std::int32_t num_qo_heads,
                   const PagedKVStorage& kv, const AttentionOptions& options, OpScratch& scratch);

// Writes zeros to rows [first_token, tokens) of a [tokens][heads][dim] view.
void zero_rows(const HeadTensor& o, std::int32_t first_token, std::int32_t tokens,
               std::int32_t heads, std::int32_t dim);

}  // namespace pagedattn::ops
