// The built-in Llama model: weights drawn from a seeded counter generator,
// forward pass over the cache's current plan.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "counter_random.h"
#include "gemm.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

using engine::LinearArgs;
using engine::linear;
using engine::LinearScratch;

struct LayerWeights {
  std::vector<float> attn_norm;  // [H]
  std::vector<float> qkv;        // [(Hq + 2 Hkv) D][H]: q heads, k heads, v heads
  std::vector<float> o;          // [H][Hq D]
  std::vector<float> mlp_norm;   // [H]
  std::vector<float> gate_up;    // [2 I][H]: gate rows, then up rows
  std::vector<float> down;       // [H][I]
};

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
  const std::pair<const char*, std::int32_t> fields[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size}, {"num_layers", c.num_layers},
      {"num_qo_heads", c.num_qo_heads}, {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim}, {"max_position", c.max_position}};
  for (const auto& [name, value] : fields)
    require(value >= 1, "LlamaConfig.", name, " = ", value, " must be >= 1");
  require(c.num_qo_heads % c.num_kv_heads == 0, "LlamaConfig.num_kv_heads = ", c.num_kv_heads,
          " must divide num_qo_heads = ", c.num_qo_heads);
  require(c.head_dim % 2 == 0, "LlamaConfig.head_dim = ", c.head_dim, " must be even (RoPE)");
  require(c.eos_token_id >= -1 && c.eos_token_id < c.vocab_size, "LlamaConfig.eos_token_id = ",
          c.eos_token_id, " is outside [-1, vocab_size = ", c.vocab_size, ")");
  require(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0.0f, "LlamaConfig.rms_norm_eps = ",
          c.rms_norm_eps, " must be > 0");
}

class LlamaModel final : public Model {
 public:
  explicit LlamaModel(const LlamaConfig& c) : c_(c) {
    validate(c);
    spec_ = {std::string(c.name), c.num_layers, c.num_qo_heads, c.num_kv_heads, c.head_dim,
             c.vocab_size, c.max_position, c.eos_token_id, RopeMode::kNormal, {}};
    spec_.rope.theta = c.rope_theta;
    spec_.rope.llama3.factor = c.llama3_rope_factor;
    engine::use_single_threaded_blas();
    draw_weights();
  }

  const ModelSpec& spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override;

 private:
  void draw_weights();
  void validate_batch(const ForwardBatch& batch, const PagedKVCache& cache,
                      std::span<float> logits) const;
  void attention_block(std::int32_t layer, std::int32_t tokens, bool deterministic,
                       PagedKVCache& cache);
  void mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic);
  // out[t] = x[t] / rms(x[t]) * weight, for `tokens` rows of hidden_size.
  void rms_norm(const float* x, std::int32_t tokens, const std::vector<float>& weight,
                float* out) const;

  LlamaConfig c_;
  ModelSpec spec_;
  std::vector<float> embedding_;  // [V][H]
  std::vector<float> lm_head_;    // [V][H], empty when tied
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  // Activations, reused across steps.
  std::vector<float> x_, h_, qkv_, attn_, gate_up_, act_, rows_;
  LinearScratch scratch_;
};

void LlamaModel::draw_weights() {
  const std::int64_t h = c_.hidden_size, d = c_.head_dim, inter = c_.intermediate_size;
  const std::int64_t q_dim = std::int64_t{c_.num_qo_heads} * d;
  const std::int64_t qkv_rows = q_dim + 2 * std::int64_t{c_.num_kv_heads} * d;
  const double residual = 1.0 / std::sqrt(2.0 * c_.num_layers);  // keeps the residual stream O(1)
  std::uint64_t stream = 0;
  auto draw = [&](std::int64_t count, float bound) {
    return uniform_weights(static_cast<std::size_t>(count), bound, c_.weight_seed, stream++);
  };
  embedding_ = draw(c_.vocab_size * h, init_bound(h));
  if (!c_.tie_embeddings) lm_head_ = draw(c_.vocab_size * h, init_bound(h));
  final_norm_.assign(static_cast<std::size_t>(h), 1.0f);
  layers_.resize(static_cast<std::size_t>(c_.num_layers));
  for (LayerWeights& l : layers_) {
    l.attn_norm.assign(static_cast<std::size_t>(h), 1.0f);
    l.mlp_norm.assign(static_cast<std::size_t>(h), 1.0f);
    l.qkv = draw(qkv_rows * h, init_bound(h));
    l.o = draw(h * q_dim, init_bound(q_dim, residual));
    l.gate_up = draw(2 * inter * h, init_bound(h));
    l.down = draw(h * inter, init_bound(inter, residual));
  }
}

