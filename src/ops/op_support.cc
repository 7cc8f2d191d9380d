#include "op_support.h"

#include <cstring>

#include "kernels/cpu/convert.h"

namespace pagedattn::ops {

void RaggedBatch::gather_pages(const IndexView& block_table, std::int32_t page_size) {
  const std::size_t batch = kv_lens.size();
  kv_indptr.assign(batch + 1, 0);
  kv_last_page_len.assign(batch, 0);
  kv_indices.clear();
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int32_t len = kv_lens[b];
    const std::int32_t used = (len + page_size - 1) / page_size;
    for (std::int32_t i = 0; i < used; ++i)
      kv_indices.push_back(
          static_cast<std::int32_t>(block_table.at(static_cast<std::int64_t>(b), i)));
    kv_indptr[b + 1] = kv_indptr[b] + used;
    kv_last_page_len[b] = used == 0 ? 0 : len - (used - 1) * page_size;
  }
}

PagedKVTable RaggedBatch::table(std::int32_t page_size) const {
  return {static_cast<std::int32_t>(kv_lens.size()),
          page_size,
          qo_indptr.data(),
          kv_indptr.data(),
          kv_indices.data(),
          kv_last_page_len.data(),
          kv_lens.data(),
          nullptr,
          nullptr};
}

PagedKVStorage cache_storage(void* k_data, CacheAxes k_axes, void* v_data, CacheAxes v_axes,
                             DType dtype, KVLayout layout, const CacheGeometry& g) {
  PagedKVStorage s;
  s.k_data = k_data;
  s.v_data = v_data;
  s.dtype = dtype;
  s.layout = layout;
  s.page_size = g.page_size;
  s.num_kv_heads = g.num_kv_heads;
  s.head_dim = g.head_dim;
  s.v_head_dim = g.head_dim;
  s.num_pages = g.num_pages;
  s.k_page_stride = k_axes.page;
  s.k_token_stride = k_axes.token;
  s.k_head_stride = k_axes.head;
  s.v_page_stride = v_axes.page;
  s.v_token_stride = v_axes.token;
  s.v_head_stride = v_axes.head;
  return s;
}

HeadTensor head_tensor(const TensorView& t, std::int64_t token_stride, std::int64_t head_stride,
                       std::int64_t offset) {
  HeadTensor h;
  h.data = t.data ? static_cast<std::byte*>(t.data) +
                        offset * static_cast<std::int64_t>(dtype_size(t.dtype))
                  : nullptr;
  h.dtype = t.dtype;
  h.token_stride = token_stride;
  h.head_stride = head_stride;
  return h;
}

const float* as_float(const TensorView& t, std::int64_t count, std::vector<float>& out) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  out.resize(static_cast<std::size_t>(count));
  kernels::convert_row(t.data, t.dtype, out.data(), DType::kF32, count, 1.0f);
  return out.data();
}

void run_attention(const HeadTensor& q, const HeadTensor& o, std::int32_t num_qo_heads,
                   const PagedKVStorage& kv, const AttentionOptions& options, OpScratch& scratch) {
  AttentionParams p;
  p.q = q;
  p.o = o;
  p.num_qo_heads = num_qo_heads;
  p.table = scratch.batch.table(kv.page_size);
  p.kv = kv;
  p.options = options;
  scratch.runner.run(p);
}

OpScratch& thread_scratch() {
  thread_local OpScratch scratch;
  return scratch;
}

void zero_rows(const HeadTensor& o, std::int32_t first_token, std::int32_t tokens,
               std::int32_t heads, std::int32_t dim) {
  const auto es = static_cast<std::int64_t>(dtype_size(o.dtype));
  for (std::int32_t t = first_token; t < tokens; ++t)
    for (std::int32_t h = 0; h < heads; ++h)
      std::memset(static_cast<std::byte*>(o.data) + (t * o.token_stride + h * o.head_stride) * es,
                  0, static_cast<std::size_t>(dim * es));
}

}  // namespace pagedattn::ops
