// ONNX Runtime com.microsoft.PagedAttention: validate, rotate, append, attend.
#include "pagedattn/ops/ort.h"

#include <algorithm>

#include "kernels/rotated_copy.h"
#include "op_checks.h"
#include "op_support.h"
#include "ort_translate.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::ops::ort {
namespace internal {

using namespace checks;

namespace {

void check_attributes(const char* call, const PagedAttentionParams& p) {
  require(p.num_heads >= 1 && p.kv_num_heads >= 1 && p.num_heads % p.kv_num_heads == 0, call,
          ": num_heads = ", p.num_heads,
          " must be a positive multiple of kv_num_heads = ", p.kv_num_heads);
  check_finite(call, "scale", p.scale);
  require(p.softcap >= 0.0f, call, ": softcap = ", p.softcap, " must be 0 (off) or > 0");
  check_finite(call, "softcap", p.softcap);
  // Current ORT (its PR #25927): L keys, the query's own included. L = 0 would
  // show no key at all (ORT returns zero rows), so it is refused as meaningless.
  require(p.local_window_size == -1 || p.local_window_size >= 1, call,
          ": local_window_size = ", p.local_window_size, " must be -1 (off) or >= 1");
}

// query, key, value, output: dense, one dtype; derives T, D and packing.
void check_activations(const char* call, const PagedAttentionParams& p, Shape& s) {
  require(p.key.has_value() == p.value.has_value(), call,
          ": key and value must both be given or both be absent (packed QKV)");
  check_rank(call, "query", p.query.rank, 2);
  check_activation_dtype(call, "query", p.query);
  check_contiguous(call, "query", p.query);
  s.packed = !p.key;
  s.hq = p.num_heads;
  s.hkv = p.kv_num_heads;
  s.tokens = checked_int32(call, "query.shape[0]", p.query.dim(0));
  const std::int64_t heads_per_row = s.packed ? s.hq + 2 * std::int64_t{s.hkv} : s.hq;
  const std::int64_t width = p.query.dim(1);
  require(width >= heads_per_row && width % heads_per_row == 0, call, ": query.shape[1] = ", width,
          " is not a positive multiple of ", heads_per_row,
          s.packed ? " (num_heads + 2 kv_num_heads, packed QKV)" : " (num_heads)");
  s.head_size = checked_int32(call, "head_size", width / heads_per_row);
  checked_int32_product(call, "query.shape[0] * query.shape[1]", s.tokens, width);
  check_present(call, "query", p.query.data, s.tokens);
  const std::int64_t kv_width = std::int64_t{s.hkv} * s.head_size;
  for (const auto& [tensor, name] : {std::pair{&p.key, "key"}, std::pair{&p.value, "value"}}) {
    if (!*tensor) continue;
    check_shape(call, name, **tensor, {s.tokens, kv_width});
    check_dtype(call, name, (*tensor)->dtype, p.query.dtype);
    check_contiguous(call, name, **tensor);
    check_present(call, name, (*tensor)->data, s.tokens);
  }
  check_shape(call, "output", p.output, {s.tokens, std::int64_t{s.hq} * s.head_size});
  check_dtype(call, "output", p.output.dtype, p.query.dtype);
  check_contiguous(call, "output", p.output);
  check_present(call, "output", p.output.data, s.tokens);
}

void check_caches(const char* call, const PagedAttentionParams& p, Shape& s) {
  const TensorView& kc = p.key_cache;
  require(kc.rank == 3 || kc.rank == 4, call, ": key_cache has rank ", kc.rank,
          ", expected 3 (num_blocks, block_size, kv_num_heads*head_size) or 4");
  const std::int64_t kv_width = std::int64_t{s.hkv} * s.head_size;
  if (kc.rank == 3)
    check_shape(call, "key_cache", kc, {kc.dim(0), kc.dim(1), kv_width});
  else
    check_shape(call, "key_cache", kc, {kc.dim(0), kc.dim(1), s.hkv, s.head_size});
  const TensorView& vc = p.value_cache;
  require(vc.rank == kc.rank && vc.shape == kc.shape, call,
          ": value_cache must have key_cache's shape");
  check_dtype(call, "key_cache", kc.dtype, p.query.dtype);
  check_dtype(call, "value_cache", vc.dtype, p.query.dtype);
  check_contiguous(call, "key_cache", kc);
  check_contiguous(call, "value_cache", vc);
  s.num_blocks = kc.dim(0);
  s.block_size = checked_int32(call, "key_cache.shape[1] (block_size)", kc.dim(1));
  require(s.num_blocks >= 1 && s.block_size >= 1, call, ": key_cache num_blocks = ", s.num_blocks,
          " and block_size = ", s.block_size, " must be >= 1");
  checked_int32(call, "num_blocks", s.num_blocks);
  check_present(call, "key_cache", kc.data, 1);
  check_present(call, "value_cache", vc.data, 1);
}

// The sequence arrays; kFull fills the batch's qo_indptr and kv_lens.
void check_sequences(const char* call, const PagedAttentionParams& p, Validation validation,
                     Shape& s, RaggedBatch& batch) {
  check_rank(call, "past_seqlens", p.past_seqlens.rank, 1);
  s.batch = checked_int32(call, "past_seqlens.shape[0]", p.past_seqlens.dim(0));
  check_rank(call, "block_table", p.block_table.rank, 2);
  s.max_blocks = checked_int32(call, "block_table.shape[1]", p.block_table.dim(1));
  check_shape(call, "cumulative_sequence_length", p.cumulative_sequence_length, {s.batch + 1});
  check_shape(call, "block_table", p.block_table, {s.batch, s.max_blocks});
  for (const auto& [v, name] :
       {std::pair{&p.cumulative_sequence_length, "cumulative_sequence_length"},
        std::pair{&p.past_seqlens, "past_seqlens"}, std::pair{&p.block_table, "block_table"}}) {
    check_index_type(call, name, *v, IndexType::kInt32);
    check_present(call, name, v->data, v->dim(0) * (v->rank == 2 ? v->dim(1) : 1));
  }
  const std::int32_t capacity = checked_int32_product(call, "max_blocks_per_sequence * block_size",
                                                      s.max_blocks, s.block_size);
  checked_int32_product(call, "batch_size * max_blocks_per_sequence", s.batch, s.max_blocks);
  if (validation == Validation::kMetadata) return;
  check_offsets(call, "cumulative_sequence_length", p.cumulative_sequence_length, s.batch,
                s.tokens);
  batch.qo_indptr.resize(static_cast<std::size_t>(s.batch) + 1);
  batch.kv_lens.resize(static_cast<std::size_t>(s.batch));
  batch.qo_indptr[0] = 0;
  for (std::int32_t b = 0; b < s.batch; ++b) {
    const std::int64_t past = p.past_seqlens.at(b);
    check_length(call, "past_seqlens", b, past, capacity, "block_table columns x block_size");
    const std::int64_t total =
        past + p.cumulative_sequence_length.at(b + 1) - p.cumulative_sequence_length.at(b);
    check_length(call, "past_seqlens + new tokens of sequence", b, total, capacity,
                 "block_table columns x block_size");
    batch.qo_indptr[static_cast<std::size_t>(b) + 1] =
        static_cast<std::int32_t>(p.cumulative_sequence_length.at(b + 1));
    batch.kv_lens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(total);
    if (total > past) s.rope_rows = std::max(s.rope_rows, static_cast<std::int32_t>(total));
  }
  check_page_table(call, "block_table", p.block_table, batch.kv_lens, s.block_size, s.num_blocks);
}

// kMetadata: rope_rows is 0 (no index value read), so the tables' rows are
// not checked against it.
void check_optional_inputs(const char* call, const PagedAttentionParams& p, Validation validation,
                           Shape& s) {
  if (p.slot_mapping) {
    check_shape(call, "slot_mapping", *p.slot_mapping, {s.tokens});
    check_present(call, "slot_mapping", p.slot_mapping->data, s.tokens);
    if (validation == Validation::kFull)
      check_slots(call, "slot_mapping", *p.slot_mapping, s.tokens, s.num_blocks * s.block_size);
  }
  if (p.head_sink) {
    check_shape(call, "head_sink", *p.head_sink, {s.hq});
    check_activation_dtype(call, "head_sink", *p.head_sink);
    check_contiguous(call, "head_sink", *p.head_sink);
    check_present(call, "head_sink", p.head_sink->data, s.hq);
  }
  require(p.cos_cache.has_value() == p.do_rotary && p.sin_cache.has_value() == p.do_rotary, call,
          ": cos_cache and sin_cache must be given exactly when do_rotary = 1 (do_rotary = ",
          p.do_rotary, ")");
  if (!p.do_rotary) return;
  check_rank(call, "cos_cache", p.cos_cache->rank, 2);
  const std::int64_t half = p.cos_cache->dim(1);
  require(half >= 1 && 2 * half <= s.head_size, call, ": cos_cache.shape[1] = ", half,
          " (rotary_dim / 2) must be in [1, head_size / 2 = ", s.head_size / 2, "]");
  s.rotary_dim = static_cast<std::int32_t>(2 * half);
  for (const auto& [t, name] :
       {std::pair{&*p.cos_cache, "cos_cache"}, std::pair{&*p.sin_cache, "sin_cache"}}) {
    check_shape(call, name, *t, {p.cos_cache->dim(0), half});
    check_activation_dtype(call, name, *t);
    check_contiguous(call, name, *t);
    if (validation == Validation::kFull) check_position_rows(call, name, t->dim(0), s.rope_rows);
    check_present(call, name, t->data, std::int64_t{s.rope_rows} * half);
  }
}

}  // namespace

Shape validate(const char* call, const PagedAttentionParams& p, Validation validation,
               RaggedBatch& batch) {
  Shape s;
  check_attributes(call, p);
  check_activations(call, p, s);
  check_caches(call, p, s);
  check_sequences(call, p, validation, s, batch);
  check_optional_inputs(call, p, validation, s);
  return s;
}

HeadViews head_views(const PagedAttentionParams& p, const Shape& s) {
  const std::int64_t row = p.query.dim(1), kv_row = std::int64_t{s.hkv} * s.head_size;
  HeadViews h;
  h.q = head_tensor(p.query, row, s.head_size);
  h.k = s.packed ? head_tensor(p.query, row, s.head_size, std::int64_t{s.hq} * s.head_size)
                 : head_tensor(*p.key, kv_row, s.head_size);
  h.v = s.packed
            ? head_tensor(p.query, row, s.head_size, (std::int64_t{s.hq} + s.hkv) * s.head_size)
            : head_tensor(*p.value, kv_row, s.head_size);
  h.o = head_tensor(p.output, std::int64_t{s.hq} * s.head_size, s.head_size);
  return h;
}

PagedKVStorage kv_storage(const PagedAttentionParams& p, const Shape& s) {
  const CacheAxes axes{p.key_cache.stride(0), p.key_cache.stride(1), s.head_size};
  return cache_storage(p.key_cache.data, axes, p.value_cache.data, axes, p.key_cache.dtype,
                       KVLayout::kNHD, {s.block_size, s.hkv, s.head_size, s.num_blocks});
}

void fill_slots(const PagedAttentionParams& p, const Shape& s, const RaggedBatch& batch,
                std::vector<std::int64_t>& slots) {
  slots.resize(static_cast<std::size_t>(s.tokens));
  if (p.slot_mapping) {
    for (std::int32_t t = 0; t < s.tokens; ++t)
      slots[static_cast<std::size_t>(t)] = p.slot_mapping->at(t);
    return;
  }
  for (std::int32_t b = 0; b < s.batch; ++b) {
    const std::int64_t past = p.past_seqlens.at(b);
    for (std::int32_t t = batch.qo_indptr[b]; t < batch.qo_indptr[b + 1]; ++t) {
      const std::int64_t pos = past + (t - batch.qo_indptr[b]);
      slots[static_cast<std::size_t>(t)] =
          p.block_table.at(b, pos / s.block_size) * s.block_size + pos % s.block_size;
    }
  }
}

void fill_positions(const PagedAttentionParams& p, const Shape& s, const RaggedBatch& batch,
                    std::vector<std::int32_t>& positions) {
  positions.resize(static_cast<std::size_t>(s.tokens));
  for (std::int32_t b = 0; b < s.batch; ++b)
    for (std::int32_t t = batch.qo_indptr[b]; t < batch.qo_indptr[b + 1]; ++t)
      positions[static_cast<std::size_t>(t)] =
          static_cast<std::int32_t>(p.past_seqlens.at(b)) + (t - batch.qo_indptr[b]);
}

RopeConfig rope_config(const PagedAttentionParams& p, const Shape& s, const float* cos,
                       const float* sin) {
  RopeConfig rope;
  rope.style = p.rotary_interleaved ? RopeStyle::kGptJ : RopeStyle::kNeox;
  rope.rotary_dim = s.rotary_dim;
  rope.cos_cache = cos;
  rope.sin_cache = sin;
  rope.cache_max_position = s.rope_rows;
  return rope;
}

AttentionOptions attention_options(const PagedAttentionParams& p, const float* sinks) {
  AttentionOptions options;
  if (p.scale != 0.0f) options.scale = p.scale;  // 0: 1/sqrt(head_size)
  options.softcap = p.softcap;
  // L keys, the query's own included: window_left = L - 1 (-1 stays off).
  if (p.local_window_size >= 1) options.window_left = p.local_window_size - 1;
  options.sinks = sinks;
  return options;
}

}  // namespace internal

