// make_gguf_model: a GGUF decoder (llama, qwen2, qwen3, gemma2, gemma3, phi3,
// qwen2moe, qwen3moe, deepseek2) as the built-in model.
// Q8_0 / Q4_0 / Q4_1 / Q4_K / Q5_K / Q6_K tensors stay in their blocks (the
// quantised kernels read them in place), F16 / BF16 matrices stay 16-bit (the
// kernels widen them in registers, exactly); F32 tensors, norms and 16-bit
// rows of other than whole 32-weight blocks are widened to f32 once, at load
// (exactly, by the GGUF reader).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "core/placement.h"
#include "engine/llama_weights.h"
#include "engine/mla_attention.h"
#include "engine/moe.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/gguf_types.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

using engine::LlamaLayerWeights;
using engine::LlamaWeights;
using engine::StackedMatrix;
using engine::WeightFormat;
using engine::WeightMatrix;

// A [out][in] matrix (ggml dims {in, out}), copied out of the file (its
// pages then leave the resident set: the load peaks near the model's size).
WeightMatrix load_matrix(const GgufFile& file, const std::string& name) {
  const GgufTensor& t = file.tensor(name);
  require(t.dims.size() == 2, "gguf ", file.source_name(), ": tensor '", name, "' has ",
          t.dims.size(), " dims, a weight matrix has 2");
  const auto in = static_cast<std::int32_t>(t.dims[0]), out = static_cast<std::int32_t>(t.dims[1]);
  const std::optional<WeightFormat> format = engine::in_place_format(t.type, in);
  WeightMatrix m = format ? WeightMatrix::rows(*format, {t.data, std::size_t(t.nbytes)}, out, in)
                          : WeightMatrix::f32(file.dequantize(t), out, in);
  file.release_pages(t);
  return m;
}

std::vector<float> load_vector(const GgufFile& file, const std::string& name) {
  const GgufTensor& t = file.tensor(name);
  std::vector<float> v = file.dequantize(t);
  file.release_pages(t);
  return v;
}

// A norm's weights, or none when the architecture has no such tensor.
std::vector<float> load_optional_vector(const GgufFile& file, const std::string& name) {
  return name.empty() ? std::vector<float>{} : load_vector(file, name);
}

// The [out][in] matrices of a 3-D expert tensor (ggml dims {in, out,
// experts}), one per expert: a quantised expert keeps its blocks (its bytes
// are a contiguous slice of the tensor's), others are widened to f32.
std::vector<WeightMatrix> load_experts(const GgufFile& file, const std::string& name) {
  const GgufTensor& t = file.tensor(name);
  require(t.dims.size() == 3, "gguf ", file.source_name(), ": tensor '", name, "' has ",
          t.dims.size(), " dims, an expert tensor has 3");
  const auto in = static_cast<std::int32_t>(t.dims[0]), out = static_cast<std::int32_t>(t.dims[1]);
  const auto experts = static_cast<std::size_t>(t.dims[2]);
  std::vector<WeightMatrix> matrices;
  matrices.reserve(experts);
  if (const std::optional<WeightFormat> format = engine::in_place_format(t.type, in)) {
    const std::size_t bytes = std::size_t(out) * std::size_t(engine::weight_row_bytes(*format, in));
    for (std::size_t e = 0; e < experts; ++e)
      matrices.push_back(WeightMatrix::rows(*format, {t.data + e * bytes, bytes}, out, in));
  } else {
    const std::vector<float> values = file.dequantize(t);
    const std::size_t count = std::size_t(out) * std::size_t(in);
    for (std::size_t e = 0; e < experts; ++e)
      matrices.push_back(WeightMatrix::f32({values.begin() + std::ptrdiff_t(e * count),
                                            values.begin() + std::ptrdiff_t((e + 1) * count)},
                                           out, in));
  }
  file.release_pages(t);
  return matrices;
}

