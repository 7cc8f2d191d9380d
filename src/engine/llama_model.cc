// The built-in Llama model: weights drawn from a seeded counter generator,
// forward pass over the cache's current plan.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "activation.h"
#include "core/cache_line_vector.h"
#include "core/own_thread.h"
#include "core/placement.h"
#include "core/team.h"
#include "counter_random.h"
#include "gemm.h"
#include "kernels/rope_table.h"
#include "llama_weights.h"
#include "mla_attention.h"
#include "moe.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"
#include "rms_norm.h"
#include "step_profile.h"
#include "team_attention.h"

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
  // Large ones on a thread of their own: the loading thread keeps no team.
  const bool parallel = n > (1 << 16);
  core::run_on_own_thread_if(parallel, [&] {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t i = 0; i < n; ++i)
      w[i] = static_cast<float>((2.0 * engine::counter_uniform(seed, stream, i) - 1.0) * bound);
  });
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
  require(c.rotary_dim >= 0 && c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim,
          "LlamaConfig.rotary_dim = ", c.rotary_dim,
          " must be even and in [0, head_dim = ", c.head_dim, "]");
  const std::int32_t rotary = c.rotary_dim ? c.rotary_dim : c.head_dim;
  require(c.rope_freq_factors.empty() || std::ssize(c.rope_freq_factors) == rotary / 2,
          "LlamaConfig.rope_freq_factors has ", c.rope_freq_factors.size(),
          " entries, need rotary_dim / 2 = ", rotary / 2);
  require(c.layer_windows.empty() || std::ssize(c.layer_windows) == c.num_layers,
          "LlamaConfig.layer_windows has ", c.layer_windows.size(),
          " entries, need num_layers = ", c.num_layers);
  for (std::size_t i = 0; i < c.layer_windows.size(); ++i)
    require(c.layer_windows[i] >= 0, "LlamaConfig.layer_windows[", i, "] = ", c.layer_windows[i],
            " must be >= 0");
  const std::pair<const char*, float> non_negative[] = {
      {"rope_theta_windowed", c.rope_theta_windowed},
      {"attention_scale", c.attention_scale},
      {"attention_softcap", c.attention_softcap},
      {"final_softcap", c.final_softcap}};
  for (const auto& [name, value] : non_negative)
    require(std::isfinite(value) && value >= 0.0f, "LlamaConfig.", name, " = ", value,
            " must be finite and >= 0");
  require(std::isfinite(c.embedding_scale) && c.embedding_scale > 0.0f &&
              std::isfinite(c.rope_scale) && c.rope_scale > 0.0f,
          "LlamaConfig.embedding_scale = ", c.embedding_scale, " and rope_scale = ", c.rope_scale,
          " must be finite and > 0");
  // RoPE's own checks (scaling parameters, factors), once.
  RopeConfig rope;
  rope.theta = c.rope_theta;
  rope.scale = c.rope_scale;
  rope.yarn = c.rope_yarn;
  rope.freq_factors = c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data();
  rope.attention_factor = c.rope_attention_factor;
  rope.rotary_dim = rotary;
  apply_rope({nullptr, DType::kF32, rotary, rotary}, 0, 1, rotary, nullptr, rope);  // no tokens
  engine::validate_moe_config(c);
  engine::validate_mla_config(c);
}

// The RoPE of one kind of layer and its cos/sin rows.
struct LayerRope {
  RopeConfig config;  // without a table
  kernels::RopeTable table;
};

// The window every layer has, or 0 when a layer is global (or none has one).
std::int32_t common_window(const LlamaConfig& c) {
  if (c.layer_windows.empty()) return 0;
  const std::int32_t w = c.layer_windows.front();
  for (std::int32_t layer_window : c.layer_windows)
    if (layer_window != w) return 0;
  return w;
}

class LlamaModel final : public Model {
 public:
  // `weights` hold this rank's shard (shard_llama_weights).
  LlamaModel(const LlamaConfig& c, LlamaWeights weights)
      : c_(c),
        hq_(engine::shard_qo_heads(c)),
        hkv_(engine::shard_kv_heads(c)),
        inter_(c.intermediate_size / c.shard.size),
        moe_(engine::moe_shape(c)),
        mla_(engine::mla_shape(c)),
        w_(std::move(weights)) {
    validate_weights();
    // The model rotates q and k itself (layers may differ in their RoPE), so
    // the cache stores keys as given.
    spec_ = {
        std::string(c.name), c.num_layers,    hq_, hkv_, c.head_dim, c.vocab_size, c.max_position,
        c.eos_token_id,      RopeMode::kNone, {}};
    spec_.sliding_window = common_window(c);
    spec_.latent_dim = c.kv_lora_rank;
    RopeConfig& global = rope_[0].config;
    global.style = c.rope_style;
    global.rotary_dim = c.rotary_dim;
    global.theta = c.rope_theta;
    global.scale = c.rope_scale;
    global.llama3.factor = c.llama3_rope_factor;
    global.yarn = c.rope_yarn;
    global.freq_factors = c_.rope_freq_factors.empty() ? nullptr : c_.rope_freq_factors.data();
    global.attention_factor = c.rope_attention_factor;
    rope_[1].config = global;
    if (c.rope_theta_windowed > 0.0f) {  // windowed layers: their own base, no scaling
      rope_[1].config = RopeConfig{};
      rope_[1].config.style = c.rope_style;
      rope_[1].config.rotary_dim = c.rotary_dim;
      rope_[1].config.theta = c.rope_theta_windowed;
    }
    engine::use_single_threaded_blas();
  }

