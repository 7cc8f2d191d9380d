// vLLM paged_attn ops: validate, describe the caches by their strides, then
// append / attend / copy with the kernels.
#include "pagedattn/ops/vllm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "op_checks.h"
#include "op_support.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"
#include "vllm_translate.h"

namespace pagedattn::ops::vllm {
namespace internal {

using namespace checks;

namespace {

struct CacheShape {
  std::int32_t block_size = 0, num_kv_heads = 0, head_dim = 0;
  std::int64_t num_blocks = 0;
};

// The storage dtype a kv_cache_dtype string names ("auto": the activations').
DType cache_dtype_of(const char* call, std::string_view kv_cache_dtype, DType activation) {
  if (kv_cache_dtype == "auto") return activation;
  if (kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3") return DType::kFP8E4M3;
  if (kv_cache_dtype == "fp8_e5m2") return DType::kFP8E5M2;
  throw InvalidArgument(
      detail::concat(call, ": kv_cache_dtype = \"", kv_cache_dtype,
                     "\" must be \"auto\", \"fp8\", \"fp8_e4m3\" or \"fp8_e5m2\""));
}

CacheShape check_cache_tensor(const char* call, const char* name, const TensorView& t,
                              CacheLayout layout) {
  check_rank(call, name, t.rank, 4);
  check_rows_contiguous(call, name, t);
  const bool flash = layout == CacheLayout::kFlash;
  CacheShape s;
  s.num_blocks = t.dim(0);
  s.block_size = checked_int32(call, "block_size", t.dim(flash ? 1 : 2));
  s.num_kv_heads = checked_int32(call, "num_kv_heads", t.dim(flash ? 2 : 1));
  s.head_dim = checked_int32(call, "head_size", t.dim(3));
  checked_int32(call, "num_blocks", s.num_blocks);
  require(s.num_blocks >= 1 && s.block_size >= 1 && s.num_kv_heads >= 1 && s.head_dim >= 1, call,
          ": ", name, " extents must all be >= 1");
  check_present(call, name, t.data, 1);
  return s;
}

CacheAxes axes_of(const TensorView& t, CacheLayout layout) {
  if (layout == CacheLayout::kFlash) return {t.stride(0), t.stride(1), t.stride(2)};
  return {t.stride(0), t.stride(2), t.stride(1)};
}

CacheShape check_caches(const char* call, const KVCaches& kv, DType activation) {
  const CacheShape s = check_cache_tensor(call, "key_cache", kv.key_cache, kv.layout);
  check_shape(call, "value_cache", kv.value_cache,
              {kv.key_cache.dim(0), kv.key_cache.dim(1), kv.key_cache.dim(2), kv.key_cache.dim(3)});
  check_cache_tensor(call, "value_cache", kv.value_cache, kv.layout);
  const DType dtype = cache_dtype_of(call, kv.kv_cache_dtype, activation);
  check_dtype(call, "key_cache", kv.key_cache.dtype, dtype);
  check_dtype(call, "value_cache", kv.value_cache.dtype, dtype);
  if (is_fp8(dtype)) {
    check_positive(call, "k_scale", kv.k_scale);
    check_positive(call, "v_scale", kv.v_scale);
  }
  return s;
}

PagedKVStorage storage_of(const KVCaches& kv, const CacheShape& s) {
  PagedKVStorage storage =
      cache_storage(kv.key_cache.data, axes_of(kv.key_cache, kv.layout), kv.value_cache.data,
                    axes_of(kv.value_cache, kv.layout), kv.key_cache.dtype,
                    kv.layout == CacheLayout::kFlash ? KVLayout::kNHD : KVLayout::kHND,
                    {s.block_size, s.num_kv_heads, s.head_dim, s.num_blocks});
  storage.k_scale = kv.k_scale;
  storage.v_scale = kv.v_scale;
  return storage;
}

// A [tokens, heads, head_dim] activation (query, key, value or output).
void check_heads_tensor(const char* call, const char* name, const TensorView& t,
                        std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                        DType dtype) {
  check_shape(call, name, t, {tokens, heads, head_dim});
  check_dtype(call, name, t.dtype, dtype);
  check_rows_contiguous(call, name, t);
  check_present(call, name, t.data, tokens);
}

// block_tables [S, max_blocks] and seq_lens [S]: kFull fills batch.kv_lens.
void check_sequences(const char* call, const IndexView& block_tables, const IndexView& seq_lens,
                     const CacheShape& cache, Validation validation, RaggedBatch& batch) {
  check_rank(call, "seq_lens", seq_lens.rank, 1);
  check_rank(call, "block_tables", block_tables.rank, 2);
  const std::int32_t seqs = checked_int32(call, "num_seqs", seq_lens.dim(0));
  check_shape(call, "block_tables", block_tables, {seqs, block_tables.dim(1)});
  for (const auto& [v, name] :
       {std::pair{&block_tables, "block_tables"}, std::pair{&seq_lens, "seq_lens"}}) {
    check_index_type(call, name, *v, IndexType::kInt32);
    check_present(call, name, v->data, v->dim(0) * (v->rank == 2 ? v->dim(1) : 1));
  }
  const std::int32_t capacity =
      checked_int32_product(call, "max_blocks * block_size", block_tables.dim(1), cache.block_size);
  checked_int32_product(call, "num_seqs * max_blocks", seqs, block_tables.dim(1));
  if (validation == Validation::kMetadata) return;
  batch.kv_lens.resize(static_cast<std::size_t>(seqs));
  for (std::int32_t b = 0; b < seqs; ++b) {
    check_length(call, "seq_lens", b, seq_lens.at(b), capacity,
                 "block_tables columns x block_size");
    batch.kv_lens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(seq_lens.at(b));
  }
  check_page_table(call, "block_tables", block_tables, batch.kv_lens, cache.block_size,
                   cache.num_blocks);
}

const float* checked_alibi(const char* call, const std::optional<TensorView>& slopes,
                           std::int64_t hq) {
  if (!slopes) return nullptr;
  check_shape(call, "alibi_slopes", *slopes, {hq});
  check_dtype(call, "alibi_slopes", slopes->dtype, DType::kF32);
  check_contiguous(call, "alibi_slopes", *slopes);
  check_present(call, "alibi_slopes", slopes->data, hq);
  return static_cast<const float*>(slopes->data);
}

// query / output [tokens, Hq, D] over the caller's pointers.
ForwardAttention forward_views(const TensorView& query, const TensorView& output,
                               const PagedKVStorage& kv) {
  ForwardAttention a;
  a.q = head_tensor(query, query.stride(0), query.stride(1));
  a.o = head_tensor(output, output.stride(0), output.stride(1));
  a.num_qo_heads = static_cast<std::int32_t>(query.dim(1));
  a.kv = kv;
  return a;
}

// Queries 0 .. seqs - 1, one per sequence (decodes).
void one_query_each(std::int64_t seqs, RaggedBatch& batch) {
  batch.qo_indptr.resize(static_cast<std::size_t>(seqs) + 1);
  for (std::int32_t b = 0; b <= static_cast<std::int32_t>(seqs); ++b)
    batch.qo_indptr[static_cast<std::size_t>(b)] = b;
}

// query / output [tokens, Hq, D] against the caches (both forwards).
CacheShape check_query_and_caches(const char* call, const TensorView& query,
                                  const TensorView& output, const KVCaches& kv) {
  check_rank(call, "query", query.rank, 3);
  check_activation_dtype(call, "query", query);
  const CacheShape cache = check_caches(call, kv, query.dtype);
  const std::int64_t tokens = query.dim(0), hq = query.dim(1);
  require(hq >= 1 && hq % cache.num_kv_heads == 0, call, ": query heads = ", hq,
          " must be a positive multiple of num_kv_heads = ", cache.num_kv_heads);
  check_heads_tensor(call, "query", query, tokens, hq, cache.head_dim, query.dtype);
  check_heads_tensor(call, "output", output, tokens, hq, cache.head_dim, query.dtype);
  return cache;
}

// A block is one contiguous run: copying it whole needs a dense block.
CacheShape check_block_tensor(const char* call, const std::string& name, const TensorView& t,
                              CacheLayout layout) {
  const CacheShape s = check_cache_tensor(call, name.c_str(), t, layout);
  require(t.stride(0) >= std::int64_t{s.block_size} * s.num_kv_heads * s.head_dim &&
              t.stride(1) * t.dim(1) == t.stride(0) && t.stride(2) * t.dim(2) == t.stride(1),
          call, ": ", name, " blocks must be contiguous (strides ", t.stride(0), ", ", t.stride(1),
          ", ", t.stride(2), ")");
  return s;
}

// The int8 scales of a cache named `cache_name` (absent for other dtypes):
// [num_blocks, Hkv, block_size] float32, dense. Returns the scales or null.
float* check_block_scales(const char* call, const std::string& name, const TensorView* scales,
                          const std::string& cache_name, const TensorView& cache,
                          const CacheShape& s) {
  const bool given = scales != nullptr && scales->rank != 0;
  if (cache.dtype != DType::kINT8) {
    require(!given, call, ": ", name, " is given but ", cache_name, " has dtype ",
            dtype_name(cache.dtype), " (only int8 caches have scales)");
    return nullptr;
  }
  require(given, call, ": ", cache_name, " is int8: its scales ", name,
          " [num_blocks, num_kv_heads, block_size] float32 must be given");
  check_shape(call, name.c_str(), *scales, {s.num_blocks, s.num_kv_heads, s.block_size});
  check_dtype(call, name.c_str(), scales->dtype, DType::kF32);
  check_contiguous(call, name.c_str(), *scales);
  check_present(call, name.c_str(), scales->data, s.num_blocks);
  return static_cast<float*>(scales->data);
}

// One cache tensor's blocks (K only: V is empty), with its int8 scales.
PagedKVStorage block_storage(const TensorView& t, CacheLayout layout, const CacheShape& s,
                             float* scales) {
  PagedKVStorage storage =
      cache_storage(t.data, axes_of(t, layout), t.data, {}, t.dtype,
                    layout == CacheLayout::kFlash ? KVLayout::kNHD : KVLayout::kHND,
                    {s.block_size, s.num_kv_heads, s.head_dim, s.num_blocks});
  // V is empty (no bytes); it shares K's scales, which copy_pages then copies
  // twice, identically.
  storage.k_token_scales = storage.v_token_scales = scales;
  return storage;
}

void check_mapping(const char* call, const IndexView& mapping) {
  check_rank(call, "block_mapping", mapping.rank, 2);
  check_shape(call, "block_mapping", mapping, {mapping.dim(0), 2});
  check_index_type(call, "block_mapping", mapping, IndexType::kInt64);
  check_present(call, "block_mapping", mapping.data, mapping.dim(0));
}

// Every pair inside the blocks of the caches named: sources < src_blocks,
// destinations < dst_blocks.
void check_mapping_fits(const char* call, const IndexView& mapping, std::int64_t src_blocks,
                        const std::string& src_name, std::int64_t dst_blocks,
                        const std::string& dst_name) {
  for (std::int64_t i = 0; i < mapping.dim(0); ++i)
    for (std::int64_t col = 0; col < 2; ++col) {
      const std::int64_t limit = col == 0 ? src_blocks : dst_blocks;
      require(mapping.at(i, col) >= 0 && mapping.at(i, col) < limit, call, ": block_mapping[", i,
              "][", col, "] = ", mapping.at(i, col), " is outside [0, ", limit, ") (the blocks of ",
              col == 0 ? src_name : dst_name, ")");
    }
}

// Destinations distinct and, within one cache, never also a source (the
// result would depend on the copy order).
void check_mapping_disjoint(const char* call, const IndexView& mapping, bool same_cache) {
  std::vector<std::int64_t> sources, destinations;
  for (std::int64_t i = 0; i < mapping.dim(0); ++i) {
    sources.push_back(mapping.at(i, 0));
    destinations.push_back(mapping.at(i, 1));
  }
  std::sort(destinations.begin(), destinations.end());
  const auto repeated = std::adjacent_find(destinations.begin(), destinations.end());
  require(repeated == destinations.end(), call, ": block_mapping: destination block ",
          repeated == destinations.end() ? 0 : *repeated, " appears more than once");
  if (!same_cache) return;
  std::sort(sources.begin(), sources.end());
  for (std::int64_t d : destinations)
    require(!std::binary_search(sources.begin(), sources.end(), d), call, ": block_mapping: block ",
            d, " is both a source and a destination");
}

std::string indexed(const char* name, std::size_t index) {
  return detail::concat(name, "[", index, "]");
}

}  // namespace

ForwardAttention validate_decode(const char* call, const ForwardDecodeParams& p,
                                 Validation validation, RaggedBatch& batch) {
  const CacheShape cache = check_query_and_caches(call, p.query, p.output, p.kv);
  require(p.num_kv_heads == cache.num_kv_heads, call, ": num_kv_heads = ", p.num_kv_heads,
          " differs from the caches' ", cache.num_kv_heads);
  const std::int64_t seqs = p.query.dim(0), hq = p.query.dim(1);
  check_shape(call, "seq_lens", p.seq_lens, {seqs});
  check_sequences(call, p.block_tables, p.seq_lens, cache, validation, batch);
  if (validation == Validation::kFull)
    for (std::int32_t b = 0; b < static_cast<std::int32_t>(seqs); ++b)
      check_length(call, "seq_lens", b, p.seq_lens.at(b), p.max_seq_len, "max_seq_len");
  check_finite(call, "scale", p.scale);
  ForwardAttention a = forward_views(p.query, p.output, storage_of(p.kv, cache));
  a.options.scale = p.scale;
  a.options.alibi_slopes = checked_alibi(call, p.alibi_slopes, hq);
  // seq_lens[b] = 0: the query sees no key and its row is zeros (semantics.md).
  if (validation == Validation::kFull) one_query_each(seqs, batch);
  return a;
}

ForwardAttention validate_prefix(const char* call, const ForwardPrefixParams& p,
                                 Validation validation, RaggedBatch& batch) {
  const CacheShape cache = check_query_and_caches(call, p.query, p.output, p.kv);
  const std::int64_t tokens = p.query.dim(0), hq = p.query.dim(1);
  check_sequences(call, p.block_tables, p.seq_lens, cache, validation, batch);
  const std::int64_t seqs = p.seq_lens.dim(0);
  check_shape(call, "query_start_loc", p.query_start_loc, {seqs + 1});
  check_index_type(call, "query_start_loc", p.query_start_loc, IndexType::kInt32);
  check_present(call, "query_start_loc", p.query_start_loc.data, seqs + 1);
  if (validation == Validation::kFull) {
    check_offsets(call, "query_start_loc", p.query_start_loc, seqs, tokens);
    batch.qo_indptr.resize(static_cast<std::size_t>(seqs) + 1);
    batch.qo_indptr[0] = 0;
    for (std::int32_t b = 0; b < static_cast<std::int32_t>(seqs); ++b) {
      const std::int64_t q_len = p.query_start_loc.at(b + 1) - p.query_start_loc.at(b);
      check_length(call, "query length of sequence", b, q_len, p.max_query_len, "max_query_len");
      require(q_len <= p.seq_lens.at(b), call, ": seq_lens[", b, "] = ", p.seq_lens.at(b),
              " is less than its query length ", q_len);
      batch.qo_indptr[static_cast<std::size_t>(b) + 1] =
          static_cast<std::int32_t>(p.query_start_loc.at(b + 1));
    }
  }
  ForwardAttention a = forward_views(p.query, p.output, storage_of(p.kv, cache));
  if (p.scale) {
    check_finite(call, "scale", *p.scale);
    a.options.scale = *p.scale;
  }
  if (p.sliding_window) {
    require(*p.sliding_window >= 1, call, ": sliding_window = ", *p.sliding_window,
            " must be >= 1 (or absent)");
    a.options.window_left = *p.sliding_window - 1;  // W keys: the query's own and W - 1 before
  }
  a.options.alibi_slopes = checked_alibi(call, p.alibi_slopes, hq);
  return a;
}

AppendParams validate_write(const char* call, const WriteToPagedCacheParams& p,
                            Validation validation, std::vector<std::int64_t>& slots) {
  check_rank(call, "key", p.key.rank, 3);
  check_activation_dtype(call, "key", p.key);
  const CacheShape cache = check_caches(call, p.kv, p.key.dtype);
  const std::int64_t tokens = p.key.dim(0);
  check_heads_tensor(call, "key", p.key, tokens, cache.num_kv_heads, cache.head_dim, p.key.dtype);
  check_heads_tensor(call, "value", p.value, tokens, cache.num_kv_heads, cache.head_dim,
                     p.key.dtype);
  check_rank(call, "slot_mapping", p.slot_mapping.rank, 1);
  check_index_type(call, "slot_mapping", p.slot_mapping, IndexType::kInt64);
  const std::int64_t n = p.slot_mapping.dim(0);
  require(n <= tokens, call, ": slot_mapping has ", n, " entries but key has ", tokens, " tokens");
  check_present(call, "slot_mapping", p.slot_mapping.data, n);
  if (validation == Validation::kFull) {
    check_slots(call, "slot_mapping", p.slot_mapping, n, cache.num_blocks * cache.block_size);
    slots.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = p.slot_mapping.at(i);
  }
  return {head_tensor(p.key, p.key.stride(0), p.key.stride(1)),
          head_tensor(p.value, p.value.stride(0), p.value.stride(1)), nullptr,
          static_cast<std::int32_t>(n), storage_of(p.kv, cache)};
}

std::vector<PagedKVStorage> validate_copy_blocks(const char* call, const CopyBlocksParams& p,
                                                 Validation validation) {
  const std::size_t layers = p.key_caches.size();
  require(p.value_caches.size() == layers, call, ": ", layers, " key caches but ",
          p.value_caches.size(), " value caches");
  for (const auto& [scales, name] :
       {std::pair{p.key_scales, "key_scales"}, std::pair{p.value_scales, "value_scales"}})
    require(scales.empty() || scales.size() == layers, call, ": ", name, " has ", scales.size(),
            " entries for ", layers, " layers (give none, or one per layer)");
  check_mapping(call, p.block_mapping);
  if (validation == Validation::kFull)
    check_mapping_disjoint(call, p.block_mapping, /*same_cache=*/true);
  // Every layer is checked before the first block moves: a bad layer 3
  // must not leave layers 0..2 already copied.
  std::vector<PagedKVStorage> storages;
  for (std::size_t layer = 0; layer < layers; ++layer)
    for (const auto& [caches, all_scales, cache_kind, scale_kind] :
         {std::tuple{p.key_caches, p.key_scales, "key_caches", "key_scales"},
          std::tuple{p.value_caches, p.value_scales, "value_caches", "value_scales"}}) {
      const TensorView& cache = caches[layer];
      const std::string name = indexed(cache_kind, layer);
      const CacheShape s = check_block_tensor(call, name, cache, p.layout);
      if (validation == Validation::kFull)
        check_mapping_fits(call, p.block_mapping, s.num_blocks, name, s.num_blocks, name);
      float* scales =
          check_block_scales(call, indexed(scale_kind, layer),
                             all_scales.empty() ? nullptr : &all_scales[layer], name, cache, s);
      storages.push_back(block_storage(cache, p.layout, s, scales));
    }
  return storages;
}

SwapStorages validate_swap_blocks(const char* call, const SwapBlocksParams& p,
                                  Validation validation) {
  const CacheShape src = check_block_tensor(call, "src", p.src, p.layout);
  const CacheShape dst = check_block_tensor(call, "dst", p.dst, p.layout);
  check_shape(call, "dst", p.dst, {p.dst.dim(0), p.src.dim(1), p.src.dim(2), p.src.dim(3)});
  check_dtype(call, "dst", p.dst.dtype, p.src.dtype);
  check_mapping(call, p.block_mapping);
  if (validation == Validation::kFull) {
    check_mapping_fits(call, p.block_mapping, src.num_blocks, "src", dst.num_blocks, "dst");
    check_mapping_disjoint(call, p.block_mapping, /*same_cache=*/p.src.data == p.dst.data);
  }
  float* src_scales = check_block_scales(
      call, "src_scales", p.src_scales ? &*p.src_scales : nullptr, "src", p.src, src);
  float* dst_scales = check_block_scales(
      call, "dst_scales", p.dst_scales ? &*p.dst_scales : nullptr, "dst", p.dst, dst);
  return {block_storage(p.src, p.layout, src, src_scales),
          block_storage(p.dst, p.layout, dst, dst_scales)};
}

std::vector<std::pair<std::int64_t, std::int64_t>> block_pairs(const IndexView& mapping) {
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs(
      static_cast<std::size_t>(mapping.dim(0)));
  for (std::int64_t i = 0; i < mapping.dim(0); ++i)
    pairs[static_cast<std::size_t>(i)] = {mapping.at(i, 0), mapping.at(i, 1)};
  return pairs;
}

}  // namespace internal

namespace {

using namespace internal;

// A validated forward over the CPU kernels.
void attend(const ForwardAttention& a, const IndexView& block_tables, OpScratch& scratch) {
  scratch.batch.gather_pages(block_tables, a.kv.page_size);
  run_attention(a.q, a.o, a.num_qo_heads, a.kv, a.options, scratch);
}

}  // namespace

void forward_decode(const ForwardDecodeParams& p) {
  OpScratch& scratch = thread_scratch();
  const ForwardAttention a =
      validate_decode("vllm::forward_decode", p, Validation::kFull, scratch.batch);
  attend(a, p.block_tables, scratch);
}

void mla_decode_kvcache(const MlaDecodeParams& p) {
  constexpr const char* kCall = "vllm::mla_decode_kvcache";
  OpScratch& scratch = thread_scratch();
  check_rank(kCall, "query", p.query.rank, 3);
  check_activation_dtype(kCall, "query", p.query);
  check_rank(kCall, "kv_cache", p.kv_cache.rank, 3);
  check_rows_contiguous(kCall, "kv_cache", p.kv_cache);
  CacheShape cache;
  cache.num_blocks = p.kv_cache.dim(0);
  cache.block_size = checked_int32(kCall, "block_size", p.kv_cache.dim(1));
  cache.head_dim = checked_int32(kCall, "kv_cache row width", p.kv_cache.dim(2));
  cache.num_kv_heads = 1;
  checked_int32(kCall, "num_blocks", cache.num_blocks);
  require(cache.num_blocks >= 1 && cache.block_size >= 1 && cache.head_dim >= 1, kCall,
          ": kv_cache extents must all be >= 1");
  check_present(kCall, "kv_cache", p.kv_cache.data, 1);
  const DType dtype = cache_dtype_of(kCall, p.kv_cache_dtype, p.query.dtype);
  check_dtype(kCall, "kv_cache", p.kv_cache.dtype, dtype);
  if (is_fp8(dtype)) check_positive(kCall, "k_scale", p.k_scale);
  const std::int64_t seqs = p.query.dim(0), hq = p.query.dim(1);
  check_heads_tensor(kCall, "query", p.query, seqs, hq, cache.head_dim, p.query.dtype);
  check_rank(kCall, "output", p.output.rank, 3);
  const std::int64_t v_dim = p.output.dim(2);
  require(v_dim >= 1 && v_dim <= cache.head_dim, kCall,
          ": output's last extent (v_head_dim) = ", v_dim, " must be in [1, ", cache.head_dim,
          "], the cache rows' width");
  check_heads_tensor(kCall, "output", p.output, seqs, hq, v_dim, p.query.dtype);
  check_shape(kCall, "seq_lens", p.seq_lens, {seqs});
  check_sequences(kCall, p.block_tables, p.seq_lens, cache, Validation::kFull, scratch.batch);
  check_finite(kCall, "scale", p.scale);

  PagedKVStorage kv =
      PagedKVStorage::latent(p.kv_cache.data, dtype, KVLayout::kNHD, cache.block_size,
                             cache.head_dim, static_cast<std::int32_t>(v_dim), cache.num_blocks);
  kv.k_page_stride = kv.v_page_stride = p.kv_cache.stride(0);
  kv.k_token_stride = kv.v_token_stride = p.kv_cache.stride(1);
  kv.k_scale = p.k_scale;
  kv.share_k_scales_with_v();
  ForwardAttention a = forward_views(p.query, p.output, kv);
  a.options.scale = p.scale;
  one_query_each(seqs, scratch.batch);
  attend(a, p.block_tables, scratch);
}

void forward_prefix(const ForwardPrefixParams& p) {
  OpScratch& scratch = thread_scratch();
  const ForwardAttention a =
      validate_prefix("vllm::forward_prefix", p, Validation::kFull, scratch.batch);
  attend(a, p.block_tables, scratch);
}

void write_to_paged_cache(const WriteToPagedCacheParams& p) {
  OpScratch& scratch = thread_scratch();
  AppendParams append =
      validate_write("vllm::write_to_paged_cache", p, Validation::kFull, scratch.slots);
  append.slot_mapping = scratch.slots.data();
  append_paged_kv(append);
}

void copy_blocks(const CopyBlocksParams& p) {
  const std::vector<PagedKVStorage> storages =
      validate_copy_blocks("vllm::copy_blocks", p, Validation::kFull);
  const auto pairs = block_pairs(p.block_mapping);
  for (const PagedKVStorage& s : storages) copy_pages(s, s, pairs);
}

void swap_blocks(const SwapBlocksParams& p) {
  const SwapStorages s = validate_swap_blocks("vllm::swap_blocks", p, Validation::kFull);
  copy_pages(s.src, s.dst, block_pairs(p.block_mapping));
}

}  // namespace pagedattn::ops::vllm
