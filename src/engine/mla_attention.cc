#include "engine/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

// out[width] = row / rms(row) * weight.
void rms_norm_row(const float* row, std::int32_t width, const std::vector<float>& weight, float eps,
                  float* out) {
  float sum = 0.0f;
  for (std::int32_t i = 0; i < width; ++i) sum += row[i] * row[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
  for (std::int32_t i = 0; i < width; ++i) out[i] = row[i] * inv * weight[std::size_t(i)];
}

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

// The step's query rows [tokens][heads][kv_lora_rank + rope]: each head's
// absorbed nope part W_UK_h^T q_nope_h, then its RoPE part (unrotated).
void absorbed_queries(const MlaShape& s, const MlaLayerWeights& w, std::int32_t tokens,
                      bool deterministic, MlaScratch& m, LinearScratch& ls) {
  const std::int32_t head_q = s.nope + s.rope, d = s.cache_head_dim();
  const std::int64_t q_stride = s.query_width(), query_stride = std::int64_t{s.heads} * d;
  m.query.resize(std::size_t(tokens) * std::size_t(query_stride));
  m.head_in.resize(std::size_t(tokens) * std::size_t(std::max(s.nope, s.kv_lora_rank)));
  for (std::int32_t h = 0; h < s.heads; ++h) {
    gather_columns(m.q.data(), tokens, q_stride, std::int64_t{h} * head_q, s.nope,
                   m.head_in.data());
    project_strided(m.head_in.data(), tokens, w.k_absorb[std::size_t(h)],
                    m.query.data() + std::int64_t{h} * d, static_cast<std::int32_t>(query_stride),
                    deterministic, ls);
    for (std::int32_t t = 0; t < tokens; ++t)
      std::copy_n(m.q.data() + t * q_stride + std::int64_t{h} * head_q + s.nope, s.rope,
                  m.query.data() + t * query_stride + std::int64_t{h} * d + s.kv_lora_rank);
  }
}

// m.q[tokens][query_width] and the cache rows m.rows[tokens][kv_lora_rank +
// rope] = [rms_norm(c) | k_pe] (unrotated) from m.input.
void split_projections(const MlaShape& s, const MlaLayerWeights& w, std::int32_t tokens,
                       bool deterministic, MlaScratch& m, LinearScratch& ls) {
  const std::int32_t query_in = s.q_lora_rank > 0 ? s.q_lora_rank : s.query_width();
  const std::int64_t stride = query_in + s.kv_lora_rank + s.rope, d = s.cache_head_dim();
  m.q.resize(std::size_t(tokens) * std::size_t(s.query_width()));
  if (s.q_lora_rank > 0) {
    m.q_a.resize(std::size_t(tokens) * std::size_t(s.q_lora_rank));
    for (std::int32_t t = 0; t < tokens; ++t)
      rms_norm_row(m.input.data() + t * stride, s.q_lora_rank, w.q_a_norm, s.rms_norm_eps,
                   m.q_a.data() + std::int64_t{t} * s.q_lora_rank);
    project_strided(m.q_a.data(), tokens, w.q_b, m.q.data(), 0, deterministic, ls);
  } else {
    gather_columns(m.input.data(), tokens, stride, 0, s.query_width(), m.q.data());
  }
  m.rows.resize(std::size_t(tokens) * std::size_t(d));
  for (std::int32_t t = 0; t < tokens; ++t) {
    const float* in = m.input.data() + t * stride + query_in;
    float* row = m.rows.data() + t * d;
    rms_norm_row(in, s.kv_lora_rank, w.kv_a_norm, s.rms_norm_eps, row);
    std::copy_n(in + s.kv_lora_rank, s.rope, row + s.kv_lora_rank);
  }
}

}  // namespace

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

void mla_attention(const MlaShape& s, const MlaLayerWeights& w, const float* x, std::int32_t tokens,
                   std::int32_t layer, const std::int32_t* positions, const RopeConfig& rope,
                   const AttentionOptions& options, PagedKVCache& cache, float* values,
                   bool deterministic, MlaScratch& m, LinearScratch& ls) {
  require(tokens >= 0, "mla_attention: tokens = ", tokens, " must be >= 0");
  validate_mla_weights(s, w, layer);
  const std::int32_t d = s.cache_head_dim(), latent = s.kv_lora_rank;
  m.input.resize(std::size_t(tokens) * std::size_t(w.input.out()));
  w.input.project(x, tokens, m.input.data(), false, deterministic, ls);
  split_projections(s, w, tokens, deterministic, m, ls);
  absorbed_queries(s, w, tokens, deterministic, m, ls);
  // The RoPE parts sit after the latent in every query head and cache row.
  apply_rope({m.query.data() + latent, DType::kF32, std::int64_t{s.heads} * d, d}, tokens, s.heads,
             s.rope, positions, rope);
  apply_rope({m.rows.data() + latent, DType::kF32, d, d}, tokens, 1, s.rope, positions, rope);
  // The value is the first kv_lora_rank elements of the same rows: an MLA
  // cache layout reads it from K (and takes no v), a multi-query layout
  // keeps its own copy.
  const HeadTensor rows{m.rows.data(), DType::kF32, d, d};
  const bool latent_layout = cache.config().attention_kind == AttentionKind::kMLA;
  const HeadTensor value = latent_layout ? HeadTensor{} : rows;
  m.attention.resize(std::size_t(tokens) * std::size_t(s.heads) * std::size_t(latent));
  cache.attention(layer, {m.query.data(), DType::kF32, std::int64_t{s.heads} * d, d}, rows, value,
                  {m.attention.data(), DType::kF32, std::int64_t{s.heads} * latent, latent},
                  options);
  const std::int64_t values_stride = std::int64_t{s.heads} * s.v_head_dim;
  for (std::int32_t h = 0; h < s.heads; ++h) {
    gather_columns(m.attention.data(), tokens, std::int64_t{s.heads} * latent,
                   std::int64_t{h} * latent, latent, m.head_in.data());
    project_strided(m.head_in.data(), tokens, w.v_up[std::size_t(h)],
                    values + std::int64_t{h} * s.v_head_dim,
                    static_cast<std::int32_t>(values_stride), deterministic, ls);
  }
}

}  // namespace pagedattn::engine
