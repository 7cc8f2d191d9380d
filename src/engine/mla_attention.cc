#include "engine/mla_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "engine/product_split.h"
#include "engine/rms_norm.h"
#include "kernels/cpu/convert.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::engine {
namespace {

// y[rows][ldy] columns [0, w.out()) = x[rows][w.in()] w^T.
void project_strided(const float* x, std::int32_t rows, const WeightMatrix& w, float* y,
                     std::int32_t ldy, bool deterministic, LinearScratch& scratch) {
  linear({x, rows, w.in(), w.data(), w.out(), y, false, deterministic, w.format(), ldy}, scratch);
}

// dst[rows][width] = the `width` columns of src[rows][stride] from `column`.
void gather_columns(const float* src, std::int32_t rows, std::int64_t stride, std::int64_t column,
                    std::int32_t width, float* dst) {
  for (std::int32_t r = 0; r < rows; ++r)
    std::copy_n(src + r * stride + column, width, dst + std::int64_t{r} * width);
}

template <typename Matrix>  // WeightMatrix or StackedMatrix
void require_mla_shape(const Matrix& m, const std::string& name, std::int64_t layer,
                       std::int32_t out, std::int32_t in) {
  require(m.out() == out && m.in() == in, "LlamaModel: ", name, " of layer ", layer, " is ",
          m.out(), " x ", m.in(), ", the config needs ", out, " x ", in);
}

void require_mla_length(const std::vector<float>& v, const char* name, std::int64_t layer,
                        std::int32_t want) {
  require(std::ssize(v) == want, "LlamaModel: ", name, " of layer ", layer, " has ", v.size(),
          " weights, the config needs ", want);
}

// y[tokens][ldy] columns [h * y_width, + out) = head h's x (columns [h *
// x_width, + in) of x[tokens][heads * x_width]) times weights(h)^T, for
// every head: one product each, split over the threads all at once
// (`split`, made by size_step), a decode step's heads being one row each
// and too small to split alone. Each thread gathers its heads' columns
// into its own slice of m.head_in.
template <typename Weights>
void per_head_products(const MlaShape& s, std::int32_t tokens, const float* x, std::int32_t x_width,
                       Weights&& weights, const ProductSplit& split, float* y, std::int32_t y_width,
                       std::int32_t ldy, bool deterministic, MlaScratch& m) {
  const std::size_t slice = std::size_t(tokens) * std::size_t(weights(0).in());
  const std::int64_t x_stride = std::int64_t{s.heads} * x_width;
  run_pieces(split, m.thread_scratch, [&](const ProductPiece& p, LinearScratch& ls) {
    const WeightMatrix& w = weights(p.product);
    const float* head_x = x + std::int64_t{p.product} * x_width;
    if (tokens > 1) {  // one row is in place already
      float* mine = m.head_in.data() + slice * std::size_t(p.thread);
      gather_columns(x, tokens, x_stride, std::int64_t{p.product} * x_width, w.in(), mine);
      head_x = mine;
    }
    const LinearArgs whole{
        head_x, tokens,        w.in(),     w.data(), w.out(), y + std::int64_t{p.product} * y_width,
        false,  deterministic, w.format(), ldy};
    linear(column_range(whole, p.columns), ls);
  });
}

// The absorbed nope part W_UK_h^T q_nope_h of each head's query row in
// m.query [tokens][heads][kv_lora_rank + rope].
void absorbed_queries(const MlaShape& s, const MlaLayerWeights& w, std::int32_t tokens,
                      bool deterministic, MlaScratch& m) {
  const std::int32_t d = s.cache_head_dim(), query_stride = s.heads * d;
  per_head_products(
      s, tokens, m.q.data(), s.nope + s.rope,
      [&](std::int32_t h) -> const WeightMatrix& { return w.k_absorb[std::size_t(h)]; },
      m.absorb_split, m.query.data(), d, query_stride, deterministic, m);
}

// m.q[tokens][query_width] and the cache rows m.rows[tokens][kv_lora_rank +
// rope] = [rms_norm(c) | k_pe] (unrotated) from the normed hidden states x:
// the input projection, each token's norms (and the query bottleneck's
// product), split over the team's threads inside one.
void project_inputs(const MlaShape& s, const MlaLayerWeights& w, const float* x,
                    std::int32_t tokens, bool deterministic, MlaScratch& m, LinearScratch& ls) {
  w.input.project(x, tokens, m.input.data(), false, deterministic, ls);
  const std::int32_t query_in = s.q_lora_rank > 0 ? s.q_lora_rank : s.query_width();
  const std::int64_t stride = query_in + s.kv_lora_rank + s.rope, d = s.cache_head_dim();
  core::for_row_ranges(tokens, stride, [&](std::int32_t begin, std::int32_t end) {
    for (std::int32_t t = begin; t < end; ++t) {
      const float* in = m.input.data() + t * stride;
      if (s.q_lora_rank > 0)
        rms_norm_rows(in, 1, s.q_lora_rank, w.q_a_norm.data(), s.rms_norm_eps,
                      m.q_a.data() + std::int64_t{t} * s.q_lora_rank);
      else
        std::copy_n(in, s.query_width(), m.q.data() + std::int64_t{t} * s.query_width());
      float* row = m.rows.data() + t * d;
      rms_norm_rows(in + query_in, 1, s.kv_lora_rank, w.kv_a_norm.data(), s.rms_norm_eps, row);
      std::copy_n(in + query_in + s.kv_lora_rank, s.rope, row + s.kv_lora_rank);
    }
  });
  if (s.q_lora_rank > 0)
    project_strided(m.q_a.data(), tokens, w.q_b, m.q.data(), 0, deterministic, ls);
}

// Tokens [begin, end): the RoPE parts of the queries (m.q, and copied into
// m.query after each head's latent for the absorbed form) and of the cache
// rows rotated.
void rotate_rope_parts(const MlaShape& s, MlaForm form, std::int32_t begin, std::int32_t end,
                       const std::int32_t* positions, const RopeConfig& rope, MlaScratch& m) {
  const std::int32_t head_q = s.nope + s.rope, d = s.cache_head_dim(), latent = s.kv_lora_rank;
  const std::int64_t q_stride = s.query_width(), query_stride = std::int64_t{s.heads} * d;
  const std::int32_t tokens = end - begin;
  if (form == MlaForm::kExpanded) {
    apply_rope({m.q.data() + begin * q_stride + s.nope, DType::kF32, q_stride, head_q}, tokens,
               s.heads, s.rope, positions + begin, rope);
  } else {
    for (std::int32_t t = begin; t < end; ++t)
      for (std::int32_t h = 0; h < s.heads; ++h)
        std::copy_n(m.q.data() + t * q_stride + std::int64_t{h} * head_q + s.nope, s.rope,
                    m.query.data() + t * query_stride + std::int64_t{h} * d + latent);
    // The RoPE parts sit after the latent in every query head and cache row.
    apply_rope({m.query.data() + begin * query_stride + latent, DType::kF32, query_stride, d},
               tokens, s.heads, s.rope, positions + begin, rope);
  }
  apply_rope({m.rows.data() + std::int64_t{begin} * d + latent, DType::kF32, d, d}, tokens, 1,
             s.rope, positions + begin, rope);
}

// The absorbed form over the step's projections: the queries' absorbed and
// rotated parts, then per token range rows_done(begin, end) once its cache
// rows are rotated, then attend() (into m.attention), then each head's
// latent output up-projected into values.
template <typename RowsDone, typename Attend>
void absorbed_attention(const MlaShape& s, const MlaLayerWeights& w, std::int32_t tokens,
                        const std::int32_t* positions, const RopeConfig& rope, float* values,
                        bool deterministic, MlaScratch& m, RowsDone&& rows_done, Attend&& attend) {
  absorbed_queries(s, w, tokens, deterministic, m);
  core::for_row_ranges(tokens, std::int64_t{s.heads} * s.rope,
                       [&](std::int32_t begin, std::int32_t end) {
                         rotate_rope_parts(s, MlaForm::kAbsorbed, begin, end, positions, rope, m);
                         rows_done(begin, end);
                       });
  attend();
  const std::int32_t values_stride = s.heads * s.v_head_dim;
  per_head_products(
      s, tokens, m.attention.data(), s.kv_lora_rank,
      [&](std::int32_t h) -> const WeightMatrix& { return w.v_up[std::size_t(h)]; }, m.values_split,
      values, s.v_head_dim, values_stride, deterministic, m);
}

// ------------------------------------------------------------ expanded form

// The step's [c | k_pe] rows (rope part rotated) into the cache's pages of
// `layer`, as cache.attention would append them.
void append_rows(const MlaShape& s, std::int32_t layer, PagedKVCache& cache, MlaScratch& m) {
  const BatchPlan& plan = cache.plan();
  const std::int32_t d = s.cache_head_dim();
  const HeadTensor rows{m.rows.data(), DType::kF32, d, d};
  const bool latent_layout = cache.config().attention_kind == AttentionKind::kMLA;
  append_paged_kv({rows, latent_layout ? HeadTensor{} : rows, plan.slot_mapping.data(),
                   plan.num_tokens(), cache.layer_storage(layer)});
  cache.mark_layer_appended(layer);
}

// m.cached[keys][kv_lora_rank + rope] = sequence b's cached rows as f32,
// and where the layout keeps V apart (a copy of each row's latent, rounded
// on its own: int8 scales it by its own maximum) m.cached_v[keys][latent],
// so that the values are expanded from what the absorbed form reads.
void read_cached_rows(const PagedKVStorage& kv, const BatchPlan& plan, std::int32_t b,
                      MlaScratch& m) {
  const std::int32_t keys = plan.kv_lens[std::size_t(b)], ps = plan.page_size;
  const auto d = static_cast<std::int64_t>(kv.head_dim);
  const auto dv = static_cast<std::int64_t>(kv.v_head_dim);
  const auto element = static_cast<std::int64_t>(dtype_size(kv.dtype));
  const auto* k_bytes = static_cast<const std::byte*>(kv.k_data);
  const auto* v_bytes = static_cast<const std::byte*>(kv.v_data);
  m.cached.resize(std::size_t(keys) * std::size_t(d));
  if (!kv.v_in_k) m.cached_v.resize(std::size_t(keys) * std::size_t(dv));
  for (std::int32_t j = 0; j < keys; ++j) {
    const std::int64_t page = plan.kv_indices[std::size_t(plan.kv_indptr[std::size_t(b)] + j / ps)];
    const std::int32_t slot = j % ps;
    kernels::convert_row(k_bytes + kv.k_offset(page, 0, slot) * element, kv.dtype,
                         m.cached.data() + j * d, DType::kF32, d, kv.k_dequant(page, 0, slot));
    if (!kv.v_in_k)
      kernels::convert_row(v_bytes + kv.v_offset(page, 0, slot) * element, kv.dtype,
                           m.cached_v.data() + j * dv, DType::kF32, dv,
                           kv.v_dequant(page, 0, slot));
  }
}

// m.k_up_heads[h] = W_UK_h^T as f32 [kv_lora_rank][nope], for every head:
// the weights themselves where they are f32, else dequantised into m.k_up.
void key_up_projections(const MlaShape& s, const MlaLayerWeights& w, MlaScratch& m) {
  const std::size_t per_head = std::size_t(s.kv_lora_rank) * std::size_t(s.nope);
  m.k_up_heads.resize(std::size_t(s.heads));
  for (std::int32_t h = 0; h < s.heads; ++h) {
    const WeightMatrix& k = w.k_absorb[std::size_t(h)];
    if (k.format() == WeightFormat::kF32) {
      m.k_up_heads[std::size_t(h)] = static_cast<const float*>(k.data());
      continue;
    }
    m.k_up.resize(per_head * std::size_t(s.heads));
    float* dst = m.k_up.data() + per_head * std::size_t(h);
    dequantize_weight_rows(k.data(), k.format(), k.in(), 0, k.out(), dst);
    m.k_up_heads[std::size_t(h)] = dst;
  }
}

// Below this many multiply-adds per head the key expansion runs on one thread.
constexpr std::int64_t kParallelUp = std::int64_t{1} << 20;

// A sequence's keys [W_UK_h c | k_pe] and values W_UV_h c for every head
// from its cached rows (m.cached, and m.cached_v unless v_in_k), into its
// pages of m.keys / m.values (token stride heads x dim).
void expand_sequence(const MlaShape& s, const MlaLayerWeights& w, std::int32_t keys, bool v_in_k,
                     float* k, float* v, MlaScratch& m, LinearScratch& ls) {
  const std::int32_t d = s.cache_head_dim(), latent = s.kv_lora_rank, dk = s.nope + s.rope;
  const std::int64_t k_stride = std::int64_t{s.heads} * dk;
  const auto v_stride = static_cast<std::int32_t>(std::int64_t{s.heads} * s.v_head_dim);
  m.latent.resize(std::size_t(keys) * std::size_t(latent));
  gather_columns(m.cached.data(), keys, d, 0, latent, m.latent.data());
  const float* value_latent = v_in_k ? m.latent.data() : m.cached_v.data();
  for (std::int32_t h = 0; h < s.heads; ++h)
    project_strided(value_latent, keys, w.v_up[std::size_t(h)], v + std::int64_t{h} * s.v_head_dim,
                    v_stride, false, ls);
  const std::size_t per_head = std::size_t(latent) * std::size_t(s.nope);
  const bool parallel = std::int64_t{keys} * std::int64_t(per_head) >= kParallelUp;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int32_t h = 0; h < s.heads; ++h)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, keys, s.nope, latent, 1.0f,
                m.latent.data(), latent, m.k_up_heads[std::size_t(h)], s.nope, 0.0f,
                k + std::int64_t{h} * dk, static_cast<int>(k_stride));
  for (std::int32_t t = 0; t < keys; ++t)
    for (std::int32_t h = 0; h < s.heads; ++h)
      std::copy_n(m.cached.data() + std::int64_t{t} * d + latent, s.rope,
                  k + t * k_stride + std::int64_t{h} * dk + s.nope);
}

