// torch_xla ragged paged attention: its checks, then one kernel call over
// the first num_seqs sequences.
#include "pagedattn/ops/torch_xla.h"

#include <algorithm>
#include <cmath>

#include "op_checks.h"
#include "op_support.h"
#include "pagedattn/errors.h"

namespace pagedattn::ops::torch_xla {
namespace {

using namespace checks;
constexpr const char* kCall = "torch_xla::ragged_paged_attention";

struct Shape {
  std::int32_t tokens = 0, hq = 0, hkv = 0, head_dim = 0, page_size = 0;
  std::int32_t max_num_seqs = 0, pages_per_seq = 0, num_seqs = 0;
  std::int64_t num_pages = 0;
  DType page_dtype = DType::kF32;
};

void check_page_dtype(const TensorView& t, const char* name) {
  require(is_activation_dtype(t.dtype) || is_fp8(t.dtype), kCall, ": ", name, " has dtype ",
          dtype_name(t.dtype), ", expected float32, float16, bfloat16 or float8");
  check_rows_contiguous(kCall, name, t);
  check_present(kCall, name, t.data, 1);
}

// The pages: combined [P, page, 2 Hkv, D] or split [P, page, Hkv * D].
void check_pages(const RaggedPagedAttentionParams& p, Shape& s) {
  require(p.kv_pages.has_value() != (p.k_pages.has_value() || p.v_pages.has_value()) &&
              p.k_pages.has_value() == p.v_pages.has_value(),
          kCall, ": give either kv_pages or both k_pages and v_pages");
  if (p.kv_pages) {
    const TensorView& kv = *p.kv_pages;
    check_rank(kCall, "kv_pages", kv.rank, 4);
    check_page_dtype(kv, "kv_pages");
    require(kv.dim(2) % 2 == 0 && kv.dim(2) >= 2, kCall, ": num_combined_kv_heads = ", kv.dim(2),
            " (kv_pages.shape[2]) must be even");
    require(kv.dim(3) == s.head_dim, kCall, ": Q head_dim ", s.head_dim,
            " must be the same as that of K/V ", kv.dim(3));
    s.hkv = checked_int32(kCall, "num_kv_heads", kv.dim(2) / 2);
    s.page_dtype = kv.dtype;
  } else {
    check_rank(kCall, "k_pages", p.k_pages->rank, 3);
    check_shape(kCall, "v_pages", *p.v_pages,
                {p.k_pages->dim(0), p.k_pages->dim(1), p.k_pages->dim(2)});
    check_page_dtype(*p.k_pages, "k_pages");
    check_page_dtype(*p.v_pages, "v_pages");
    check_dtype(kCall, "v_pages", p.v_pages->dtype, p.k_pages->dtype);
    const std::int64_t width = p.k_pages->dim(2);
    require(width >= s.head_dim && width % s.head_dim == 0, kCall, ": k_pages.shape[2] = ", width,
            " is not a multiple of Q head_dim ", s.head_dim);
    s.hkv = checked_int32(kCall, "num_kv_heads", width / s.head_dim);
    s.page_dtype = p.k_pages->dtype;
  }
  const TensorView& pages = p.kv_pages ? *p.kv_pages : *p.k_pages;
  s.num_pages = pages.dim(0);
  s.page_size = checked_int32(kCall, "page_size", pages.dim(1));
  checked_int32(kCall, "total_num_pages", s.num_pages);
  require(s.num_pages >= 1 && s.page_size >= 1, kCall, ": total_num_pages = ", s.num_pages,
          " and page_size = ", s.page_size, " must be >= 1");
  require(s.hq % s.hkv == 0, kCall, ": num_q_heads=", s.hq,
          " must be divisible by num_kv_heads=", s.hkv);
}

void check_scalars(const RaggedPagedAttentionParams& p, const Shape& s) {
  check_finite(kCall, "sm_scale", p.sm_scale);
  require(!p.sliding_window || *p.sliding_window > 0, kCall,
          ": sliding_window=", p.sliding_window.value_or(0), " must be positive.");
  require(!p.soft_cap || *p.soft_cap != 0.0f, kCall, ": soft_cap=0 must not be 0.0.");
  if (p.soft_cap) check_finite(kCall, "soft_cap", *p.soft_cap);
  for (const auto& [scale, name] :
       {std::pair{&p.k_scale, "k_scale"}, std::pair{&p.v_scale, "v_scale"}}) {
    if (!*scale) continue;
    require(is_fp8(s.page_dtype), kCall, ": ", name, " is only supported with float8 pages, not ",
            dtype_name(s.page_dtype));
    check_positive(kCall, name, **scale);
  }
}

// Index arrays: int32, shapes, num_seqs, then the live sequences' lengths
// and pages; fills the batch (first num_seqs entries only).
void check_sequences(const RaggedPagedAttentionParams& p, Shape& s, RaggedBatch& batch) {
  for (const auto& [v, name] :
       {std::pair{&p.kv_lens, "kv_lens"}, std::pair{&p.page_indices, "page_indices"},
        std::pair{&p.cu_q_lens, "cu_q_lens"}, std::pair{&p.num_seqs, "num_seqs"}})
    check_index_type(kCall, name, *v, IndexType::kInt32);
  check_rank(kCall, "page_indices", p.page_indices.rank, 2);
  s.max_num_seqs = checked_int32(kCall, "max_num_seqs", p.page_indices.dim(0));
  s.pages_per_seq = checked_int32(kCall, "pages_per_seq", p.page_indices.dim(1));
  check_shape(kCall, "kv_lens", p.kv_lens, {s.max_num_seqs});
  check_shape(kCall, "cu_q_lens", p.cu_q_lens, {s.max_num_seqs + 1});
  check_shape(kCall, "num_seqs", p.num_seqs, {1});
  for (const auto& [v, name] :
       {std::pair{&p.kv_lens, "kv_lens"}, std::pair{&p.page_indices, "page_indices"},
        std::pair{&p.cu_q_lens, "cu_q_lens"}, std::pair{&p.num_seqs, "num_seqs"}})
    check_present(kCall, name, v->data, v->dim(0) * (v->rank == 2 ? v->dim(1) : 1));
  const std::int64_t num_seqs = p.num_seqs.at(0);
  require(num_seqs >= 0 && num_seqs <= s.max_num_seqs, kCall, ": num_seqs[0]=", num_seqs,
          " must be less or equal to max_num_seqs=", s.max_num_seqs);
  s.num_seqs = static_cast<std::int32_t>(num_seqs);
  check_offsets(kCall, "cu_q_lens", p.cu_q_lens, s.num_seqs, s.tokens, OffsetsEnd::kPadded);
  std::int64_t max_kv_len = 0;
  for (std::int32_t b = 0; b < s.num_seqs; ++b) {
    check_length(kCall, "kv_lens", b, p.kv_lens.at(b), std::int64_t{1} << 31, "int32");
    max_kv_len = std::max(max_kv_len, p.kv_lens.at(b));
  }
  const std::int64_t min_pages = (max_kv_len + s.page_size - 1) / s.page_size;
  require(s.pages_per_seq >= min_pages, kCall, ": pages_per_seq=", s.pages_per_seq,
          " must be greater or equal to min_pages_per_seq=", min_pages,
          " given max_kv_len=", max_kv_len, " and page_size=", s.page_size, ".");
  checked_int32_product(kCall, "num_seqs * pages_per_seq", s.num_seqs, s.pages_per_seq);
  batch.qo_indptr.assign(1, 0);
  batch.kv_lens.clear();
  for (std::int32_t b = 0; b < s.num_seqs; ++b) {
    const std::int64_t q_len = p.cu_q_lens.at(b + 1) - p.cu_q_lens.at(b);
    require(q_len <= p.kv_lens.at(b), kCall, ": q_len=", q_len,
            " must be less or equal to kv_len=", p.kv_lens.at(b), " at sequence ", b, ".");
    batch.qo_indptr.push_back(static_cast<std::int32_t>(p.cu_q_lens.at(b + 1)));
    batch.kv_lens.push_back(static_cast<std::int32_t>(p.kv_lens.at(b)));
  }
  check_page_table(kCall, "page_indices", p.page_indices, batch.kv_lens, s.page_size, s.num_pages);
}

Shape validate(const RaggedPagedAttentionParams& p, RaggedBatch& batch) {
  Shape s;
  check_rank(kCall, "q", p.q.rank, 3);
  check_activation_dtype(kCall, "q", p.q);
  check_rows_contiguous(kCall, "q", p.q);
  s.tokens = checked_int32(kCall, "max_num_batched_tokens", p.q.dim(0));
  s.hq = checked_int32(kCall, "num_q_heads", p.q.dim(1));
  s.head_dim = checked_int32(kCall, "head_dim", p.q.dim(2));
  require(s.hq >= 1 && s.head_dim >= 1, kCall, ": q has shape [", s.tokens, ", ", s.hq, ", ",
          s.head_dim, "]; heads and head_dim must be >= 1");
  check_present(kCall, "q", p.q.data, s.tokens);
  check_pages(p, s);
  check_scalars(p, s);
  check_shape(kCall, "output", p.output, {s.tokens, s.hq, s.head_dim});
  check_dtype(kCall, "output", p.output.dtype, p.q.dtype);
  check_rows_contiguous(kCall, "output", p.output);
  check_present(kCall, "output", p.output.data, s.tokens);
  check_sequences(p, s, batch);
  return s;
}

PagedKVStorage storage_of(const RaggedPagedAttentionParams& p, const Shape& s) {
  const CacheGeometry g{s.page_size, s.hkv, s.head_dim, s.num_pages};
  const KVLayout layout = KVLayout::kNHD;
  PagedKVStorage storage;
  if (p.kv_pages) {  // K head h is combined head 2h, V head h is 2h + 1
    const TensorView& kv = *p.kv_pages;
    const CacheAxes axes{kv.stride(0), kv.stride(1), 2 * kv.stride(2)};
    auto* v_data = static_cast<std::byte*>(kv.data) +
                   kv.stride(2) * static_cast<std::int64_t>(dtype_size(kv.dtype));
    storage = cache_storage(kv.data, axes, v_data, axes, kv.dtype, layout, g);
  } else {
    const TensorView &k = *p.k_pages, &v = *p.v_pages;
    storage = cache_storage(k.data, {k.stride(0), k.stride(1), s.head_dim}, v.data,
                            {v.stride(0), v.stride(1), s.head_dim}, k.dtype, layout, g);
  }
  storage.k_scale = p.k_scale.value_or(1.0f);
  storage.v_scale = p.v_scale.value_or(1.0f);
  return storage;
}

}  // namespace

void ragged_paged_attention(const RaggedPagedAttentionParams& p) {
  OpScratch& scratch = thread_scratch();
  RaggedBatch& batch = scratch.batch;
  const Shape s = validate(p, batch);

  batch.gather_pages(p.page_indices, s.page_size);
  AttentionOptions options;
  options.scale = p.sm_scale;
  if (p.sliding_window) options.window_left = *p.sliding_window - 1;  // W keys
  if (p.soft_cap) options.softcap = std::fabs(*p.soft_cap);           // tanh(x/c)*c is even in c
  const HeadTensor o = head_tensor(p.output, p.output.stride(0), p.output.stride(1));
  run_attention(head_tensor(p.q, p.q.stride(0), p.q.stride(1)), o, s.hq, storage_of(p, s), options,
                scratch);
  zero_rows(o, batch.qo_indptr.back(), s.tokens, s.hq, s.head_dim);  // padding tokens
}

}  // namespace pagedattn::ops::torch_xla
