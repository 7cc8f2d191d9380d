// The built-in Llama model: weights drawn from a seeded counter generator,
// forward pass over the cache's current plan.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "counter_random.h"
#include "gemm.h"
#include "llama_weights.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

using engine::linear;
using engine::LinearArgs;
using engine::LinearScratch;
using engine::LlamaLayerWeights;
using engine::LlamaWeights;
using engine::WeightMatrix;

// `count` values uniform in [-bound, bound] from stream `stream` of `seed`.
std::vector<float> uniform_weights(std::size_t count, float bound, std::uint64_t seed,
                                   std::uint64_t stream) {
  std::vector<float> w(count);
  const auto n = static_cast<std::int64_t>(count);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i)
    w[i] = static_cast<float>((2.0 * engine::counter_uniform(seed, stream, i) - 1.0) * bound);
  return w;
}

// Uniform with variance `scale^2 / fan_in` (bound sqrt(3 / fan_in) x scale).
float init_bound(std::int64_t fan_in, double scale = 1.0) {
  return static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)) * scale);
}

void validate(const LlamaConfig& c) {
  const std::pair<const char*, std::int32_t> fields[] = {{"vocab_size", c.vocab_size},
                                                         {"hidden_size", c.hidden_size},
                                                         {"intermediate_size", c.intermediate_size},
                                                         {"num_layers", c.num_layers},
                                                         {"num_qo_heads", c.num_qo_heads},
                                                         {"num_kv_heads", c.num_kv_heads},
                                                         {"head_dim", c.head_dim},
                                                         {"max_position", c.max_position}};
  for (const auto& [name, value] : fields)
    require(value >= 1, "LlamaConfig.", name, " = ", value, " must be >= 1");
  require(c.num_qo_heads % c.num_kv_heads == 0, "LlamaConfig.num_kv_heads = ", c.num_kv_heads,
          " must divide num_qo_heads = ", c.num_qo_heads);
  require(c.head_dim % 2 == 0, "LlamaConfig.head_dim = ", c.head_dim, " must be even (RoPE)");
  require(c.eos_token_id >= -1 && c.eos_token_id < c.vocab_size,
          "LlamaConfig.eos_token_id = ", c.eos_token_id,
          " is outside [-1, vocab_size = ", c.vocab_size, ")");
  require(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0.0f,
          "LlamaConfig.rms_norm_eps = ", c.rms_norm_eps, " must be > 0");
}

class LlamaModel final : public Model {
 public:
  // `weights` hold this rank's shard (shard_llama_weights).
  LlamaModel(const LlamaConfig& c, LlamaWeights weights)
      : c_(c),
        hq_(c.num_qo_heads / c.shard.size),
        hkv_(c.num_kv_heads / c.shard.size),
        inter_(c.intermediate_size / c.shard.size),
        w_(std::move(weights)) {
    validate_weights();
    spec_ = {std::string(c.name), c.num_layers,   hq_,            hkv_,              c.head_dim,
             c.vocab_size,        c.max_position, c.eos_token_id, RopeMode::kNormal, {}};
    spec_.rope.style = c.rope_style;
    spec_.rope.theta = c.rope_theta;
    spec_.rope.llama3.factor = c.llama3_rope_factor;
    engine::use_single_threaded_blas();
  }

  const ModelSpec& spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override;

 private:
  void validate_weights() const;
  void validate_batch(const ForwardBatch& batch, const PagedKVCache& cache,
                      std::span<float> logits) const;
  void attention_block(std::int32_t layer, std::int32_t tokens, bool deterministic,
                       PagedKVCache& cache);
  void mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic);
  // y[rows][w.out] (+)= x[rows][w.in] w^T
  void project(const float* x, std::int32_t rows, const WeightMatrix& w, float* y, bool accumulate,
               bool deterministic);
  // x_ += x w^T summed over the tensor-parallel ranks (each holds a slice
  // of w's input columns and of x's features).
  void add_row_parallel(const float* x, std::int32_t rows, const WeightMatrix& w,
                        bool deterministic);
  // out[t] = x[t] / rms(x[t]) * weight, for `tokens` rows of hidden_size.
  void rms_norm(const float* x, std::int32_t tokens, const std::vector<float>& weight,
                float* out) const;

  LlamaConfig c_;
  std::int32_t hq_, hkv_, inter_;  // this shard's query heads, KV heads, MLP width
  ModelSpec spec_;
  LlamaWeights w_;
  // Activations, reused across steps.
  std::vector<float> x_, h_, qkv_, attn_, gate_up_, act_, rows_, partial_;
  LinearScratch scratch_;
};