// m.keys / m.values as pages of `page_size` tokens x every head (NHD).
PagedKVStorage expanded_storage(const MlaShape& s, std::int32_t page_size, std::int32_t pages,
                                MlaScratch& m) {
  const std::int32_t dk = s.nope + s.rope, dv = s.v_head_dim;
  PagedKVStorage kv;
  kv.k_data = m.keys.data();
  kv.v_data = m.values.data();
  kv.layout = KVLayout::kNHD;
  kv.page_size = page_size;
  kv.num_kv_heads = s.heads;
  kv.head_dim = dk;
  kv.v_head_dim = dv;
  kv.num_pages = pages;
  kv.k_token_stride = std::int64_t{s.heads} * dk, kv.k_head_stride = dk;
  kv.k_page_stride = kv.k_token_stride * page_size;
  kv.v_token_stride = std::int64_t{s.heads} * dv, kv.v_head_stride = dv;
  kv.v_page_stride = kv.v_token_stride * page_size;
  return kv;
}

// The step's queries against the expanded pages: the plan's query offsets
// and key counts over m's page table.
PagedKVTable expanded_table(const BatchPlan& plan, const MlaScratch& m) {
  PagedKVTable table;
  table.batch_size = plan.batch_size();
  table.page_size = plan.page_size;
  table.qo_indptr = plan.qo_indptr.data();
  table.kv_indptr = m.kv_indptr.data();
  table.kv_indices = m.kv_indices.data();
  table.kv_last_page_len = m.last_page_len.data();
  table.kv_lens = plan.kv_lens.data();
  return table;
}

