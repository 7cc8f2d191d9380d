// read_model_config: Llama-family hyper-parameters and tensor names.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/errors.h"
#include "pagedattn/gguf_model.h"

namespace pagedattn {
namespace {

constexpr std::int64_t kMaxHyperParameter = std::int64_t{1} << 31;

// Reads "{arch}.<suffix>" keys and checks tensors, naming the file in errors.
class ConfigReader {
 public:
  ConfigReader(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  // A required positive integer.
  std::int64_t positive(std::string_view suffix) const {
    const std::string k = key(suffix);
    const std::int64_t value = file_.get_i64(k);
    // The bound keeps products of two hyper-parameters far from overflow.
    require(value > 0 && value <= kMaxHyperParameter, "gguf ", file_.source_name(), ": key '", k,
            "' = ", value, " is not in [1, ", kMaxHyperParameter, "]");
    return value;
  }

  std::int64_t positive_or(std::string_view suffix, std::int64_t fallback) const {
    return file_.has(key(suffix)) ? positive(suffix) : fallback;
  }

  // An optional integer that may be 0 (counts such as leading dense layers).
  std::int64_t non_negative_or(std::string_view suffix, std::int64_t fallback) const {
    const std::string k = key(suffix);
    if (!file_.has(k)) return fallback;
    const std::int64_t value = file_.get_i64(k);
    require(value >= 0 && value <= kMaxHyperParameter, "gguf ", file_.source_name(), ": key '", k,
            "' = ", value, " is not in [0, ", kMaxHyperParameter, "]");
    return value;
  }

  const GgufFile& file() const { return file_; }

  float float_or(std::string_view suffix, float fallback) const {
    const std::string k = key(suffix);
    return file_.has(k) ? file_.get_f32(k) : fallback;
  }

  // Checks tensor `name` exists with `dims` and a dequantisable type.
  void expect_tensor(const std::string& name, std::vector<std::int64_t> dims) const {
    const GgufTensor& t = file_.tensor(name);
    if (t.dims != dims) {
      throw InvalidArgument(detail::concat("gguf ", file_.source_name(), ": tensor '", name,
                                           "' has dims ", format(t.dims), ", expected ",
                                           format(dims), " from the hyper-parameters"));
    }
    const GgufTypeInfo& info = gguf_type_info(t.type);
    require<Unsupported>(info.dequantizable, "gguf ", file_.source_name(), ": tensor '", name,
                         "' has type ", info.name, ", which pagedattn cannot dequantise");
  }

  // A vector of `length` stored 1-D or as a [1][length] PyTorch weight
  // (ggml dims {length, 1}: current converters write qwen2moe's
  // ffn_gate_inp_shexp so, older ones squeezed it).
  void expect_row_tensor(const std::string& name, std::int64_t length) const {
    const GgufTensor& t = file_.tensor(name);
    expect_tensor(name, t.dims.size() == 2 ? std::vector<std::int64_t>{length, 1}
                                           : std::vector<std::int64_t>{length});
  }

 private:
  static std::string format(const std::vector<std::int64_t>& dims) {
    std::string s = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }

  const GgufFile& file_;
  std::string arch_;
};

std::int64_t optional_token_id(const GgufFile& file, std::string_view key) {
  return file.has(key) ? file.get_i64(key) : -1;
}

// Which mixture of experts an architecture's MLPs are.
enum class MoeKind : std::uint8_t {
  kNone,              // a dense gated MLP (ffn_gate / ffn_up / ffn_down)
  kRouted,            // routed experts, top-k weights renormalised (qwen3moe)
  kRoutedPlusShared,  // routed experts as weighted, plus a gated shared expert (qwen2moe)
  kDeepseek,          // leading dense layers, then DeepSeek's routing and ungated shared experts
};

// What differs between the architectures, beyond the keys they all share.
struct ArchTraits {
  GgufArch arch;
  const char* name;
  GgufRopeLayout rope_layout;
  bool fused_qkv = false;       // phi3: attn_qkv, and ffn_up holds gate | up
  bool qk_norm = false;         // attn_q_norm / attn_k_norm
  bool sandwich_norms = false;  // post_attention_norm / post_ffw_norm
  bool gemma = false;           // GELU-tanh, sqrt(hidden) embedding scale
  // Layers in a window/global period (the last of each is global); 0: every
  // layer windowed when the file has a window, 1: none windowed.
  std::int64_t window_period = 0;
  MoeKind moe = MoeKind::kNone;
  bool latent_attention = false;  // deepseek2: multi-head latent attention
};

// llama.cpp's converter permutes llama's q/k rows (see gguf_model.h); the
// other architectures keep Hugging Face's order and use neox pairs.
constexpr ArchTraits kArchitectures[] = {
    {GgufArch::kLlama, "llama", GgufRopeLayout::kInterleaved},
    {GgufArch::kQwen2, "qwen2", GgufRopeLayout::kNeox},
    {GgufArch::kQwen3, "qwen3", GgufRopeLayout::kNeox, false, true},
    {GgufArch::kGemma2, "gemma2", GgufRopeLayout::kNeox, false, false, true, true, 2},
    {GgufArch::kGemma3, "gemma3", GgufRopeLayout::kNeox, false, true, true, true, 6},
    {GgufArch::kPhi3, "phi3", GgufRopeLayout::kNeox, true},
    {GgufArch::kQwen2Moe, "qwen2moe", GgufRopeLayout::kNeox, false, false, false, false, 0,
     MoeKind::kRoutedPlusShared},
    {GgufArch::kQwen3Moe, "qwen3moe", GgufRopeLayout::kNeox, false, true, false, false, 0,
     MoeKind::kRouted},
    // DeepSeek's rotary half of q and k rotates adjacent pairs on the weights
    // as stored (HF's view_as_complex / rope_interleave; llama.cpp's
    // LLAMA_ROPE_TYPE_NORM for deepseek2, no permutation in the converter).
    {GgufArch::kDeepseek2, "deepseek2", GgufRopeLayout::kInterleaved, false, false, false, false, 0,
     MoeKind::kDeepseek, true},
};

const ArchTraits& arch_traits(const GgufFile& file, const std::string& name) {
  for (const ArchTraits& t : kArchitectures)
    if (name == t.name) return t;
  throw Unsupported(
      detail::concat("gguf ", file.source_name(), ": general.architecture '", name,
                     "' is not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe, "
                     "qwen3moe, deepseek2)"));
}

GgufLayerTensors layer_tensor_names(std::int64_t layer, const ArchTraits& a, bool with_qkv_bias) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  GgufLayerTensors t;
  t.attn_norm = p + "attn_norm.weight";
  if (a.fused_qkv) {
    t.attn_qkv = p + "attn_qkv.weight";
  } else {
    t.attn_q = p + "attn_q.weight";
    t.attn_k = p + "attn_k.weight";
    t.attn_v = p + "attn_v.weight";
  }
  t.attn_output = p + "attn_output.weight";
  if (with_qkv_bias) {
    t.attn_q_bias = p + "attn_q.bias";
    t.attn_k_bias = p + "attn_k.bias";
    t.attn_v_bias = p + "attn_v.bias";
  }
  if (a.qk_norm) {
    t.attn_q_norm = p + "attn_q_norm.weight";
    t.attn_k_norm = p + "attn_k_norm.weight";
  }
  if (a.sandwich_norms) {
    t.post_attention_norm = p + "post_attention_norm.weight";
    t.post_ffw_norm = p + "post_ffw_norm.weight";
  }
  t.ffn_norm = p + "ffn_norm.weight";
  if (a.moe != MoeKind::kNone) {
    t.ffn_gate_inp = p + "ffn_gate_inp.weight";
    t.ffn_gate_exps = p + "ffn_gate_exps.weight";
    t.ffn_up_exps = p + "ffn_up_exps.weight";
    t.ffn_down_exps = p + "ffn_down_exps.weight";
    if (a.moe == MoeKind::kRoutedPlusShared) {
      t.ffn_gate_inp_shexp = p + "ffn_gate_inp_shexp.weight";
      t.ffn_gate_shexp = p + "ffn_gate_shexp.weight";
      t.ffn_up_shexp = p + "ffn_up_shexp.weight";
      t.ffn_down_shexp = p + "ffn_down_shexp.weight";
    }
    return t;
  }
  if (!a.fused_qkv) t.ffn_gate = p + "ffn_gate.weight";
  t.ffn_up = p + "ffn_up.weight";
  t.ffn_down = p + "ffn_down.weight";
  return t;
}

// deepseek2's block: MLA tensors, then a dense MLP (leading layers) or the
// experts. The split attn_k_b / attn_v_b are used when the file has them,
// else attn_kv_b; selection bias and shared experts only when present.
GgufLayerTensors latent_layer_tensor_names(const GgufFile& file, std::int64_t layer,
                                           const GgufModelConfig& c) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  GgufLayerTensors t;
  t.attn_norm = p + "attn_norm.weight";
  if (c.q_lora_rank > 0) {
    t.attn_q_a = p + "attn_q_a.weight";
    t.attn_q_a_norm = p + "attn_q_a_norm.weight";
    t.attn_q_b = p + "attn_q_b.weight";
  } else {
    t.attn_q = p + "attn_q.weight";
  }
  t.attn_kv_a_mqa = p + "attn_kv_a_mqa.weight";
  t.attn_kv_a_norm = p + "attn_kv_a_norm.weight";
  const bool split = file.find_tensor(p + "attn_k_b.weight") != nullptr ||
                     file.find_tensor(p + "attn_v_b.weight") != nullptr;
  if (split) {
    t.attn_k_b = p + "attn_k_b.weight";
    t.attn_v_b = p + "attn_v_b.weight";
  } else {
    require(file.find_tensor(p + "attn_kv_b.weight") != nullptr, "gguf ", file.source_name(),
            ": layer ", layer,
            " has neither tensor 'attn_kv_b.weight' nor the split 'attn_k_b.weight' + "
            "'attn_v_b.weight' (MLA's key/value up-projections)");
    t.attn_kv_b = p + "attn_kv_b.weight";
  }
  t.attn_output = p + "attn_output.weight";
  t.ffn_norm = p + "ffn_norm.weight";
  if (c.num_experts == 0 || layer < c.leading_dense_layers) {
    t.ffn_gate = p + "ffn_gate.weight";
    t.ffn_up = p + "ffn_up.weight";
    t.ffn_down = p + "ffn_down.weight";
    return t;
  }
  t.ffn_gate_inp = p + "ffn_gate_inp.weight";
  t.ffn_gate_exps = p + "ffn_gate_exps.weight";
  t.ffn_up_exps = p + "ffn_up_exps.weight";
  t.ffn_down_exps = p + "ffn_down_exps.weight";
  if (file.find_tensor(p + "exp_probs_b.bias") != nullptr) t.exp_probs_b = p + "exp_probs_b.bias";
  if (c.shared_expert_intermediate_size > 0) {
    t.ffn_gate_shexp = p + "ffn_gate_shexp.weight";
    t.ffn_up_shexp = p + "ffn_up_shexp.weight";
    t.ffn_down_shexp = p + "ffn_down_shexp.weight";
  }
  return t;
}

// The MLA tensors of one block (see GgufLayerTensors).
void check_latent_attention_tensors(const ConfigReader& r, const GgufModelConfig& c,
                                    const GgufLayerTensors& t) {
  const std::int64_t h = c.hidden_size, heads = c.num_qo_heads, rope = c.rotary_dim,
                     nope = c.qk_nope_head_dim, latent = c.kv_lora_rank, v = c.v_head_dim;
  const std::int64_t q = heads * (nope + rope);
  if (c.q_lora_rank > 0) {
    r.expect_tensor(t.attn_q_a, {h, c.q_lora_rank});
    r.expect_tensor(t.attn_q_a_norm, {c.q_lora_rank});
    r.expect_tensor(t.attn_q_b, {c.q_lora_rank, q});
  } else {
    r.expect_tensor(t.attn_q, {h, q});
  }
  r.expect_tensor(t.attn_kv_a_mqa, {h, latent + rope});
  r.expect_tensor(t.attn_kv_a_norm, {latent});
  if (!t.attn_kv_b.empty()) {
    r.expect_tensor(t.attn_kv_b, {latent, heads * (nope + v)});
  } else {
    r.expect_tensor(t.attn_k_b, {nope, latent, heads});
    r.expect_tensor(t.attn_v_b, {latent, v, heads});
  }
  r.expect_tensor(t.attn_output, {heads * v, h});
}

// q, k, v (or fused qkv), their biases and norms, the output projection.
void check_dense_attention_tensors(const ConfigReader& r, const GgufModelConfig& c,
                                   const GgufLayerTensors& t) {
  const std::int64_t h = c.hidden_size, d = c.head_dim, q = c.num_qo_heads * d,
                     kv = c.num_kv_heads * d;
  const auto optional = [&](const std::string& name, std::vector<std::int64_t> dims) {
    if (!name.empty()) r.expect_tensor(name, std::move(dims));
  };
  optional(t.attn_qkv, {h, q + 2 * kv});
  optional(t.attn_q, {h, q});
  optional(t.attn_k, {h, kv});
  optional(t.attn_v, {h, kv});
  r.expect_tensor(t.attn_output, {q, h});
  optional(t.attn_q_bias, {q});
  optional(t.attn_k_bias, {kv});
  optional(t.attn_v_bias, {kv});
  optional(t.attn_q_norm, {d});
  optional(t.attn_k_norm, {d});
  optional(t.post_attention_norm, {h});
}

void check_tensors(const ConfigReader& r, const GgufModelConfig& c) {
  const std::int64_t h = c.hidden_size, ff = c.intermediate_size;
  r.expect_tensor(c.token_embedding, {h, c.vocab_size});
  r.expect_tensor(c.output_norm, {h});
  if (!c.tie_embeddings) r.expect_tensor(c.output, {h, c.vocab_size});
  const auto optional = [&](const std::string& name, std::vector<std::int64_t> dims) {
    if (!name.empty()) r.expect_tensor(name, std::move(dims));
  };
  for (const GgufLayerTensors& t : c.layers) {
    r.expect_tensor(t.attn_norm, {h});
    if (c.kv_lora_rank > 0)
      check_latent_attention_tensors(r, c, t);
    else
      check_dense_attention_tensors(r, c, t);
    r.expect_tensor(t.ffn_norm, {h});
    optional(t.ffn_gate, {h, ff});
    optional(t.ffn_up, {h, t.ffn_gate.empty() ? 2 * ff : ff});
    optional(t.ffn_down, {ff, h});
    const std::int64_t experts = c.num_experts, expert_ff = c.expert_intermediate_size,
                       shared_ff = c.shared_expert_intermediate_size;
    optional(t.ffn_gate_inp, {h, experts});
    optional(t.ffn_gate_exps, {h, expert_ff, experts});
    optional(t.ffn_up_exps, {h, expert_ff, experts});
    optional(t.ffn_down_exps, {expert_ff, h, experts});
    if (!t.ffn_gate_inp_shexp.empty()) r.expect_row_tensor(t.ffn_gate_inp_shexp, h);
    optional(t.ffn_gate_shexp, {h, shared_ff});
    optional(t.ffn_up_shexp, {h, shared_ff});
    optional(t.ffn_down_shexp, {shared_ff, h});
    optional(t.exp_probs_b, {experts});
    optional(t.post_ffw_norm, {h});
  }
}

void read_heads(const GgufFile& file, const ConfigReader& r, GgufModelConfig& c) {
  c.num_qo_heads = r.positive("attention.head_count");
  c.num_kv_heads = r.positive_or("attention.head_count_kv", c.num_qo_heads);
  require(c.num_qo_heads % c.num_kv_heads == 0, "gguf ", file.source_name(), ": ",
          r.key("attention.head_count"), " = ", c.num_qo_heads, " is not a multiple of ",
          r.key("attention.head_count_kv"), " = ", c.num_kv_heads);
  require(c.hidden_size % c.num_qo_heads == 0 || file.has(r.key("attention.key_length")), "gguf ",
          file.source_name(), ": ", r.key("embedding_length"), " = ", c.hidden_size,
          " is not a multiple of the head count ", c.num_qo_heads, " and no ",
          r.key("attention.key_length"), " is given");
  c.head_dim = r.positive_or("attention.key_length", c.hidden_size / c.num_qo_heads);
  const std::int64_t value_dim = r.positive_or("attention.value_length", c.head_dim);
  require<Unsupported>(value_dim == c.head_dim, "gguf ", file.source_name(), ": ",
                       r.key("attention.value_length"), " = ", value_dim, " differs from ",
                       r.key("attention.key_length"), " = ", c.head_dim);
  require(c.head_dim % 2 == 0, "gguf ", file.source_name(), ": head dim ", c.head_dim, " is odd");
  c.rotary_dim = r.positive_or("rope.dimension_count", c.head_dim);
  require(c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim, "gguf ", file.source_name(), ": ",
          r.key("rope.dimension_count"), " = ", c.rotary_dim,
          " must be even and at most the head dim ", c.head_dim);
}

void read_rope(const GgufFile& file, const ConfigReader& r, GgufModelConfig& c) {
  c.rope_theta = r.float_or("rope.freq_base", 10000.0f);
  require(c.rope_theta > 0 && std::isfinite(c.rope_theta), "gguf ", file.source_name(), ": ",
          r.key("rope.freq_base"), " = ", c.rope_theta, " must be positive");
  GgufRopeScaling& s = c.rope_scaling;
  if (file.has(r.key("rope.scaling.type")))
    s.type = std::string(file.get_string(r.key("rope.scaling.type")));
  s.factor = r.float_or("rope.scaling.factor", 1.0f);
  s.original_context_length = r.positive_or("rope.scaling.original_context_length", 0);
  s.yarn_beta_fast = r.float_or("rope.scaling.yarn_beta_fast", 32.0f);
  s.yarn_beta_slow = r.float_or("rope.scaling.yarn_beta_slow", 1.0f);
  s.yarn_attention_factor = r.float_or("rope.scaling.yarn_attn_factor", 0.0f);
  require<Unsupported>(s.type == "none" || s.type == "linear" || s.type == "yarn", "gguf ",
                       file.source_name(), ": ", r.key("rope.scaling.type"), " = '", s.type,
                       "' is not supported (none, linear, yarn; llama3 scaling comes as the "
                       "tensor rope_freqs.weight)");
  if (s.type != "none")
    require(std::isfinite(s.factor) && s.factor >= 1.0f, "gguf ", file.source_name(), ": ",
            r.key("rope.scaling.factor"), " = ", s.factor, " must be >= 1 for scaling '", s.type,
            "'");
  if (s.type == "yarn") {
    if (s.original_context_length == 0)
      s.original_context_length =
          static_cast<std::int64_t>(static_cast<double>(c.context_length) / s.factor);
    require(s.yarn_beta_fast > s.yarn_beta_slow && s.yarn_beta_slow > 0.0f &&
                s.original_context_length > 0 && s.yarn_attention_factor >= 0.0f,
            "gguf ", file.source_name(), ": yarn scaling with beta_fast = ", s.yarn_beta_fast,
            ", beta_slow = ", s.yarn_beta_slow, ", original context ", s.original_context_length,
            ", attn_factor = ", s.yarn_attention_factor, " is inconsistent");
  }
  if (file.find_tensor("rope_factors_long.weight") ||
      file.find_tensor("rope_factors_short.weight")) {
    s.long_factors_tensor = "rope_factors_long.weight";
    s.short_factors_tensor = "rope_factors_short.weight";
    r.expect_tensor(s.long_factors_tensor, {c.rotary_dim / 2});
    r.expect_tensor(s.short_factors_tensor, {c.rotary_dim / 2});
    s.attention_factor = r.float_or("rope.scaling.attn_factor", 0.0f);
    require(s.original_context_length > 1 && std::isfinite(s.attention_factor) &&
                s.attention_factor >= 0.0f,
            "gguf ", file.source_name(), ": LongRoPE needs ",
            r.key("rope.scaling.original_context_length"), " > 1 (got ", s.original_context_length,
            ") and a finite ", r.key("rope.scaling.attn_factor"), " >= 0 (got ", s.attention_factor,
            ")");
  }
  if (file.find_tensor("rope_freqs.weight") != nullptr) {
    s.freq_factors_tensor = "rope_freqs.weight";
    r.expect_tensor("rope_freqs.weight", {c.rotary_dim / 2});
  }
}

// Which layers have the window: "{arch}.attention.sliding_window_pattern"
// as gguf's writer stores it (one bool per layer, true: windowed) or as an
// integer period (the last layer of each period global); else the
// architecture's period.
std::vector<bool> windowed_layers(const GgufFile& file, const ConfigReader& r, const ArchTraits& a,
                                  std::int64_t num_layers) {
  const std::string key = r.key("attention.sliding_window_pattern");
  std::vector<bool> windowed(static_cast<std::size_t>(num_layers));
  const GgufValue* pattern = file.find(key);
  if (pattern != nullptr && pattern->type == GgufValueType::kArray) {
    require(pattern->element_type == GgufValueType::kBool &&
                pattern->count == static_cast<std::uint64_t>(num_layers),
            "gguf ", file.source_name(), ": key '", key, "' has type ", pattern->type_name(),
            " with ", pattern->count, " elements, expected one bool per layer (", num_layers, ")");
    for (std::size_t layer = 0; layer < windowed.size(); ++layer)
      windowed[layer] = pattern->elements[layer] != std::byte{0};
    return windowed;
  }
  const std::int64_t period = r.positive_or("attention.sliding_window_pattern", a.window_period);
  for (std::int64_t layer = 0; layer < num_layers; ++layer)
    windowed[static_cast<std::size_t>(layer)] = period == 0 || layer % period < period - 1;
  return windowed;
}

void read_gemma_settings(const GgufFile& file, const ConfigReader& r, const ArchTraits& a,
                         GgufModelConfig& c);

// The experts' counts and widths (llama.cpp's fallbacks for the widths). A
// dense architecture's file with experts (Mixtral is written as llama) is
// refused by name rather than failing on a missing ffn_gate.
void read_experts(const GgufFile& file, const ConfigReader& r, const ArchTraits& a,
                  GgufModelConfig& c) {
  if (a.moe == MoeKind::kNone) {
    require<Unsupported>(
        !file.has(r.key("expert_count")) || file.get_i64(r.key("expert_count")) == 0, "gguf ",
        file.source_name(), ": ", r.key("expert_count"), " = ",
        file.has(r.key("expert_count")) ? file.get_i64(r.key("expert_count")) : 0,
        ": mixture-of-experts '", a.name,
        "' files are not supported (experts run for qwen2moe and qwen3moe)");
    return;
  }
  c.num_experts = r.positive("expert_count");
  c.num_experts_used = r.positive("expert_used_count");
  require(c.num_experts_used <= c.num_experts, "gguf ", file.source_name(), ": ",
          r.key("expert_used_count"), " = ", c.num_experts_used, " exceeds ", r.key("expert_count"),
          " = ", c.num_experts);
  c.expert_intermediate_size =
      r.positive_or("expert_feed_forward_length", c.intermediate_size / c.num_experts_used);
  require(c.expert_intermediate_size >= 1, "gguf ", file.source_name(), ": no ",
          r.key("expert_feed_forward_length"), " and ", r.key("feed_forward_length"), " = ",
          c.intermediate_size, " / ", r.key("expert_used_count"), " = ", c.num_experts_used,
          " is 0");
  if (a.moe == MoeKind::kRoutedPlusShared) {
    c.shared_expert_intermediate_size =
        r.positive_or("expert_shared_feed_forward_length", c.intermediate_size);
    c.shared_expert_gated = true;
  }
  c.normalize_expert_weights = a.moe == MoeKind::kRouted;
}

// Per-layer windows, scales and caps of the attention.
void read_attention_kinds(const GgufFile& file, const ConfigReader& r, const ArchTraits& a,
                          GgufModelConfig& c) {
  // 0 means no window (phi3 files write it so).
  const std::int64_t window = file.has(r.key("attention.sliding_window")) &&
                                      file.get_i64(r.key("attention.sliding_window")) == 0
                                  ? 0
                                  : r.positive_or("attention.sliding_window", 0);
  c.layer_windows.assign(static_cast<std::size_t>(c.num_layers), 0);
  if (window == 0) return read_gemma_settings(file, r, a, c);
  const std::vector<bool> windowed = windowed_layers(file, r, a, c.num_layers);
  for (std::size_t layer = 0; layer < windowed.size(); ++layer)
    if (windowed[layer]) c.layer_windows[layer] = window;
  read_gemma_settings(file, r, a, c);
}

void read_gemma_settings(const GgufFile& file, const ConfigReader& r, const ArchTraits& a,
                         GgufModelConfig& c) {
  if (a.arch == GgufArch::kGemma3) {
    c.rope_theta_windowed = r.float_or("rope.freq_base_swa", 10000.0f);
    require(std::isfinite(c.rope_theta_windowed) && c.rope_theta_windowed > 0.0f, "gguf ",
            file.source_name(), ": ", r.key("rope.freq_base_swa"), " = ", c.rope_theta_windowed,
            " must be finite and > 0");
  }
  if (a.gemma) {
    // llama.cpp's rule (GGUF has no query_pre_attn_scalar): the 27B models
    // (46 / 62 layers) scale by hidden / heads, the others by the head dim.
    const bool is_27b = (a.arch == GgufArch::kGemma2 && c.num_layers == 46) ||
                        (a.arch == GgufArch::kGemma3 && c.num_layers == 62);
    const double pre_attn =
        is_27b ? double(c.hidden_size) / double(c.num_qo_heads) : double(c.head_dim);
    const float scalar = r.float_or("attention.query_pre_attn_scalar", float(pre_attn));
    require(std::isfinite(scalar) && scalar > 0.0f, "gguf ", file.source_name(), ": ",
            r.key("attention.query_pre_attn_scalar"), " = ", scalar, " must be finite and > 0");
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(double(scalar)));
    c.embedding_scale = static_cast<float>(std::sqrt(double(c.hidden_size)));
    c.activation = GgufActivation::kGeluTanh;
  }
  c.attention_softcap = r.float_or("attn_logit_softcapping", 0.0f);
  c.final_softcap = r.float_or("final_logit_softcapping", 0.0f);
  for (const auto& [suffix, value] : {std::pair{"attn_logit_softcapping", c.attention_softcap},
                                      std::pair{"final_logit_softcapping", c.final_softcap}})
    require(std::isfinite(value) && value >= 0.0f, "gguf ", file.source_name(), ": ", r.key(suffix),
            " = ", value, " must be finite and >= 0");
}