  const ModelSpec& spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override;

 private:
  void validate_weights() const;
  void validate_batch(const ForwardBatch& batch, const PagedKVCache& cache,
                      std::span<float> logits) const;
  std::int32_t window(std::int32_t layer) const {
    return c_.layer_windows.empty() ? 0 : c_.layer_windows[std::size_t(layer)];
  }
  // A layer in three parts. When the step has a team (core/team.h),
  // start_layer and finish_layer run inside it, and so does attention where
  // the cache allows (engine::TeamAttention): the step's layers then share
  // one region; else attend runs between teams, with the attention kernels'
  // own regions, and the finish of one layer and the start of the next
  // share a team.
  //   start_layer: the attention norm of x_ into h_; without latent
  //     attention, q, k and v projected into qkv_, their norms and RoPE;
  //     with `in_team`, each token's K/V appended right after its RoPE.
  //   attend: attention into attn_ (latent attention: projections included);
  //     attend_in_team inside the team with team_attention_.
  //   finish_layer: attn_'s output projection added to x_, then the MLP.
  void start_layer(std::int32_t layer, std::int32_t tokens, bool deterministic,
                   const engine::TeamAttention* in_team = nullptr);
  void attend(std::int32_t layer, std::int32_t tokens, bool deterministic, PagedKVCache& cache);
  void attend_in_team(std::int32_t layer, std::int32_t tokens, bool deterministic);
  // Before the team: whether the step's attention runs in it (the cache
  // allows, and latent attention takes its absorbed form), and if so
  // team_attention_ prepared (and latent attention's buffers sized).
  bool prepare_attention_in_team(bool teams, bool deterministic, PagedKVCache& cache);
  // The attention options of `layer`: scale, window, softcap.
  AttentionOptions attention_options(std::int32_t layer) const;
  // The step's layers, each attending in the team with `team_attention_` or
  // else through `cache` between teams (teams off: no team at all), then
  // the logits, in the last team.
  void run_step(const ForwardBatch& b, bool teams, PagedKVCache& cache, std::span<float> logits);
  // The final norm of the rows that sample (b.logit_rows of x_) and their
  // logits through the LM head (and its softcap); split over the team's
  // threads inside one.
  void project_logits(const ForwardBatch& b, std::span<float> logits);
  void finish_layer(std::int32_t layer, std::int32_t tokens, bool deterministic);
  // Whether this step's layers run in teams: not when they talk to other
  // ranks (tensor parallelism), and not when core::teams_enabled() is
  // false. Deterministic steps do: every piece's bits are fixed by its rows
  // and columns, not by the split.
  bool layers_in_teams() const;
  // Multi-head latent attention (c_.kv_lora_rank > 0) on h_ into attn_.
  void latent_attention(std::int32_t layer, std::int32_t tokens, bool deterministic,
                        PagedKVCache& cache);
  // positions_: each new token's position in its whole sequence, and the
  // RoPE tables extended to cover them (outside any team: they grow).
  void set_positions(const PagedKVCache& cache);
  // `kind`'s table covering the step's positions (grown when it does not:
  // set_positions, before any team).
  const RopeConfig& cover_step(LayerRope& kind);
  // The RoPE of `layer`'s kind, its table covering the step's positions.
  const RopeConfig& rope_for(std::int32_t layer);
  // q/k/v biases, q/k norms and RoPE on the step's rows of qkv_, in place; with
  // `in_team`, each token's K/V then appended to its layer's pages.
  void prepare_qk(std::int32_t layer, std::int32_t tokens, const engine::TeamAttention* in_team);
  void mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic);
  // y[rows][w.out] (+)= x[rows][w.in] w^T (x_int8: LinearArgs::x_int8)
  void project(const float* x, std::int32_t rows, const WeightMatrix& w, float* y, bool accumulate,
               bool deterministic, const engine::Int8Rows* x_int8 = nullptr);
  // x_ += partial_ ([rows][hidden]: this rank's share) summed over the
  // tensor-parallel ranks, RMS-normed by `post_norm` first when it is not
  // empty.
  void add_partial(std::int32_t rows, const std::vector<float>& post_norm);
  // x_ += x w^T summed over the tensor-parallel ranks (each holds a slice
  // of w's input columns and of x's features), RMS-normed by `post_norm`
  // first when it is not empty.
  void add_row_parallel(const float* x, std::int32_t rows, const WeightMatrix& w,
                        const std::vector<float>& post_norm, bool deterministic,
                        const engine::Int8Rows* x_int8 = nullptr);
  // out[t] = x[t] / rms(x[t]) * weight, for `tokens` rows of `width`
  // (default hidden_size); split over the team's threads inside one. With
  // `rounded` ([tokens][width]), each row is also rounded to int8 there,
  // in the same piece (quantize_int8_rows).
  void rms_norm(const float* x, std::int32_t tokens, const std::vector<float>& weight, float* out,
                std::int32_t width = 0, engine::Int8Rows* rounded = nullptr) const;
  // A product's input rows, and the same rows rounded to int8 where the
  // product takes the int8 tiles (else null).
  struct ProductInput {
    const float* x;
    const engine::Int8Rows* int8 = nullptr;
  };
  // x_'s rows RMS-normed by `weight` for the product `next`, which reads
  // them from the pointer returned. Where `next` takes the int8 tiles, each
  // row is normed and rounded to int8 (into h_int8_) once, by one thread of
  // the team, the rows split over as many threads as there are
  // (for_row_ranges_split), a barrier after: else every thread of the
  // product would round every row again for each chunk of its columns.
  // Otherwise, rows too few for for_row_ranges to split (it would norm them
  // on one thread while the rest of the team waits at its barrier) are
  // normed by every thread of the team into its own copy (row_copies_,
  // sized by run_step), the same bits, and each thread's share of the
  // product reads its copy: no barrier between the norm and the product;
  // more rows go to h_, split as rms_norm does.
  ProductInput norm_for_product(std::int32_t tokens, const std::vector<float>& weight,
                                const StackedMatrix& next, bool deterministic);
  // The MLP's gated activation of gate_up_ for the down product, the same
  // way: rounded into act_int8_ where `down` takes the int8 tiles (rows
  // split over the team), else on every thread into its own copy for a few
  // rows, or into act_.
  ProductInput activation_for_product(std::int32_t tokens, const WeightMatrix& down,
                                      bool deterministic);
  // attn_'s rows rounded to int8 into attn_int8_ for the output projection
  // `o`, where it takes the int8 tiles: each thread rounds its range of rows
  // once (for_row_ranges_split, a barrier after, as for a norm), where every
  // thread of the product would round every row for each of its chunks;
  // else null (the product multiplies f32 rows).
  const engine::Int8Rows* attention_for_product(std::int32_t tokens, const WeightMatrix& o,
                                                bool deterministic);
  // This thread's row copy, where the step's rows of `width` are few enough.
  float* row_copy(std::int32_t tokens, std::int32_t width);

  LlamaConfig c_;
  std::int32_t hq_, hkv_, inter_;  // this shard's query heads, KV heads, MLP width
  engine::MoeShape moe_;           // num_experts 0: dense MLPs
  engine::MlaShape mla_;           // kv_lora_rank 0: no latent attention
  ModelSpec spec_;
  LlamaWeights w_;
  LayerRope rope_[2];  // global layers, windowed layers
  // Activations, reused across steps.
  std::vector<float> x_, qkv_, gate_up_, partial_;
  // The weight products' inputs, on cache lines (core/cache_line_vector.h).
  core::CacheLineVector<float> h_, attn_, act_, rows_;
  // [team threads][tokens][hidden or MLP width]: the copies of
  // norm_for_product and activation_for_product, for rows that
  // core::for_row_ranges would not split; sized when the step has teams.
  std::vector<core::CacheLineVector<float>> row_copies_;
  bool row_copies_sized_ = false;
  // h_, act_ and attn_ rounded to int8 for the products that take the int8
  // tiles (norm_for_product, activation_for_product, attention_for_product);
  // sized by run_step where this step's products may take them.
  engine::Int8Rows h_int8_, act_int8_, attn_int8_;
  bool int8_rows_sized_ = false;
  std::vector<std::int32_t> positions_;  // [tokens] RoPE positions of this step
  std::int32_t rope_positions_ = 1;      // 1 + the step's largest position
  LinearScratch scratch_;
  engine::MoeScratch moe_scratch_;
  engine::MlaScratch mla_scratch_;
  engine::TeamAttention team_attention_;
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
    l.qkv = engine::StackedMatrix(draw(qkv_rows, h, init_bound(h)));
    l.o = draw(h, q_dim, init_bound(q_dim, residual));
    if (c.num_experts > 0) {
      l.moe = engine::draw_moe_weights(c, static_cast<std::int32_t>(&l - w.layers.data()));
    } else {
      l.gate_up = engine::StackedMatrix(draw(2 * inter, h, init_bound(h)));
      l.down = draw(h, inter, init_bound(inter, residual));
    }
    if (c.qk_norm) {
      l.q_norm.assign(static_cast<std::size_t>(d), 1.0f);
      l.k_norm.assign(static_cast<std::size_t>(d), 1.0f);
    }
    if (c.sandwich_norms) {
      l.post_attn_norm.assign(static_cast<std::size_t>(h), 1.0f);
      l.post_mlp_norm.assign(static_cast<std::size_t>(h), 1.0f);
    }
  }
  return w;
}