// Multi-head attention of the unabsorbed queries m.q (rope part rotated)
// over every sequence's expanded keys and values; values[tokens][heads *
// v_head_dim]. The step's rows are already in the cache.
void expanded_attention(const MlaShape& s, const MlaLayerWeights& w, std::int32_t layer,
                        const AttentionOptions& options, const PagedKVCache& cache, float* values,
                        MlaScratch& m, LinearScratch& ls) {
  const BatchPlan& plan = cache.plan();
  const std::int32_t ps = plan.page_size, dk = s.nope + s.rope, dv = s.v_head_dim;
  m.kv_indptr.assign(1, 0);
  m.last_page_len.clear();
  for (std::int32_t b = 0; b < plan.batch_size(); ++b) {
    const std::int32_t keys = plan.kv_lens[std::size_t(b)], pages = (keys + ps - 1) / ps;
    m.kv_indptr.push_back(m.kv_indptr.back() + pages);
    m.last_page_len.push_back(keys - (pages > 0 ? (pages - 1) * ps : 0));
  }
  const std::int32_t total_pages = m.kv_indptr.back();
  m.kv_indices.resize(std::size_t(total_pages));
  std::iota(m.kv_indices.begin(), m.kv_indices.end(), 0);
  const std::size_t page_slots = std::size_t(ps) * std::size_t(s.heads);
  m.keys.resize(std::size_t(total_pages) * page_slots * std::size_t(dk));
  m.values.resize(std::size_t(total_pages) * page_slots * std::size_t(dv));
  key_up_projections(s, w, m);
  const PagedKVStorage rows = cache.layer_storage(layer);
  for (std::int32_t b = 0; b < plan.batch_size(); ++b) {
    if (plan.kv_lens[std::size_t(b)] == 0) continue;
    read_cached_rows(rows, plan, b, m);
    const std::size_t first = std::size_t(m.kv_indptr[std::size_t(b)]) * page_slots;
    expand_sequence(s, w, plan.kv_lens[std::size_t(b)], rows.v_in_k, m.keys.data() + first * dk,
                    m.values.data() + first * dv, m, ls);
  }
  AttentionParams p;
  p.q = {m.q.data(), DType::kF32, std::int64_t{s.heads} * dk, dk};
  p.o = {values, DType::kF32, std::int64_t{s.heads} * dv, dv};
  p.num_qo_heads = s.heads;
  p.table = expanded_table(plan, m);
  p.kv = expanded_storage(s, ps, total_pages, m);
  p.options = options;
  m.runner.run(p);
  // A long prompt's expansion is not kept for the decode steps after it.
  if (m.keys.size() + m.values.size() > (std::size_t(64) << 20) / sizeof(float)) {
    m.keys = {};
    m.values = {};
  }
}

}  // namespace