// deepseek2's heads: the per-head query/key width (nope + rope) and value
// width come from key_length_mla / value_length_mla in the split form
// (there key_length / value_length describe the latent cache row) and from
// key_length / value_length in the old one. The cache then holds one KV head
// of kv_lora_rank + rope per token.
void read_latent_heads(const GgufFile& file, const ConfigReader& r, GgufModelConfig& c) {
  c.num_qo_heads = r.positive("attention.head_count");
  const std::int64_t kv_heads = r.positive_or("attention.head_count_kv", c.num_qo_heads);
  require<Unsupported>(kv_heads == 1 || kv_heads == c.num_qo_heads, "gguf ", file.source_name(),
                       ": ", r.key("attention.head_count_kv"), " = ", kv_heads,
                       " is neither 1 (MLA as MQA) nor the head count ", c.num_qo_heads);
  c.kv_lora_rank = r.positive("attention.kv_lora_rank");
  c.rotary_dim = r.positive("rope.dimension_count");
  require(c.rotary_dim % 2 == 0, "gguf ", file.source_name(), ": ", r.key("rope.dimension_count"),
          " = ", c.rotary_dim, " is odd");
  const bool split_form = file.has(r.key("attention.key_length_mla"));
  const char* key_length = split_form ? "attention.key_length_mla" : "attention.key_length";
  const char* value_length = split_form ? "attention.value_length_mla" : "attention.value_length";
  const std::int64_t qk_head_dim = r.positive(key_length);
  c.v_head_dim = r.positive(value_length);
  require(qk_head_dim > c.rotary_dim, "gguf ", file.source_name(), ": ", r.key(key_length), " = ",
          qk_head_dim, " must exceed ", r.key("rope.dimension_count"), " = ", c.rotary_dim,
          " (the no-RoPE part of each head is the difference)");
  c.qk_nope_head_dim = qk_head_dim - c.rotary_dim;
  if (split_form)
    for (const auto& [suffix, want] :
         {std::pair{"attention.key_length", c.kv_lora_rank + c.rotary_dim},
          std::pair{"attention.value_length", c.kv_lora_rank}})
      require(r.positive_or(suffix, want) == want, "gguf ", file.source_name(), ": ", r.key(suffix),
              " = ", r.positive_or(suffix, want), ", expected ", want, " beside ",
              r.key("attention.key_length_mla"), " (the latent cache row)");
  // Files that name no q_lora_rank (V2-Lite's) have one attn_q; a file
  // with attn_q_a but no key has the rank in the tensor's shape.
  const GgufTensor* q_a = file.find_tensor("blk.0.attn_q_a.weight");
  c.q_lora_rank = r.non_negative_or("attention.q_lora_rank",
                                    q_a != nullptr && q_a->dims.size() == 2 ? q_a->dims[1] : 0);
  c.num_kv_heads = 1;
  c.head_dim = c.kv_lora_rank + c.rotary_dim;
}