void LlamaModel::validate_batch(const ForwardBatch& b, const PagedKVCache& cache,
                                std::span<float> logits) const {
  const std::int32_t tokens = cache.plan().num_tokens();
  require(std::ssize(b.token_ids) == tokens, "LlamaModel::forward: token_ids has ",
          b.token_ids.size(), " entries, the cache's plan has ", tokens, " tokens");
  for (std::size_t i = 0; i < b.token_ids.size(); ++i)
    require(b.token_ids[i] >= 0 && b.token_ids[i] < c_.vocab_size, "LlamaModel::forward: token_ids[",
            i, "] = ", b.token_ids[i], " is outside [0, vocab_size = ", c_.vocab_size, ")");
  for (std::size_t i = 0; i < b.logit_rows.size(); ++i)
    require(b.logit_rows[i] >= 0 && b.logit_rows[i] < tokens &&
                (i == 0 || b.logit_rows[i] > b.logit_rows[i - 1]),
            "LlamaModel::forward: logit_rows[", i, "] = ", b.logit_rows[i],
            " must be ascending and in [0, ", tokens, ")");
  require(logits.size() == b.logit_rows.size() * static_cast<std::size_t>(c_.vocab_size),
          "LlamaModel::forward: logits has ", logits.size(), " floats, need ",
          b.logit_rows.size(), " x ", c_.vocab_size);
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
  const LayerWeights& w = layers_[std::size_t(layer)];
  const std::int32_t h = c_.hidden_size, d = c_.head_dim;
  const std::int32_t q_dim = c_.num_qo_heads * d, qkv_dim = q_dim + 2 * c_.num_kv_heads * d;
  rms_norm(x_.data(), tokens, w.attn_norm, h_.data());
  linear({h_.data(), tokens, h, w.qkv.data(), qkv_dim, qkv_.data(), false, deterministic}, scratch_);
  cache.attention_with_fused_qkv(layer, HeadTensor{qkv_.data(), DType::kF32, qkv_dim, d},
                                 HeadTensor{attn_.data(), DType::kF32, q_dim, d});
  linear({attn_.data(), tokens, q_dim, w.o.data(), h, x_.data(), true, deterministic}, scratch_);
}

void LlamaModel::mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic) {
  const LayerWeights& w = layers_[std::size_t(layer)];
  const std::int32_t h = c_.hidden_size, inter = c_.intermediate_size;
  rms_norm(x_.data(), tokens, w.mlp_norm, h_.data());
  linear({h_.data(), tokens, h, w.gate_up.data(), 2 * inter, gate_up_.data(), false, deterministic},
         scratch_);
  const std::int64_t n = std::int64_t{tokens} * inter;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {  // SwiGLU: silu(gate) * up
    const std::int64_t t = i / inter, j = i % inter;
    const float g = gate_up_[std::size_t(t * 2 * inter + j)];
    const float u = gate_up_[std::size_t(t * 2 * inter + inter + j)];
    act_[std::size_t(i)] = g / (1.0f + std::exp(-g)) * u;
  }
  linear({act_.data(), tokens, inter, w.down.data(), h, x_.data(), true, deterministic}, scratch_);
}

void LlamaModel::forward(const ForwardBatch& b, PagedKVCache& cache, std::span<float> logits) {
  validate_batch(b, cache, logits);
  engine::use_single_threaded_blas();  // again: someone may have changed it since
  const auto tokens = static_cast<std::int32_t>(b.token_ids.size());
  const std::size_t h = std::size_t(c_.hidden_size), t = std::size_t(tokens);
  const std::size_t q_dim = std::size_t(c_.num_qo_heads) * c_.head_dim;
  x_.resize(t * h);
  h_.resize(t * h);
  qkv_.resize(t * (q_dim + 2 * std::size_t(c_.num_kv_heads) * c_.head_dim));
  attn_.resize(t * q_dim);
  gate_up_.resize(t * 2 * std::size_t(c_.intermediate_size));
  act_.resize(t * std::size_t(c_.intermediate_size));
  for (std::size_t i = 0; i < t; ++i)
    std::copy_n(embedding_.data() + std::size_t(b.token_ids[i]) * h, h, x_.data() + i * h);
  for (std::int32_t layer = 0; layer < c_.num_layers; ++layer) {
    attention_block(layer, tokens, b.deterministic, cache);
    mlp_block(layer, tokens, b.deterministic);
  }
  // Only the rows that sample go through the final norm and the LM head.
  const auto rows = static_cast<std::int32_t>(b.logit_rows.size());
  rows_.resize(std::size_t(rows) * h);
  for (std::int32_t r = 0; r < rows; ++r)
    std::copy_n(x_.data() + std::size_t(b.logit_rows[r]) * h, h, h_.data() + std::size_t(r) * h);
  rms_norm(h_.data(), rows, final_norm_, rows_.data());
  const float* head = c_.tie_embeddings ? embedding_.data() : lm_head_.data();
  linear({rows_.data(), rows, c_.hidden_size, head, c_.vocab_size, logits.data(), false,
          b.deterministic},
         scratch_);
}

}  // namespace

std::unique_ptr<Model> make_llama_model(const LlamaConfig& config) {
  return std::make_unique<LlamaModel>(config);
}

}  // namespace pagedattn
