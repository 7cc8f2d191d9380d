// Llama presets and the parameter count.
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"

namespace pagedattn {

LlamaConfig llama_preset(std::string_view name) {
  LlamaConfig c;  // the defaults are the "tiny" preset
  if (name == "tiny") return c;
  if (name == "small") {
    c.name = "small";
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_layers = 12;
    c.num_qo_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    return c;
  }
  if (name == "1b") {  // meta-llama/Llama-3.2-1B config.json
    c.name = "1b";
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_layers = 16;
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 64;
    c.rope_theta = 500000.0f;
    c.llama3_rope_factor = 32.0f;
    c.max_position = 131072;
    c.eos_token_id = 128001;
    return c;
  }
  throw InvalidArgument(
      detail::concat("llama_preset: name = '", name, "' is not a preset (tiny, small, 1b)"));
}

namespace {

// One layer's attention weights: q/k/v and output, or latent attention's
// projections (the key/value up-projections counted as HF's kv_b_proj).
std::int64_t attention_parameters(const LlamaConfig& c) {
  const std::int64_t h = c.hidden_size, heads = c.num_qo_heads;
  if (c.kv_lora_rank == 0) {
    const std::int64_t d = c.head_dim;
    return (heads + 2 * c.num_kv_heads) * d * h + h * heads * d;
  }
  const std::int64_t q = heads * (c.qk_nope_head_dim + c.rotary_dim), latent = c.kv_lora_rank;
  const std::int64_t query =
      c.q_lora_rank > 0 ? h * c.q_lora_rank + c.q_lora_rank + std::int64_t{c.q_lora_rank} * q
                        : h * q;
  return query + h * (latent + c.rotary_dim) + latent +
         latent * heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.v_head_dim * h;
}

}  // namespace

std::int64_t llama_parameter_count(const LlamaConfig& c) {
  const std::int64_t h = c.hidden_size;
  const std::int64_t shared = c.shared_expert_intermediate_size > 0
                                  ? 3 * h * c.shared_expert_intermediate_size +
                                        (c.shared_expert_gated ? h : 0)  // + its gate
                                  : 0;
  const std::int64_t dense = 3 * h * c.intermediate_size;
  const std::int64_t experts =
      c.num_experts > 0
          ? c.num_experts * (3 * h * c.expert_intermediate_size + h) + shared  // experts + router
          : dense;
  const std::int64_t layer = 2 * h + attention_parameters(c);
  const std::int64_t embed = std::int64_t{c.vocab_size} * h * (c.tie_embeddings ? 1 : 2);
  const std::int64_t dense_layers = c.num_experts > 0 ? c.leading_dense_layers : 0;
  return embed + c.num_layers * layer + dense_layers * dense +
         (c.num_layers - dense_layers) * experts + h;
}

}  // namespace pagedattn
