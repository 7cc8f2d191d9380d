// read_model_config: Llama-family hyper-parameters and tensor names.
#include <algorithm>
#include <string>
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

GgufLayerTensors layer_tensor_names(std::int64_t layer, bool with_qkv_bias) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  GgufLayerTensors t;
  t.attn_norm = p + "attn_norm.weight";
  t.attn_q = p + "attn_q.weight";
  t.attn_k = p + "attn_k.weight";
  t.attn_v = p + "attn_v.weight";
  t.attn_output = p + "attn_output.weight";
  if (with_qkv_bias) {
    t.attn_q_bias = p + "attn_q.bias";
    t.attn_k_bias = p + "attn_k.bias";
    t.attn_v_bias = p + "attn_v.bias";
  }
  t.ffn_norm = p + "ffn_norm.weight";
  t.ffn_gate = p + "ffn_gate.weight";
  t.ffn_up = p + "ffn_up.weight";
  t.ffn_down = p + "ffn_down.weight";
  return t;
}

void check_tensors(const ConfigReader& r, const GgufModelConfig& c) {
  const std::int64_t h = c.hidden_size, q = c.num_qo_heads * c.head_dim,
                     kv = c.num_kv_heads * c.head_dim, ff = c.intermediate_size;
  r.expect_tensor(c.token_embedding, {h, c.vocab_size});
  r.expect_tensor(c.output_norm, {h});
  if (!c.tie_embeddings) r.expect_tensor(c.output, {h, c.vocab_size});
  for (const GgufLayerTensors& t : c.layers) {
    r.expect_tensor(t.attn_norm, {h});
    r.expect_tensor(t.attn_q, {h, q});
    r.expect_tensor(t.attn_k, {h, kv});
    r.expect_tensor(t.attn_v, {h, kv});
    r.expect_tensor(t.attn_output, {q, h});
    if (!t.attn_q_bias.empty()) {
      r.expect_tensor(t.attn_q_bias, {q});
      r.expect_tensor(t.attn_k_bias, {kv});
      r.expect_tensor(t.attn_v_bias, {kv});
    }
    r.expect_tensor(t.ffn_norm, {h});
    r.expect_tensor(t.ffn_gate, {h, ff});
    r.expect_tensor(t.ffn_up, {h, ff});
    r.expect_tensor(t.ffn_down, {ff, h});
  }
}

}  // namespace

GgufModelConfig read_model_config(const GgufFile& file) {
  GgufModelConfig c;
  c.arch_name = std::string(file.get_string("general.architecture"));
  if (c.arch_name == "llama") {
    c.arch = GgufArch::kLlama;
    c.rope_layout = GgufRopeLayout::kInterleaved;
  } else if (c.arch_name == "qwen2") {
    c.arch = GgufArch::kQwen2;
    c.rope_layout = GgufRopeLayout::kNeox;
  } else {
    throw Unsupported(detail::concat("gguf ", file.source_name(), ": general.architecture '",
                                     c.arch_name, "' is not supported (llama, qwen2)"));
  }
  if (file.has("general.name")) c.name = std::string(file.get_string("general.name"));
  const ConfigReader r(file, c.arch_name);

  c.num_layers = r.positive("block_count");
  c.hidden_size = r.positive("embedding_length");
  c.intermediate_size = r.positive("feed_forward_length");
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
  const std::int64_t rotary_dim = r.positive_or("rope.dimension_count", c.head_dim);
  require<Unsupported>(rotary_dim == c.head_dim, "gguf ", file.source_name(), ": ",
                       r.key("rope.dimension_count"), " = ", rotary_dim,
                       " (partial rotary) differs from the head dim ", c.head_dim);
  c.context_length = r.positive("context_length");
  c.rope_theta = r.float_or("rope.freq_base", 10000.0f);
  require(c.rope_theta > 0, "gguf ", file.source_name(), ": ", r.key("rope.freq_base"), " = ",
          c.rope_theta, " must be positive");
  c.rms_norm_eps = r.float_or("attention.layer_norm_rms_epsilon", 1e-5f);
  require(c.rms_norm_eps > 0, "gguf ", file.source_name(), ": ",
          r.key("attention.layer_norm_rms_epsilon"), " = ", c.rms_norm_eps, " must be positive");

  if (file.has(r.key("rope.scaling.type")))
    c.rope_scaling.type = std::string(file.get_string(r.key("rope.scaling.type")));
  c.rope_scaling.factor = r.float_or("rope.scaling.factor", 1.0f);
  c.rope_scaling.original_context_length = r.positive_or("rope.scaling.original_context_length", 0);
  if (file.find_tensor("rope_freqs.weight") != nullptr) {
    c.rope_scaling.freq_factors_tensor = "rope_freqs.weight";
    r.expect_tensor("rope_freqs.weight", {c.head_dim / 2});
  }

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
  c.layers.reserve(static_cast<std::size_t>(std::min<std::int64_t>(c.num_layers, 4096)));
  require(c.num_layers <= static_cast<std::int64_t>(file.tensors().size()), "gguf ",
          file.source_name(), ": ", r.key("block_count"), " = ", c.num_layers, " exceeds the ",
          file.tensors().size(), " tensors in the file");
  for (std::int64_t layer = 0; layer < c.num_layers; ++layer)
    c.layers.push_back(layer_tensor_names(layer, qkv_bias));
  check_tensors(r, c);
  return c;
}

}  // namespace pagedattn