template <typename Matrix>  // WeightMatrix or StackedMatrix
void require_shape(const Matrix& m, const char* name, std::int64_t layer, std::int32_t out,
                   std::int32_t in) {
  require(m.out() == out && m.in() == in, "LlamaModel: ", name, layer >= 0 ? " of layer " : "",
          layer >= 0 ? std::to_string(layer) : std::string(), " is ", m.out(), " x ", m.in(),
          ", the config needs ", out, " x ", in);
}

void require_norm(const std::vector<float>& v, const char* name, std::int64_t layer, std::int32_t h,
                  bool present = true) {
  const std::int32_t want = present ? h : 0;
  require(std::ssize(v) == want, "LlamaModel: ", name, " of layer ", layer, " has ", v.size(),
          " weights, the config needs ", want);
}

void LlamaModel::validate_weights() const {
  const std::int32_t h = c_.hidden_size, d = c_.head_dim, inter = inter_;
  const std::int32_t q_dim = hq_ * d, qkv_rows = q_dim + 2 * hkv_ * d;
  require_shape(w_.embedding, "the token embedding", -1, c_.vocab_size, h);
  if (!c_.tie_embeddings) require_shape(w_.lm_head, "the LM head", -1, engine::lm_head_rows(c_), h);
  require_norm(w_.final_norm, "the final norm", -1, h);
  require(std::ssize(w_.layers) == c_.num_layers, "LlamaModel: ", w_.layers.size(),
          " layers of weights, the config has ", c_.num_layers);
  for (std::size_t i = 0; i < w_.layers.size(); ++i) {
    const LlamaLayerWeights& l = w_.layers[i];
    const auto layer = static_cast<std::int64_t>(i);
    require_norm(l.attn_norm, "attn_norm", layer, h);
    require_norm(l.mlp_norm, "mlp_norm", layer, h);
    require_norm(l.q_norm, "q_norm", layer, d, c_.qk_norm);
    require_norm(l.k_norm, "k_norm", layer, d, c_.qk_norm);
    require_norm(l.post_attn_norm, "post_attn_norm", layer, h, c_.sandwich_norms);
    require_norm(l.post_mlp_norm, "post_mlp_norm", layer, h, c_.sandwich_norms);
    if (c_.kv_lora_rank > 0) {
      engine::validate_mla_weights(mla_, l.mla, layer);
      require_shape(l.o, "attn_output", layer, h, hq_ * c_.v_head_dim);
    } else {
      require(l.mla.empty(), "LlamaModel: layer ", layer,
              " has latent attention weights, the config has none");
      require_shape(l.qkv, "qkv", layer, qkv_rows, h);
      require(l.qkv_bias.empty() || std::ssize(l.qkv_bias) == qkv_rows,
              "LlamaModel: qkv_bias of layer ", layer, " has ", l.qkv_bias.size(),
              " values, the config needs ", qkv_rows);
      require_shape(l.o, "attn_output", layer, h, q_dim);
    }
    if (moe_.num_experts > 0 && layer >= c_.leading_dense_layers) {
      engine::validate_moe_weights(moe_, l.moe, layer);
      continue;
    }
    require(l.moe.empty(), "LlamaModel: layer ", layer, " has experts, the config has none there");
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
                          float* out, std::int32_t width, engine::Int8Rows* rounded) const {
  const std::size_t w = std::size_t(width > 0 ? width : c_.hidden_size);
  const auto norm = [&](std::int32_t begin, std::int32_t end) {
    engine::rms_norm_rows(x + begin * w, end - begin, std::int32_t(w), weight.data(),
                          c_.rms_norm_eps, out + begin * w);
    if (rounded != nullptr) engine::quantize_int8_rows(out, begin, end, *rounded);
  };
  if (rounded != nullptr) return core::for_row_ranges_split(tokens, norm);
  core::for_row_ranges(tokens, std::int64_t(w), norm);
}

float* LlamaModel::row_copy(std::int32_t tokens, std::int32_t width) {
  const bool copy = row_copies_sized_ && core::in_team() && !core::splits_rows(tokens, width);
  return copy ? row_copies_[std::size_t(core::worker_index())].data() : nullptr;
}

LlamaModel::ProductInput LlamaModel::norm_for_product(std::int32_t tokens,
                                                      const std::vector<float>& weight,
                                                      const StackedMatrix& next,
                                                      bool deterministic) {
  engine::Int8Rows* rounded =
      int8_rows_sized_ && next.takes_int8_tiles(tokens, deterministic) ? &h_int8_ : nullptr;
  if (float* mine = rounded == nullptr ? row_copy(tokens, c_.hidden_size) : nullptr) {
    engine::rms_norm_rows(x_.data(), tokens, c_.hidden_size, weight.data(), c_.rms_norm_eps, mine);
    return {mine};
  }
  rms_norm(x_.data(), tokens, weight, h_.data(), 0, rounded);
  return {h_.data(), rounded};
}

LlamaModel::ProductInput LlamaModel::activation_for_product(std::int32_t tokens,
                                                            const WeightMatrix& down,
                                                            bool deterministic) {
  const std::int32_t inter = inter_;
  const bool round =
      int8_rows_sized_ && engine::takes_int8_tiles(tokens, down.format(), deterministic);
  if (float* mine = round ? nullptr : row_copy(tokens, inter)) {
    engine::gated_activation(gate_up_.data(), tokens, inter, c_.activation, mine);
    return {mine};
  }
  const auto activate = [&](std::int32_t begin, std::int32_t end) {
    engine::gated_activation(gate_up_.data() + std::size_t(begin) * 2 * inter, end - begin, inter,
                             c_.activation, act_.data() + std::size_t(begin) * inter);
    if (round) engine::quantize_int8_rows(act_.data(), begin, end, act_int8_);
  };
  if (round)
    core::for_row_ranges_split(tokens, activate);
  else
    core::for_row_ranges(tokens, inter, activate);
  return {act_.data(), round ? &act_int8_ : nullptr};
}

const engine::Int8Rows* LlamaModel::attention_for_product(std::int32_t tokens,
                                                          const WeightMatrix& o,
                                                          bool deterministic) {
  const std::int32_t width = o.in();
  // run_step sized attn_int8_ for this step where int8_rows_sized_ and the
  // width is a multiple of 32 (else it never was: in stays 0).
  if (!int8_rows_sized_ || attn_int8_.in != width ||
      !engine::takes_int8_tiles(tokens, o.format(), deterministic))
    return nullptr;
  core::for_row_ranges_split(tokens, [&](std::int32_t begin, std::int32_t end) {
    engine::quantize_int8_rows(attn_.data(), begin, end, attn_int8_);
  });
  return &attn_int8_;
}

void LlamaModel::set_positions(const PagedKVCache& cache) {
  const BatchPlan& plan = cache.plan();
  positions_ = plan.positions;
  if (cache.config().support_sliding_window) {  // else no sequence dropped tokens
    for (std::size_t b = 0; b < plan.seq_ids.size(); ++b) {
      const std::int64_t dropped = cache.num_dropped_tokens(plan.seq_ids[b]);
      for (std::int32_t t = plan.qo_indptr[b]; t < plan.qo_indptr[b + 1]; ++t) {
        const std::int64_t position = positions_[std::size_t(t)] + dropped;
        require(position <= std::numeric_limits<std::int32_t>::max(),
                "LlamaModel::forward: sequence ", plan.seq_ids[b], " is past 2^31 tokens");
        positions_[std::size_t(t)] = static_cast<std::int32_t>(position);
      }
    }
  }
  rope_positions_ = 1;
  for (std::int32_t p : positions_) rope_positions_ = std::max(rope_positions_, p + 1);
  for (LayerRope& kind : rope_) cover_step(kind);
}

const RopeConfig& LlamaModel::cover_step(LayerRope& kind) {
  // Latent attention rotates rotary_dim of each head (validate_mla_config).
  const std::int32_t rotated = c_.kv_lora_rank > 0 ? c_.rotary_dim : c_.head_dim;
  return kind.table.covering(kind.config, rotated, rope_positions_);
}

const RopeConfig& LlamaModel::rope_for(std::int32_t layer) {
  return cover_step(rope_[window(layer) > 0 ? 1 : 0]);  // set_positions covered it: no write
}

void LlamaModel::prepare_qk(std::int32_t layer, std::int32_t tokens,
                            const engine::TeamAttention* in_team) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  const std::int32_t d = c_.head_dim, q_dim = hq_ * d, qkv_dim = q_dim + 2 * hkv_ * d;
  const RopeConfig& rope = rope_for(layer);
  core::for_row_ranges(tokens, qkv_dim, [&](std::int32_t begin, std::int32_t end) {
    float* rows = qkv_.data() + std::size_t(begin) * qkv_dim;
    for (std::int32_t t = begin; !w.qkv_bias.empty() && t < end; ++t)
      for (std::int32_t i = 0; i < qkv_dim; ++i)
        qkv_[std::size_t(t) * qkv_dim + i] += w.qkv_bias[std::size_t(i)];
    for (std::int32_t t = begin; c_.qk_norm && t < end; ++t) {  // each head's row on its own
      float* row = qkv_.data() + std::size_t(t) * qkv_dim;
      engine::rms_norm_rows(row, hq_, d, w.q_norm.data(), c_.rms_norm_eps, row);
      engine::rms_norm_rows(row + q_dim, hkv_, d, w.k_norm.data(), c_.rms_norm_eps, row + q_dim);
    }
    // The query heads and then the key heads, side by side in each row: one call.
    apply_rope({rows, DType::kF32, qkv_dim, d}, end - begin, hq_ + hkv_, d,
               positions_.data() + begin, rope);
    if (in_team != nullptr) in_team->append(layer, begin, end);
  });
}