MlaForm mla_form(const MlaShape& s, const BatchPlan& plan, bool deterministic) {
  if (deterministic || plan.has_tree || plan.has_gaps) return MlaForm::kAbsorbed;
  const double heads = s.heads, up = double(s.kv_lora_rank) * (s.nope + s.v_head_dim);
  double absorbed = 0.0, expanded = 0.0, bytes = 0.0;
  for (std::int32_t b = 0; b < plan.batch_size(); ++b) {
    const double q = plan.qo_indptr[std::size_t(b) + 1] - plan.qo_indptr[std::size_t(b)];
    const double keys = plan.kv_lens[std::size_t(b)];
    const double pairs = q * keys - q * (q - 1.0) / 2.0;  // causal
    absorbed += heads * (pairs * (2.0 * s.kv_lora_rank + s.rope) + q * up);
    expanded += heads * (pairs * (s.nope + s.rope + s.v_head_dim) + keys * up);
    bytes += 4.0 * (keys + plan.page_size) * heads * (s.nope + s.rope + s.v_head_dim);
  }
  return expanded < absorbed && bytes <= double(kMlaExpandedBytes) ? MlaForm::kExpanded
                                                                   : MlaForm::kAbsorbed;
}

MlaShape mla_shape(const LlamaConfig& c) {
  MlaShape s;
  s.hidden = c.hidden_size;
  s.heads = c.num_qo_heads / c.shard.size;  // this tensor-parallel shard's heads
  s.q_lora_rank = c.q_lora_rank;
  s.kv_lora_rank = c.kv_lora_rank;
  s.nope = c.qk_nope_head_dim;
  s.rope = c.rotary_dim;
  s.v_head_dim = c.v_head_dim;
  s.rms_norm_eps = c.rms_norm_eps;
  return s;
}