// One gated MLP from its gate, up and down tensors (each in its own format).
engine::ExpertWeights load_expert(WeightMatrix gate, WeightMatrix up, WeightMatrix down) {
  engine::ExpertWeights e;
  e.gate_up = StackedMatrix(std::move(gate));
  e.gate_up.append(std::move(up));
  e.down = std::move(down);
  return e;
}

// The layer's router, routed experts, selection bias (deepseek2 sigmoid
// gating) and shared expert with (qwen2moe) its gate.
engine::MoeLayerWeights load_moe(const GgufFile& file, const GgufLayerTensors& t) {
  engine::MoeLayerWeights moe;
  moe.router = load_matrix(file, t.ffn_gate_inp);
  std::vector<WeightMatrix> gate = load_experts(file, t.ffn_gate_exps);
  std::vector<WeightMatrix> up = load_experts(file, t.ffn_up_exps);
  std::vector<WeightMatrix> down = load_experts(file, t.ffn_down_exps);
  for (std::size_t e = 0; e < gate.size(); ++e)
    moe.experts.push_back(load_expert(std::move(gate[e]), std::move(up[e]), std::move(down[e])));
  if (!t.exp_probs_b.empty()) moe.selection_bias = load_vector(file, t.exp_probs_b);
  if (t.ffn_gate_shexp.empty()) return moe;
  moe.shared = load_expert(load_matrix(file, t.ffn_gate_shexp), load_matrix(file, t.ffn_up_shexp),
                           load_matrix(file, t.ffn_down_shexp));
  if (t.ffn_gate_inp_shexp.empty()) return moe;  // deepseek2: ungated
  std::vector<float> gate_row = load_vector(file, t.ffn_gate_inp_shexp);
  const auto hidden = static_cast<std::int32_t>(gate_row.size());
  moe.shared_gate = WeightMatrix::f32(std::move(gate_row), 1, hidden);
  return moe;
}

// The per-head key and value up-projections of MLA: the split attn_k_b
// ({nope, latent, heads}: head h's [latent][nope] is W_UK_h^T as stored)
// and attn_v_b ({latent, v, heads}: W_UV_h), or the old attn_kv_b
// ({latent, heads (nope + v)}: head h's rows are W_UK_h, then W_UV_h),
// whose key part is transposed here (dequantised to f32).
void load_latent_up_projections(const GgufFile& file, const GgufModelConfig& g,
                                const GgufLayerTensors& t, engine::MlaLayerWeights& mla) {
  if (t.attn_kv_b.empty()) {
    mla.k_absorb = load_experts(file, t.attn_k_b);
    mla.v_up = load_experts(file, t.attn_v_b);
    return;
  }
  const GgufTensor& kv_b = file.tensor(t.attn_kv_b);
  const std::vector<float> w = file.dequantize(kv_b);
  file.release_pages(kv_b);
  const auto latent = static_cast<std::size_t>(g.kv_lora_rank),
             nope = static_cast<std::size_t>(g.qk_nope_head_dim),
             v = static_cast<std::size_t>(g.v_head_dim);
  for (std::size_t h = 0; h < std::size_t(g.num_qo_heads); ++h) {
    const float* head = w.data() + h * (nope + v) * latent;  // [nope + v][latent]
    std::vector<float> k_t(latent * nope);
    for (std::size_t i = 0; i < nope; ++i)
      for (std::size_t j = 0; j < latent; ++j) k_t[j * nope + i] = head[i * latent + j];
    mla.k_absorb.push_back(WeightMatrix::f32(std::move(k_t), static_cast<std::int32_t>(latent),
                                             static_cast<std::int32_t>(nope)));
    mla.v_up.push_back(WeightMatrix::f32({head + nope * latent, head + (nope + v) * latent},
                                         static_cast<std::int32_t>(v),
                                         static_cast<std::int32_t>(latent)));
  }
}