void LlamaModel::latent_attention(std::int32_t layer, std::int32_t tokens, bool deterministic,
                                  PagedKVCache& cache) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  const RopeConfig& rope = rope_for(layer);  // no windows: validate_mla_config
  const engine::PhaseTimer timer(engine::StepPhase::kAttention);
  engine::mla_attention(mla_, w.mla, h_.data(), tokens, layer, positions_.data(), rope,
                        attention_options(layer), cache, attn_.data(), deterministic,
                        engine::mla_form(mla_, cache.plan(), deterministic), mla_scratch_,
                        scratch_);
}

bool LlamaModel::layers_in_teams() const {
  return c_.shard.size == 1 && core::teams_enabled();
}

void LlamaModel::start_layer(std::int32_t layer, std::int32_t tokens, bool deterministic,
                             const engine::TeamAttention* in_team) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  if (c_.kv_lora_rank > 0)  // latent attention projects h_ itself
    return rms_norm(x_.data(), tokens, w.attn_norm, h_.data());
  const ProductInput normed = norm_for_product(tokens, w.attn_norm, w.qkv, deterministic);
  {
    const engine::PhaseTimer timer(engine::StepPhase::kProducts);
    w.qkv.project(normed.x, tokens, qkv_.data(), false, deterministic, scratch_, normed.int8);
  }
  prepare_qk(layer, tokens, in_team);
}