void validate_mla_config(const LlamaConfig& c) {
  if (c.kv_lora_rank == 0) {
    require(c.q_lora_rank == 0 && c.qk_nope_head_dim == 0 && c.v_head_dim == 0,
            "LlamaConfig.kv_lora_rank = 0 (no latent attention) but q_lora_rank = ", c.q_lora_rank,
            ", qk_nope_head_dim = ", c.qk_nope_head_dim, ", v_head_dim = ", c.v_head_dim,
            " (must all be 0)");
    return;
  }
  require(c.kv_lora_rank > 0 && c.q_lora_rank >= 0 && c.qk_nope_head_dim >= 1 &&
              c.v_head_dim >= 1 && c.rotary_dim >= 2,
          "LlamaConfig: latent attention needs kv_lora_rank = ", c.kv_lora_rank,
          " > 0, q_lora_rank = ", c.q_lora_rank, " >= 0, qk_nope_head_dim = ", c.qk_nope_head_dim,
          " >= 1, v_head_dim = ", c.v_head_dim, " >= 1 and rotary_dim = ", c.rotary_dim, " >= 2");
  require(c.num_kv_heads == 1 && c.head_dim == c.kv_lora_rank + c.rotary_dim,
          "LlamaConfig: latent attention caches one KV head of kv_lora_rank + rotary_dim = ",
          c.kv_lora_rank + c.rotary_dim, " but num_kv_heads = ", c.num_kv_heads,
          " and head_dim = ", c.head_dim);
  require(std::all_of(c.layer_windows.begin(), c.layer_windows.end(),
                      [](std::int32_t w) { return w == 0; }) &&
              !c.qk_norm,
          "LlamaConfig: latent attention has no sliding windows or q/k norms");
}