// Seeded synthetic weights (the draw order is part of the tests' contract).
LlamaWeights draw_weights(const LlamaConfig& c) {
  const std::int32_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const std::int32_t q_dim = c.num_qo_heads * d, qkv_rows = q_dim + 2 * c.num_kv_heads * d;
  const double residual = 1.0 / std::sqrt(2.0 * c.num_layers);  // keeps the residual stream O(1)
  std::uint64_t stream = 0;
  auto draw = [&](std::int32_t out, std::int32_t in, float bound) {
    return WeightMatrix::f32(
        uniform_weights(std::size_t(out) * std::size_t(in), bound, c.weight_seed, stream++), out,
        in);
  };
  LlamaWeights w;
  w.embedding = draw(c.vocab_size, h, init_bound(h));
  if (!c.tie_embeddings) w.lm_head = draw(c.vocab_size, h, init_bound(h));
  w.final_norm.assign(static_cast<std::size_t>(h), 1.0f);
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (LlamaLayerWeights& l : w.layers) {
    l.attn_norm.assign(static_cast<std::size_t>(h), 1.0f);
    l.mlp_norm.assign(static_cast<std::size_t>(h), 1.0f);
    l.qkv = draw(qkv_rows, h, init_bound(h));
    l.o = draw(h, q_dim, init_bound(q_dim, residual));
    l.gate_up = draw(2 * inter, h, init_bound(h));
    l.down = draw(h, inter, init_bound(inter, residual));
  }
  return w;
}

void require_shape(const WeightMatrix& m, const char* name, std::int64_t layer, std::int32_t out,
                   std::int32_t in) {
  require(m.out() == out && m.in() == in, "LlamaModel: ", name, layer >= 0 ? " of layer " : "",
          layer >= 0 ? std::to_string(layer) : std::string(), " is ", m.out(), " x ", m.in(),
          ", the config needs ", out, " x ", in);
}

void require_norm(const std::vector<float>& v, const char* name, std::int64_t layer,
                  std::int32_t h) {
  require(std::ssize(v) == h, "LlamaModel: ", name, " of layer ", layer, " has ", v.size(),
          " weights, the config needs ", h);
}

void LlamaModel::validate_weights() const {
  const std::int32_t h = c_.hidden_size, d = c_.head_dim, inter = inter_;
  const std::int32_t q_dim = hq_ * d, qkv_rows = q_dim + 2 * hkv_ * d;
  require_shape(w_.embedding, "the token embedding", -1, c_.vocab_size, h);
  if (!c_.tie_embeddings) require_shape(w_.lm_head, "the LM head", -1, c_.vocab_size, h);
  require_norm(w_.final_norm, "the final norm", -1, h);
  require(std::ssize(w_.layers) == c_.num_layers, "LlamaModel: ", w_.layers.size(),
          " layers of weights, the config has ", c_.num_layers);
  for (std::size_t i = 0; i < w_.layers.size(); ++i) {
    const LlamaLayerWeights& l = w_.layers[i];
    const auto layer = static_cast<std::int64_t>(i);
    require_norm(l.attn_norm, "attn_norm", layer, h);
    require_norm(l.mlp_norm, "mlp_norm", layer, h);
    require_shape(l.qkv, "qkv", layer, qkv_rows, h);
    require(l.qkv_bias.empty() || std::ssize(l.qkv_bias) == qkv_rows, "LlamaModel: qkv_bias of layer ",
            layer, " has ", l.qkv_bias.size(), " values, the config needs ", qkv_rows);
    require_shape(l.o, "attn_output", layer, h, q_dim);
    require_shape(l.gate_up, "gate_up", layer, 2 * inter, h);
    require_shape(l.down, "down", layer, h, inter);
  }
}

void LlamaModel::validate_batch(const ForwardBatch& b, const PagedKVCache& cache,
                                std::span<float> logits) const {
  const std::int32_t tokens = cache.plan().num_tokens();
  require(std::ssize(b.token_ids) == tokens, "LlamaModel::forward: token_ids has ",
          b.token_ids.size(), " entries, the cache's plan has ", tokens, " tokens");
  for (std::size_t i = 0; i < b.token_ids.size(); ++i)
    require(b.token_ids[i] >= 0 && b.token_ids[i] < c_.vocab_size,
            "LlamaModel::forward: token_ids[", i, "] = ", b.token_ids[i],
            " is outside [0, vocab_size = ", c_.vocab_size, ")");
  for (std::size_t i = 0; i < b.logit_rows.size(); ++i)
    require(b.logit_rows[i] >= 0 && b.logit_rows[i] < tokens &&
                (i == 0 || b.logit_rows[i] > b.logit_rows[i - 1]),
            "LlamaModel::forward: logit_rows[", i, "] = ", b.logit_rows[i],
            " must be ascending and in [0, ", tokens, ")");
  require(logits.size() == b.logit_rows.size() * static_cast<std::size_t>(c_.vocab_size),
          "LlamaModel::forward: logits has ", logits.size(), " floats, need ", b.logit_rows.size(),
          " x ", c_.vocab_size);
}

void LlamaModel::rms_norm(const float* x, std::int32_t tokens, const std::vector<float>& weight,
                          float* out) const {
  const std::int32_t h = c_.hidden_size;
#pragma omp parallel for schedule(static) if (tokens > 64)
  for (std::int32_t t = 0; t < tokens; ++t) {
    const float* row = x + std::size_t(t) * h;
    float sum = 0.0f;
    for (std::int32_t i = 0; i < h; ++i) sum += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(h) + c_.rms_norm_eps);
    for (std::int32_t i = 0; i < h; ++i) out[std::size_t(t) * h + i] = row[i] * inv * weight[i];
  }
}