void LlamaModel::attend(std::int32_t layer, std::int32_t tokens, bool deterministic,
                        PagedKVCache& cache) {
  if (c_.kv_lora_rank > 0) return latent_attention(layer, tokens, deterministic, cache);
  const std::int32_t d = c_.head_dim;
  const std::int32_t q_dim = hq_ * d, qkv_dim = q_dim + 2 * hkv_ * d;
  const engine::PhaseTimer timer(engine::StepPhase::kAttention);
  cache.attention_with_fused_qkv(layer, HeadTensor{qkv_.data(), DType::kF32, qkv_dim, d},
                                 HeadTensor{attn_.data(), DType::kF32, q_dim, d},
                                 attention_options(layer));
}

AttentionOptions LlamaModel::attention_options(std::int32_t layer) const {
  AttentionOptions options;
  if (c_.attention_scale > 0.0f)
    options.scale = c_.attention_scale;
  else if (c_.kv_lora_rank > 0)  // the cache's head dim is the latent's, the keys' nope + rope
    options.scale = 1.0f / std::sqrt(static_cast<float>(c_.qk_nope_head_dim + c_.rotary_dim));
  options.window_left = window(layer) > 0 ? window(layer) - 1 : -1;
  options.softcap = c_.attention_softcap;
  return options;
}