void validate_mla_weights(const MlaShape& s, const MlaLayerWeights& w, std::int64_t layer) {
  const std::int32_t query_in = s.q_lora_rank > 0 ? s.q_lora_rank : s.query_width();
  require_mla_shape(w.input, "the q / q_a and kv_a projections", layer,
                    query_in + s.kv_lora_rank + s.rope, s.hidden);
  require_mla_length(w.q_a_norm, "attn_q_a_norm", layer, s.q_lora_rank);
  if (s.q_lora_rank > 0)
    require_mla_shape(w.q_b, "attn_q_b", layer, s.query_width(), s.q_lora_rank);
  else
    require(w.q_b.empty(), "LlamaModel: layer ", layer, " has attn_q_b, q_lora_rank is 0");
  require_mla_length(w.kv_a_norm, "attn_kv_a_norm", layer, s.kv_lora_rank);
  require(std::ssize(w.k_absorb) == s.heads && std::ssize(w.v_up) == s.heads, "LlamaModel: layer ",
          layer, " has ", w.k_absorb.size(), " key and ", w.v_up.size(),
          " value up-projections, the config has ", s.heads, " heads");
  for (std::int32_t h = 0; h < s.heads; ++h) {
    require_mla_shape(w.k_absorb[std::size_t(h)], "attn_k_b of head " + std::to_string(h), layer,
                      s.kv_lora_rank, s.nope);
    require_mla_shape(w.v_up[std::size_t(h)], "attn_v_b of head " + std::to_string(h), layer,
                      s.v_head_dim, s.kv_lora_rank);
  }
}