engine::MlaLayerWeights load_latent_attention(const GgufFile& file, const GgufModelConfig& g,
                                              const GgufLayerTensors& t) {
  engine::MlaLayerWeights mla;
  if (g.q_lora_rank > 0) {
    mla.input = StackedMatrix(load_matrix(file, t.attn_q_a));
    mla.q_a_norm = load_vector(file, t.attn_q_a_norm);
    mla.q_b = load_matrix(file, t.attn_q_b);
  } else {
    mla.input = StackedMatrix(load_matrix(file, t.attn_q));
  }
  mla.input.append(load_matrix(file, t.attn_kv_a_mqa));
  mla.kv_a_norm = load_vector(file, t.attn_kv_a_norm);
  load_latent_up_projections(file, g, t, mla);
  return mla;
}

// q, k and v rows stacked (each part kept in its own format), and their
// biases when the file has them.
void load_qkv(const GgufFile& file, const GgufLayerTensors& t, LlamaLayerWeights& l) {
  if (!t.attn_qkv.empty()) {  // phi3: already fused
    l.qkv = StackedMatrix(load_matrix(file, t.attn_qkv));
    return;
  }
  l.qkv = StackedMatrix(load_matrix(file, t.attn_q));
  l.qkv.append(load_matrix(file, t.attn_k));
  l.qkv.append(load_matrix(file, t.attn_v));
  if (!t.attn_q_bias.empty())
    for (const std::string* name : {&t.attn_q_bias, &t.attn_k_bias, &t.attn_v_bias}) {
      const std::vector<float> b = load_vector(file, *name);
      l.qkv_bias.insert(l.qkv_bias.end(), b.begin(), b.end());
    }
}

// gate rows, then up rows (phi3's ffn_up holds both, in that order).
StackedMatrix load_gate_up(const GgufFile& file, const GgufLayerTensors& t) {
  if (t.ffn_gate.empty()) return StackedMatrix(load_matrix(file, t.ffn_up));
  StackedMatrix gate_up(load_matrix(file, t.ffn_gate));
  gate_up.append(load_matrix(file, t.ffn_up));
  return gate_up;
}

std::int32_t narrow(std::int64_t value, const char* what) {
  require(value >= 0 && value <= std::numeric_limits<std::int32_t>::max(),
          "make_gguf_model: ", what, " = ", value, " does not fit the model's 32-bit fields");
  return static_cast<std::int32_t>(value);
}