void LlamaModel::finish_layer(std::int32_t layer, std::int32_t tokens, bool deterministic) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  add_row_parallel(attn_.data(), tokens, w.o, w.post_attn_norm, deterministic,
                   attention_for_product(tokens, w.o, deterministic));
  mlp_block(layer, tokens, deterministic);
}

void LlamaModel::mlp_block(std::int32_t layer, std::int32_t tokens, bool deterministic) {
  const LlamaLayerWeights& w = w_.layers[std::size_t(layer)];
  if (!w.moe.empty()) {  // each rank's slice of every expert's features
    rms_norm(x_.data(), tokens, w.mlp_norm, h_.data());
    const engine::PhaseTimer timer(engine::StepPhase::kProducts);
    engine::moe_forward(moe_, w.moe, h_.data(), tokens, partial_.data(), deterministic,
                        moe_scratch_, scratch_);
    return add_partial(tokens, w.post_mlp_norm);
  }
  const ProductInput normed = norm_for_product(tokens, w.mlp_norm, w.gate_up, deterministic);
  {
    const engine::PhaseTimer timer(engine::StepPhase::kProducts);
    w.gate_up.project(normed.x, tokens, gate_up_.data(), false, deterministic, scratch_,
                      normed.int8);
  }
  const ProductInput act = activation_for_product(tokens, w.down, deterministic);
  add_row_parallel(act.x, tokens, w.down, w.post_mlp_norm, deterministic, act.int8);
}