// deepseek2's softmax scale: 1 / sqrt(nope + rope), times mscale^2 under
// YaRN with mscale = 1 + yarn_log_multiplier ln(factor) (llama.cpp's
// deepseek2 graph; Hugging Face's yarn_get_mscale(factor, mscale_all_dim)^2,
// the converter writing yarn_log_multiplier = 0.1 mscale_all_dim). RoPE's
// own cos/sin factor is then 1 (Hugging Face: mscale / mscale_all_dim).
void set_latent_attention_scale(const GgufFile& file, const ConfigReader& r, GgufModelConfig& c) {
  double mscale = 1.0;
  const GgufRopeScaling& s = c.rope_scaling;
  if (s.type == "yarn" && s.factor > 1.0f) {
    const float log_multiplier = r.float_or("rope.scaling.yarn_log_multiplier", 0.0f);
    require(std::isfinite(log_multiplier) && log_multiplier >= 0.0f, "gguf ", file.source_name(),
            ": ", r.key("rope.scaling.yarn_log_multiplier"), " = ", log_multiplier,
            " must be finite and >= 0");
    mscale = 1.0 + double(log_multiplier) * std::log(double(s.factor));
    // cos/sin stay unscaled (see above): a file asking otherwise is refused.
    require<Unsupported>(s.yarn_attention_factor == 0.0f || s.yarn_attention_factor == 1.0f,
                         "gguf ", file.source_name(), ": ", r.key("rope.scaling.yarn_attn_factor"),
                         " = ", s.yarn_attention_factor,
                         " is not supported for deepseek2 (its YaRN magnitude correction comes "
                         "from rope.scaling.yarn_log_multiplier)");
  }
  c.attention_scale =
      static_cast<float>(mscale * mscale / std::sqrt(double(c.qk_nope_head_dim + c.rotary_dim)));
}