LlamaConfig llama_config(const GgufModelConfig& g, const GgufModelOptions& options) {
  LlamaConfig c;
  c.name = g.name.empty() ? g.arch_name : g.name;
  c.vocab_size = narrow(g.vocab_size, "vocab_size");
  c.hidden_size = narrow(g.hidden_size, "hidden_size");
  c.intermediate_size = narrow(g.intermediate_size, "intermediate_size");
  c.num_layers = narrow(g.num_layers, "num_layers");
  c.num_qo_heads = narrow(g.num_qo_heads, "num_qo_heads");
  c.num_kv_heads = narrow(g.num_kv_heads, "num_kv_heads");
  c.head_dim = narrow(g.head_dim, "head_dim");
  c.rope_style =
      g.rope_layout == GgufRopeLayout::kInterleaved ? RopeStyle::kGptJ : RopeStyle::kNeox;
  c.rope_theta = g.rope_theta;
  c.rotary_dim = narrow(g.rotary_dim, "rotary_dim");
  const GgufRopeScaling& scaling = g.rope_scaling;
  if (scaling.type == "linear") c.rope_scale = 1.0f / scaling.factor;
  if (scaling.type == "yarn" && scaling.factor > 1.0f)
    c.rope_yarn = {scaling.factor, narrow(scaling.original_context_length, "original context"),
                   scaling.yarn_beta_fast, scaling.yarn_beta_slow, scaling.yarn_attention_factor};
  for (std::int64_t w : g.layer_windows) c.layer_windows.push_back(narrow(w, "sliding_window"));
  c.rope_theta_windowed = g.rope_theta_windowed;
  c.qk_norm = !g.layers.empty() && !g.layers.front().attn_q_norm.empty();
  c.sandwich_norms = !g.layers.empty() && !g.layers.front().post_attention_norm.empty();
  c.activation =
      g.activation == GgufActivation::kGeluTanh ? MlpActivation::kGeluTanh : MlpActivation::kSilu;
  c.embedding_scale = g.embedding_scale;
  c.attention_scale = g.attention_scale;
  c.attention_softcap = g.attention_softcap;
  c.final_softcap = g.final_softcap;
  c.num_experts = narrow(g.num_experts, "expert_count");
  c.num_experts_used = narrow(g.num_experts_used, "expert_used_count");
  c.expert_intermediate_size = narrow(g.expert_intermediate_size, "expert_feed_forward_length");
  c.shared_expert_intermediate_size =
      narrow(g.shared_expert_intermediate_size, "expert_shared_feed_forward_length");
  c.normalize_expert_weights = g.normalize_expert_weights;
  c.expert_gating = g.expert_gating == GgufExpertGating::kSigmoid ? ExpertGating::kSigmoid
                                                                  : ExpertGating::kSoftmax;
  c.expert_weights_scale = g.expert_weights_scale;
  c.expert_groups = narrow(g.expert_groups, "expert_group_count");
  c.expert_groups_used = narrow(g.expert_groups_used, "expert_group_used_count");
  c.shared_expert_gated = g.shared_expert_gated;
  c.leading_dense_layers =
      g.num_experts > 0 ? narrow(g.leading_dense_layers, "leading_dense_block_count") : 0;
  c.q_lora_rank = narrow(g.q_lora_rank, "q_lora_rank");
  c.kv_lora_rank = narrow(g.kv_lora_rank, "kv_lora_rank");
  c.qk_nope_head_dim = narrow(g.qk_nope_head_dim, "qk_nope_head_dim");
  c.v_head_dim = narrow(g.v_head_dim, "v_head_dim");
  // deepseek2 folds YaRN's magnitude correction into attention_scale
  // (mscale^2, read_model_config); cos and sin stay unscaled.
  if (g.kv_lora_rank > 0 && c.rope_yarn.factor > 0.0f) c.rope_yarn.attention_factor = 1.0f;
  c.rms_norm_eps = g.rms_norm_eps;
  c.max_position =
      options.max_position > 0 ? options.max_position : narrow(g.context_length, "context_length");
  c.tie_embeddings = g.tie_embeddings;
  c.shard = options.shard;
  c.eos_token_id = g.eos_token_id >= 0 && g.eos_token_id < g.vocab_size
                       ? static_cast<std::int32_t>(g.eos_token_id)
                       : -1;
  return c;
}

// Phi-3's LongRoPE. Hugging Face picks the long factors while the sequence
// is longer than the original context and the short ones otherwise; a
// paged engine rotates each key once, so the choice is made once, from the
// context served (config.max_position), as llama.cpp does from n_ctx: short
// factors when it fits the original context (then every sequence matches
// Hugging Face), long ones beyond it. The attention factor depends only on
// the file.
void apply_long_rope(const GgufFile& file, const GgufModelConfig& g, LlamaConfig& config) {
  const GgufRopeScaling& s = g.rope_scaling;
  const bool long_context = config.max_position > s.original_context_length;
  config.rope_freq_factors =
      load_vector(file, long_context ? s.long_factors_tensor : s.short_factors_tensor);
  const double factor = double(g.context_length) / double(s.original_context_length);
  config.rope_attention_factor =
      s.attention_factor > 0.0f ? s.attention_factor
      : factor <= 1.0           ? 1.0f
                                : static_cast<float>(std::sqrt(
                                      1.0 + std::log(factor) / std::log(double(s.original_context_length))));
}

// Where the bad value is and which kind it is, plus its block for quantised
// types (their decoded values are finite unless a block's f16 scale is not).
std::string describe_bad_element(const GgufTensor& t, std::int64_t row, std::int64_t column,
                                 float value) {
  const GgufTypeInfo& info = gguf_type_info(t.type);
  std::string what =
      detail::concat("element ", row * t.row_length() + column, " (row ", row, ", column ", column,
                     ") is ", std::isnan(value) ? "NaN" : "Inf");
  if (info.block_size > 1)
    what += detail::concat(": its ", info.name, " block (block ", column / info.block_size,
                           " of the row) has a non-finite f16 scale");
  return what;
}