void LlamaModel::add_row_parallel(const float* x, std::int32_t rows, const WeightMatrix& w,
                                  const std::vector<float>& post_norm, bool deterministic,
                                  const engine::Int8Rows* x_int8) {
  if (c_.shard.size == 1 && post_norm.empty()) {  // the whole sum here: accumulate in place
    project(x, rows, w, x_.data(), true, deterministic, x_int8);
    return;
  }
  project(x, rows, w, partial_.data(), false, deterministic, x_int8);  // forward() sized partial_
  add_partial(rows, post_norm);
}

void LlamaModel::add_partial(std::int32_t rows, const std::vector<float>& post_norm) {
  if (c_.shard.size > 1) c_.shard.all_reduce_sum(partial_);  // never in a team
  const std::size_t h = std::size_t(c_.hidden_size);
  core::for_row_ranges(rows, std::int64_t(h), [&](std::int32_t begin, std::int32_t end) {
    float* mine = partial_.data() + begin * h;
    if (!post_norm.empty())  // rms_norm's split, in the same piece as the sum
      engine::rms_norm_rows(mine, end - begin, c_.hidden_size, post_norm.data(), c_.rms_norm_eps,
                            mine);
    for (std::size_t i = begin * h; i < end * h; ++i) x_[i] += partial_[i];
  });
}

void LlamaModel::project(const float* x, std::int32_t rows, const WeightMatrix& w, float* y,
                         bool accumulate, bool deterministic, const engine::Int8Rows* x_int8) {
  const engine::PhaseTimer timer(engine::StepPhase::kProducts);
  LinearArgs args{x, rows, w.in(), w.data(), w.out(), y, accumulate, deterministic, w.format()};
  args.x_int8 = x_int8;
  linear(args, scratch_);
}

void LlamaModel::attend_in_team(std::int32_t layer, std::int32_t tokens, bool deterministic) {
  const engine::PhaseTimer timer(engine::StepPhase::kAttention);
  if (c_.kv_lora_rank == 0) return team_attention_.attend(layer);
  engine::mla_attention_in_team(mla_, w_.layers[std::size_t(layer)].mla, h_.data(), tokens, layer,
                                positions_.data(), rope_for(layer), team_attention_, attn_.data(),
                                deterministic, mla_scratch_, scratch_);
}

bool LlamaModel::prepare_attention_in_team(bool teams, bool deterministic, PagedKVCache& cache) {
  if (!teams || !engine::TeamAttention::supports(cache)) return false;
  const std::int32_t threads = omp_get_max_threads();
  engine::TeamAttention::Tensors tensors;
  if (c_.kv_lora_rank > 0) {
    if (engine::mla_form(mla_, cache.plan(), deterministic) != engine::MlaForm::kAbsorbed)
      return false;
    engine::size_step(mla_, cache.plan().num_tokens(), engine::MlaForm::kAbsorbed, threads,
                      deterministic, mla_scratch_);
    tensors = engine::latent_team_tensors(mla_, cache.config(), mla_scratch_);
  } else {
    tensors = engine::TeamAttention::fused_qkv(cache.config(), qkv_.data(), attn_.data());
  }
  std::vector<AttentionOptions> options(std::size_t(c_.num_layers));
  for (std::int32_t layer = 0; layer < c_.num_layers; ++layer)
    options[std::size_t(layer)] = attention_options(layer);
  team_attention_.prepare(cache, options, tensors, threads);
  return true;
}

void LlamaModel::run_step(const ForwardBatch& b, bool teams, PagedKVCache& cache,
                          std::span<float> logits) {
  const auto tokens = static_cast<std::int32_t>(b.token_ids.size());
  const bool deterministic = b.deterministic;
  // One region for the step's layers where each product, norm and RoPE
  // would open one (core/team.h), attention included where the cache
  // allows; else a team from each layer's attention to the next's.
  const bool attention_in_team = prepare_attention_in_team(teams, deterministic, cache);
  if (teams) engine::size_for_team(scratch_);
  // Room for rows for_row_ranges would leave on one thread (splits_rows).
  row_copies_sized_ = teams;
  if (teams) {
    const std::int64_t widest = std::int64_t{tokens} * std::max(c_.hidden_size, inter_);
    const std::int64_t copy = std::min(widest, core::kRowParallelElements);
    row_copies_.resize(std::size_t(omp_get_max_threads()));
    for (core::CacheLineVector<float>& row : row_copies_) row.resize(std::size_t(copy));
  }
  // Room for the rows norm_for_product and activation_for_product round to
  // int8, where this step's quantised products take the int8 tiles (not a
  // prompt's by default: no room held for its rows).
  int8_rows_sized_ = c_.hidden_size % 32 == 0 && inter_ % 32 == 0 &&
                     engine::takes_int8_tiles(tokens, engine::WeightFormat::kQ8_0, deterministic);
  if (int8_rows_sized_) {
    h_int8_.resize(tokens, c_.hidden_size);
    act_int8_.resize(tokens, inter_);
    const std::int32_t attention_width = w_.layers.front().o.in();  // attn_'s
    if (attention_width % 32 == 0) attn_int8_.resize(tokens, attention_width);
  }
  const core::TeamWaitScope waits(engine::profile_team_waits());
  const auto in_team = [&](auto&& part) {
    core::run_in_team(teams, engine::with_callers_activations(part));
  };
  const std::int32_t last = c_.num_layers - 1;
  if (attention_in_team) {
    in_team([&] {
      for (std::int32_t layer = 0; layer <= last; ++layer) {
        if (layer > 0) finish_layer(layer - 1, tokens, deterministic);
        start_layer(layer, tokens, deterministic, &team_attention_);
        attend_in_team(layer, tokens, deterministic);
      }
      finish_layer(last, tokens, deterministic);
      project_logits(b, logits);
    });
    return team_attention_.finish(cache);
  }
  for (std::int32_t layer = 0; layer <= last; ++layer) {
    in_team([&] {
      if (layer > 0) finish_layer(layer - 1, tokens, deterministic);
      start_layer(layer, tokens, deterministic);
    });
    attend(layer, tokens, deterministic, cache);
  }
  in_team([&] {
    finish_layer(last, tokens, deterministic);
    project_logits(b, logits);
  });
}