// deepseek2's experts (none: every layer dense). Keys absent take llama.cpp's
// defaults: gating softmax, scale 1, no renormalisation, no groups.
void read_deepseek_experts(const GgufFile& file, const ConfigReader& r, GgufModelConfig& c) {
  c.leading_dense_layers = r.non_negative_or("leading_dense_block_count", 0);
  c.num_experts = r.non_negative_or("expert_count", 0);
  if (c.num_experts == 0) return;
  c.num_experts_used = r.positive("expert_used_count");
  require(c.num_experts_used <= c.num_experts, "gguf ", file.source_name(), ": ",
          r.key("expert_used_count"), " = ", c.num_experts_used, " exceeds ", r.key("expert_count"),
          " = ", c.num_experts);
  c.expert_intermediate_size = r.positive("expert_feed_forward_length");
  const std::int64_t shared_experts = r.non_negative_or("expert_shared_count", 0);
  // The shared experts run as one MLP of their summed width (HF's
  // moe_intermediate_size x n_shared_experts).
  c.shared_expert_intermediate_size =
      shared_experts == 0 ? 0
                          : r.positive_or("expert_shared_feed_forward_length",
                                          shared_experts * c.expert_intermediate_size);
  c.expert_weights_scale = r.float_or("expert_weights_scale", 1.0f);
  require(std::isfinite(c.expert_weights_scale) && c.expert_weights_scale > 0.0f, "gguf ",
          file.source_name(), ": ", r.key("expert_weights_scale"), " = ", c.expert_weights_scale,
          " must be finite and > 0");
  c.normalize_expert_weights =
      file.has(r.key("expert_weights_norm")) && file.get_bool(r.key("expert_weights_norm"));
  const std::int64_t gating = r.non_negative_or("expert_gating_func", 1);
  require<Unsupported>(gating == 1 || gating == 2, "gguf ", file.source_name(), ": ",
                       r.key("expert_gating_func"), " = ", gating,
                       " is not supported (1 softmax, 2 sigmoid)");
  c.expert_gating = gating == 2 ? GgufExpertGating::kSigmoid : GgufExpertGating::kSoftmax;
  c.expert_groups = r.non_negative_or("expert_group_count", 0);
  c.expert_groups_used = r.non_negative_or("expert_group_used_count", c.expert_groups);
  if (c.expert_groups <= 1) return;
  const std::int64_t per_group = c.num_experts / c.expert_groups;
  require(c.num_experts % c.expert_groups == 0 && c.expert_groups_used >= 1 &&
              c.expert_groups_used <= c.expert_groups &&
              c.expert_groups_used * per_group >= c.num_experts_used &&
              (c.expert_gating == GgufExpertGating::kSoftmax || per_group >= 2),
          "gguf ", file.source_name(), ": ", r.key("expert_group_count"), " = ", c.expert_groups,
          " and ", r.key("expert_group_used_count"), " = ", c.expert_groups_used, " do not fit ",
          c.num_experts, " experts of which ", c.num_experts_used,
          " are used (groups must divide the experts, sigmoid groups hold >= 2, and the groups "
          "used must hold the experts used)");
}

}  // namespace