void size_step(const MlaShape& s, std::int32_t tokens, MlaForm form, std::int32_t threads,
               bool deterministic, MlaScratch& m) {
  const auto t = std::size_t(tokens);
  const std::int32_t query_in = s.q_lora_rank > 0 ? s.q_lora_rank : s.query_width();
  m.input.resize(t * std::size_t(query_in + s.kv_lora_rank + s.rope));
  m.q_a.resize(t * std::size_t(s.q_lora_rank));
  m.q.resize(t * std::size_t(s.query_width()));
  m.rows.resize(t * std::size_t(s.cache_head_dim()));
  if (form == MlaForm::kExpanded) return;
  m.query.resize(t * std::size_t(s.heads) * std::size_t(s.cache_head_dim()));
  m.attention.resize(t * std::size_t(s.heads) * std::size_t(s.kv_lora_rank));
  if (std::ssize(m.heads) != s.heads) {
    m.heads.resize(std::size_t(s.heads));
    std::iota(m.heads.begin(), m.heads.end(), 0);
  }
  // Every layer's heads have these shapes (validate_mla_weights): W_UK^T
  // nope -> kv_lora_rank, W_UV kv_lora_rank -> v_head_dim.
  const std::int32_t granule = product_split_granule(deterministic);
  const auto rows_of = [&](std::int32_t) { return tokens; };
  split_products(
      m.heads, rows_of, [&](std::int32_t) { return std::span(&s.kv_lora_rank, 1); }, granule,
      threads, m.absorb_split);
  split_products(
      m.heads, rows_of, [&](std::int32_t) { return std::span(&s.v_head_dim, 1); }, granule, threads,
      m.values_split);
  // Each thread's gathered columns of one head: W_UK^T's nope or W_UV's latent.
  if (tokens > 1)
    m.head_in.resize(t * std::size_t(std::max(s.nope, s.kv_lora_rank)) * std::size_t(threads));
  m.thread_scratch.resize(std::size_t(threads));
}

TeamAttention::Tensors latent_team_tensors(const MlaShape& s, const KVCacheConfig& cache,
                                           MlaScratch& m) {
  const std::int32_t d = s.cache_head_dim(), latent = s.kv_lora_rank;
  const HeadTensor rows{m.rows.data(), DType::kF32, d, d};
  // The value is the first kv_lora_rank elements of the same rows: an MLA
  // cache layout reads it from K (and takes no v), a multi-query layout
  // keeps its own copy.
  const bool latent_layout = cache.attention_kind == AttentionKind::kMLA;
  return {{m.query.data(), DType::kF32, std::int64_t{s.heads} * d, d},
          rows,
          latent_layout ? HeadTensor{} : rows,
          {m.attention.data(), DType::kF32, std::int64_t{s.heads} * latent, latent}};
}

void mla_attention_in_team(const MlaShape& s, const MlaLayerWeights& w, const float* x,
                           std::int32_t tokens, std::int32_t layer, const std::int32_t* positions,
                           const RopeConfig& rope, TeamAttention& attention, float* values,
                           bool deterministic, MlaScratch& m, LinearScratch& ls) {
  project_inputs(s, w, x, tokens, deterministic, m, ls);
  absorbed_attention(
      s, w, tokens, positions, rope, values, deterministic, m,
      [&](std::int32_t begin, std::int32_t end) { attention.append(layer, begin, end); },
      [&] { attention.attend(layer); });
}

void mla_attention(const MlaShape& s, const MlaLayerWeights& w, const float* x, std::int32_t tokens,
                   std::int32_t layer, const std::int32_t* positions, const RopeConfig& rope,
                   const AttentionOptions& options, PagedKVCache& cache, float* values,
                   bool deterministic, MlaForm form, MlaScratch& m, LinearScratch& ls) {
  require(tokens >= 0, "mla_attention: tokens = ", tokens, " must be >= 0");
  validate_mla_weights(s, w, layer);
  size_step(s, tokens, form, core::available_threads(), deterministic, m);
  project_inputs(s, w, x, tokens, deterministic, m, ls);
  if (form == MlaForm::kExpanded) {
    rotate_rope_parts(s, form, 0, tokens, positions, rope, m);
    append_rows(s, layer, cache, m);
    return expanded_attention(s, w, layer, options, cache, values, m, ls);
  }
  const TeamAttention::Tensors t = latent_team_tensors(s, cache.config(), m);
  absorbed_attention(
      s, w, tokens, positions, rope, values, deterministic, m, [](std::int32_t, std::int32_t) {},
      [&] { cache.attention(layer, t.q, t.k, t.v, t.out, options); });
}

}  // namespace pagedattn::engine