void LlamaModel::project_logits(const ForwardBatch& b, std::span<float> logits) {
  const auto rows = static_cast<std::int32_t>(b.logit_rows.size());
  const std::size_t h = std::size_t(c_.hidden_size), vocab = std::size_t(c_.vocab_size);
  const engine::PhaseTimer lm_head(engine::StepPhase::kLmHead);
  // Each sampling row of x_ normed into rows_ (one piece: rms_norm's split).
  core::for_row_ranges(rows, std::int64_t(h), [&](std::int32_t begin, std::int32_t end) {
    for (std::int32_t r = begin; r < end; ++r)
      engine::rms_norm_rows(x_.data() + std::size_t(b.logit_rows[std::size_t(r)]) * h, 1,
                            c_.hidden_size, w_.final_norm.data(), c_.rms_norm_eps,
                            rows_.data() + std::size_t(r) * h);
  });
  engine::project_lm_head(c_, w_, rows_.data(), rows, logits, b.deterministic, scratch_, partial_);
  if (c_.final_softcap <= 0.0f) return;
  core::for_row_ranges(rows, std::int64_t(vocab), [&](std::int32_t begin, std::int32_t end) {
    for (std::size_t i = begin * vocab; i < end * vocab; ++i)
      logits[i] = c_.final_softcap * std::tanh(logits[i] / c_.final_softcap);
  });
}

void LlamaModel::forward(const ForwardBatch& b, PagedKVCache& cache, std::span<float> logits) {
  validate_batch(b, cache, logits);
  const engine::PhaseTimer timer(engine::StepPhase::kForward);
  engine::use_single_threaded_blas();  // again: someone may have changed it since
  const engine::ScopedActivations activations(
      b.int8_activations ? engine::Activations::kInt8 : engine::Activations::kDefault,
      b.bf16_products);
  const auto tokens = static_cast<std::int32_t>(b.token_ids.size());
  const std::size_t h = std::size_t(c_.hidden_size), t = std::size_t(tokens);
  const std::size_t q_dim = std::size_t(hq_) * c_.head_dim;
  x_.resize(t * h);
  h_.resize(t * h);
  if (c_.kv_lora_rank == 0)  // latent attention has buffers of its own
    qkv_.resize(t * (q_dim + 2 * std::size_t(hkv_) * c_.head_dim));
  const std::int32_t value_dim = c_.kv_lora_rank > 0 ? c_.v_head_dim : c_.head_dim;
  attn_.resize(t * std::size_t(hq_) * std::size_t(value_dim));
  gate_up_.resize(t * 2 * std::size_t(inter_));
  act_.resize(t * std::size_t(inter_));
  partial_.resize(t * h);
  set_positions(cache);
  for (std::size_t i = 0; i < t; ++i) w_.embedding.row_to_f32(b.token_ids[i], x_.data() + i * h);
  if (c_.embedding_scale != 1.0f)
    for (float& v : x_) v *= c_.embedding_scale;
  // Only the rows that sample go through the final norm and the LM head.
  rows_.resize(b.logit_rows.size() * h);
  run_step(b, layers_in_teams(), cache, logits);
}

}  // namespace

std::unique_ptr<Model> make_llama_model(const LlamaConfig& config) {
  validate(config);
  require(config.kv_lora_rank == 0 && config.leading_dense_layers == 0,
          "make_llama_model: LlamaConfig.kv_lora_rank = ", config.kv_lora_rank,
          " and leading_dense_layers = ", config.leading_dense_layers,
          ": latent attention and leading dense layers have no synthetic weights (load a GGUF "
          "deepseek2 file with make_gguf_model)");
  engine::validate_shard(config);
  const core::InterleaveNewPages spread(core::spread_memory_over_nodes());  // the weights
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