GgufModelConfig read_model_config(const GgufFile& file) {
  GgufModelConfig c;
  c.arch_name = std::string(file.get_string("general.architecture"));
  const ArchTraits& a = arch_traits(file, c.arch_name);
  c.arch = a.arch;
  c.rope_layout = a.rope_layout;
  if (file.has("general.name")) c.name = std::string(file.get_string("general.name"));
  const ConfigReader r(file, c.arch_name);

  c.num_layers = r.positive("block_count");
  c.hidden_size = r.positive("embedding_length");
  c.intermediate_size = r.positive("feed_forward_length");
  if (a.latent_attention)
    read_latent_heads(file, r, c);
  else
    read_heads(file, r, c);
  c.context_length = r.positive("context_length");
  read_rope(file, r, c);
  if (a.latent_attention) set_latent_attention_scale(file, r, c);
  c.rms_norm_eps = r.float_or("attention.layer_norm_rms_epsilon", 1e-5f);
  require(c.rms_norm_eps > 0, "gguf ", file.source_name(), ": ",
          r.key("attention.layer_norm_rms_epsilon"), " = ", c.rms_norm_eps, " must be positive");
  require(c.num_layers <= static_cast<std::int64_t>(file.tensors().size()), "gguf ",
          file.source_name(), ": ", r.key("block_count"), " = ", c.num_layers, " exceeds the ",
          file.tensors().size(), " tensors in the file");
  read_attention_kinds(file, r, a, c);
  if (a.moe == MoeKind::kDeepseek)
    read_deepseek_experts(file, r, c);
  else
    read_experts(file, r, a, c);

  const GgufTensor& embedding = file.tensor(c.token_embedding);
  require(embedding.dims.size() == 2, "gguf ", file.source_name(), ": tensor '", c.token_embedding,
          "' has ", embedding.dims.size(), " dims, expected 2");
  c.vocab_size = embedding.dims[1];
  if (file.has(r.key("vocab_size"))) {
    const std::int64_t declared = r.positive("vocab_size");
    require(declared == c.vocab_size, "gguf ", file.source_name(), ": ", r.key("vocab_size"), " = ",
            declared, " differs from the ", c.vocab_size, " rows of ", c.token_embedding);
  }
  c.tie_embeddings = file.find_tensor("output.weight") == nullptr;
  c.output = c.tie_embeddings ? c.token_embedding : "output.weight";
  c.bos_token_id = optional_token_id(file, "tokenizer.ggml.bos_token_id");
  c.eos_token_id = optional_token_id(file, "tokenizer.ggml.eos_token_id");

  const bool qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.layers.reserve(static_cast<std::size_t>(c.num_layers));
  for (std::int64_t layer = 0; layer < c.num_layers; ++layer)
    c.layers.push_back(a.latent_attention ? latent_layer_tensor_names(file, layer, c)
                                          : layer_tensor_names(layer, a, qkv_bias));
  check_tensors(r, c);
  return c;
}

}  // namespace pagedattn