void LlamaModel::attention_block(std::int32_t layer, std::int32_t tokens, bool deterministic,
                                 PagedKVCache& cache) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  const std::int32_t d = c_.head_dim;
  const std::int32_t q_dim = hq_ * d, qkv_dim = q_dim + 2 * hkv_ * d;
  rms_norm(x_.data(), tokens, w.attn_norm, h_.data());
  project(h_.data(), tokens, w.qkv, qkv_.data(), false, deterministic);
  if (!w.qkv_bias.empty())
    for (std::int32_t t = 0; t < tokens; ++t)
      for (std::int32_t i = 0; i < qkv_dim; ++i) qkv_[std::size_t(t) * qkv_dim + i] += w.qkv_bias[std::size_t(i)];
  cache.attention_with_fused_qkv(layer, HeadTensor{qkv_.data(), DType::kF32, qkv_dim, d},
                                 HeadTensor{attn_.data(), DType::kF32, q_dim, d});
  add_row_parallel(attn_.data(), tokens, w.o, deterministic);
}

void LlamaModel::mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  const std::int32_t inter = inter_;
  rms_norm(x_.data(), tokens, w.mlp_norm, h_.data());
  project(h_.data(), tokens, w.gate_up, gate_up_.data(), false, deterministic);
  const std::int64_t n = std::int64_t{tokens} * inter;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {  // SwiGLU: silu(gate) * up
    const std::int64_t t = i / inter, j = i % inter;
    const float g = gate_up_[std::size_t(t * 2 * inter + j)];
    const float u = gate_up_[std::size_t(t * 2 * inter + inter + j)];
    act_[std::size_t(i)] = g / (1.0f + std::exp(-g)) * u;
  }
  add_row_parallel(act_.data(), tokens, w.down, deterministic);
}

void LlamaModel::add_row_parallel(const float* x, std::int32_t rows, const WeightMatrix& w,
                                  bool deterministic) {
  if (c_.shard.size == 1) {  // the whole sum here: accumulate in place
    project(x, rows, w, x_.data(), true, deterministic);
    return;
  }
  partial_.resize(std::size_t(rows) * std::size_t(c_.hidden_size));
  project(x, rows, w, partial_.data(), false, deterministic);
  c_.shard.all_reduce_sum(partial_);
  for (std::size_t i = 0; i < partial_.size(); ++i) x_[i] += partial_[i];
}

void LlamaModel::project(const float* x, std::int32_t rows, const WeightMatrix& w, float* y,
                         bool accumulate, bool deterministic) {
  linear({x, rows, w.in(), w.data(), w.out(), y, accumulate, deterministic, w.format()}, scratch_);
}

void LlamaModel::forward(const ForwardBatch& b, PagedKVCache& cache, std::span<float> logits) {
  validate_batch(b, cache, logits);
  engine::use_single_threaded_blas();  // again: someone may have changed it since
  const auto tokens = static_cast<std::int32_t>(b.token_ids.size());
  const std::size_t h = std::size_t(c_.hidden_size), t = std::size_t(tokens);
  const std::size_t q_dim = std::size_t(hq_) * c_.head_dim;
  x_.resize(t * h);
  h_.resize(t * h);
  qkv_.resize(t * (q_dim + 2 * std::size_t(hkv_) * c_.head_dim));
  attn_.resize(t * q_dim);
  gate_up_.resize(t * 2 * std::size_t(inter_));
  act_.resize(t * std::size_t(inter_));
  for (std::size_t i = 0; i < t; ++i) w_.embedding.row_to_f32(b.token_ids[i], x_.data() + i * h);
  for (std::int32_t layer = 0; layer < c_.num_layers; ++layer) {
    attention_block(layer, tokens, b.deterministic, cache);
    mlp_block(layer, tokens, b.deterministic);
  }
  // Only the rows that sample go through the final norm and the LM head.
  const auto rows = static_cast<std::int32_t>(b.logit_rows.size());
  rows_.resize(std::size_t(rows) * h);
  for (std::int32_t r = 0; r < rows; ++r)
    std::copy_n(x_.data() + std::size_t(b.logit_rows[r]) * h, h, h_.data() + std::size_t(r) * h);
  rms_norm(h_.data(), rows, w_.final_norm, rows_.data());
  project(rows_.data(), rows, c_.tie_embeddings ? w_.embedding : w_.lm_head, logits.data(), false,
          b.deterministic);
}

}  // namespace

std::unique_ptr<Model> make_llama_model(const LlamaConfig& config) {
  validate(config);
  engine::validate_shard(config);
  return engine::make_llama_model(config, draw_weights(config));
}

namespace engine {
std::unique_ptr<Model> make_llama_model(const LlamaConfig& config, LlamaWeights weights) {
  validate(config);
  shard_llama_weights(config, weights);
  return std::make_unique<LlamaModel>(config, std::move(weights));
}
}  // namespace engine

}  // namespace pagedattn