void paged_attention(const PagedAttentionParams& p) {
  using namespace internal;
  OpScratch& scratch = thread_scratch();
  RaggedBatch& batch = scratch.batch;
  const Shape s = validate("ort::paged_attention", p, checks::Validation::kFull, batch);

  // Validated: nothing below can fail on the caller's input.
  batch.gather_pages(p.block_table, s.block_size);
  const PagedKVStorage kv = kv_storage(p, s);
  HeadViews x = head_views(p, s);
  if (p.do_rotary && s.tokens > 0) {
    fill_positions(p, s, batch, scratch.positions);
    const std::int64_t used = rope_table_elements(s);
    const RopeConfig rope = rope_config(p, s, as_float(*p.cos_cache, used, scratch.cos),
                                        as_float(*p.sin_cache, used, scratch.sin));
    x.q = kernels::rotated_copy(x.q, s.tokens, s.hq, s.head_size, scratch.positions.data(), rope,
                                scratch.q_rotated);
    x.k = kernels::rotated_copy(x.k, s.tokens, s.hkv, s.head_size, scratch.positions.data(), rope,
                                scratch.k_rotated);
  }
  fill_slots(p, s, batch, scratch.slots);
  append_paged_kv({x.k, x.v, scratch.slots.data(), s.tokens, kv});

  const float* sinks = p.head_sink ? as_float(*p.head_sink, s.hq, scratch.sinks) : nullptr;
  run_attention(x.q, x.o, s.hq, kv, attention_options(p, sinks), scratch);
}

}  // namespace pagedattn::ops::ort