// Decodes `t` row by row; InvalidArgument at its first non-finite value.
void check_tensor_finite(const GgufFile& file, const GgufTensor& t) {
  const std::int64_t n = t.row_length();
  const std::int64_t row_bytes = gguf_row_bytes(t.type, n);
  std::vector<float> values(std::size_t(n), 0.0f);
  for (std::int64_t r = 0; r < t.row_count(); ++r) {
    dequantize_row(t.type, t.data + r * row_bytes, values.data(), n);
    const auto bad =
        std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
    if (bad != values.end())
      throw InvalidArgument(detail::concat("make_gguf_model: check_tensors: gguf ",
                                           file.source_name(), ": tensor '", t.name, "' ",
                                           describe_bad_element(t, r, bad - values.begin(), *bad)));
  }
}

// Every tensor whose type decodes; others cannot hold a weight the model reads
// (read_model_config refuses those).
void check_tensors_finite(const GgufFile& file) {
  for (const GgufTensor& t : file.tensors()) {
    if (!gguf_type_info(t.type).dequantizable) continue;
    check_tensor_finite(file, t);
    file.release_pages(t);
  }
}

}  // namespace

std::unique_ptr<Model> make_gguf_model(const std::string& path, const GgufModelOptions& options) {
  return make_gguf_model(GgufFile::open(path), options);
}

std::unique_ptr<Model> make_gguf_model(const GgufFile& file, const GgufModelOptions& options) {
  require(options.max_position >= 0,
          "make_gguf_model: options.max_position = ", options.max_position,
          " must be >= 0 (0: the file's context length)");
  // Weights converted or repacked here, and file pages read here, spread
  // over the NUMA nodes (file pages already cached stay where they are).
  const core::InterleaveNewPages spread(core::spread_memory_over_nodes());
  const GgufModelConfig g = read_model_config(file);
  LlamaConfig config = llama_config(g, options);
  if (!g.rope_scaling.freq_factors_tensor.empty())
    config.rope_freq_factors = load_vector(file, g.rope_scaling.freq_factors_tensor);
  if (!g.rope_scaling.long_factors_tensor.empty()) apply_long_rope(file, g, config);
  engine::validate_mla_config(config);  // before reading any weight
  engine::validate_shard(config);
  engine::validate_moe_config(config);
  if (options.check_tensors) check_tensors_finite(file);
  LlamaWeights w;
  w.embedding = load_matrix(file, g.token_embedding);
  if (!g.tie_embeddings) w.lm_head = load_matrix(file, g.output);
  w.final_norm = load_vector(file, g.output_norm);
  for (const GgufLayerTensors& t : g.layers) {
    LlamaLayerWeights& l = w.layers.emplace_back();
    l.attn_norm = load_vector(file, t.attn_norm);
    if (g.kv_lora_rank > 0)
      l.mla = load_latent_attention(file, g, t);
    else
      load_qkv(file, t, l);
    l.q_norm = load_optional_vector(file, t.attn_q_norm);
    l.k_norm = load_optional_vector(file, t.attn_k_norm);
    l.o = load_matrix(file, t.attn_output);
    l.post_attn_norm = load_optional_vector(file, t.post_attention_norm);
    l.mlp_norm = load_vector(file, t.ffn_norm);
    if (!t.ffn_gate_inp.empty()) {
      l.moe = load_moe(file, t);
    } else {
      l.gate_up = load_gate_up(file, t);
      l.down = load_matrix(file, t.ffn_down);
    }
    l.post_mlp_norm = load_optional_vector(file, t.post_ffw_norm);
  }
  return engine::make_llama_model(config, std::move(w));
}

}  // namespace pagedattn
