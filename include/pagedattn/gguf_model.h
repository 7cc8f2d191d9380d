// Llama-family hyper-parameters and tensor names read from a GGUF file.
//
// Architectures: "llama" (Llama 2/3, SmolLM2, TinyLlama, Mistral-style) and
// "qwen2" (adds q/k/v biases).
//
// RoPE layout -- which pagedattn RopeStyle to use:
//  * llama: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)
//    reorders the rows of attn_q / attn_k within each head: row 2i + s of the
//    GGUF weight is HF row i + s * head_dim / 2 (reshape(n_head, 2, hd/2, ..)
//    .swapaxes(1, 2)). HF's rotate_half ("neox") pairs (i, i + hd/2) thereby
//    become adjacent pairs (2i, 2i + 1), and llama.cpp runs llama with its
//    normal rope mode (LLAMA_ROPE_TYPE_NORM), rotating adjacent pairs. So
//    with GGUF llama weights as stored, use the interleaved / GPT-J style
//    (RopeStyle::kGptJ); frequency of pair i is theta^(-2i / head_dim).
//  * qwen2: weights are not permuted and llama.cpp uses LLAMA_ROPE_TYPE_NEOX:
//    use the neox style (pairs (i, i + hd/2)).
// Either way the attention output is the same as HF's model for the same
// checkpoint; only the q/k feature order inside a head differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/gguf.h"

namespace pagedattn {

enum class GgufArch { kLlama, kQwen2 };

// How q/k pairs are rotated (see the header comment).
enum class GgufRopeLayout {
  kInterleaved,  // adjacent pairs (2i, 2i + 1): llama (pagedattn RopeStyle::kGptJ)
  kNeox,         // pairs (i, i + head_dim / 2): qwen2 (RopeStyle::kNeox)
};

struct GgufRopeScaling {
  std::string type = "none";                 // "{arch}.rope.scaling.type": none, linear, yarn, ...
  float factor = 1.0f;                       // "{arch}.rope.scaling.factor" (1 when absent)
  std::int64_t original_context_length = 0;  // 0 when absent
  // Llama 3 style scaling is stored as per-frequency divisors in the F32
  // tensor "rope_freqs.weight" [head_dim / 2] (llama.cpp divides each pair's
  // frequency by its entry); empty when the file has none.
  std::string freq_factors_tensor;
};

// Tensor names of one transformer block (ggml dims, [in, out]).
struct GgufLayerTensors {
  std::string attn_norm;    // [hidden]
  std::string attn_q;       // [hidden, heads * head_dim]
  std::string attn_k;       // [hidden, kv_heads * head_dim]
  std::string attn_v;       // [hidden, kv_heads * head_dim]
  std::string attn_output;  // [heads * head_dim, hidden]
  // qwen2 biases ([heads * head_dim] / [kv_heads * head_dim]); empty if absent.
  std::string attn_q_bias, attn_k_bias, attn_v_bias;
  std::string ffn_norm;  // [hidden]
  std::string ffn_gate;  // [hidden, intermediate]
  std::string ffn_up;    // [hidden, intermediate]
  std::string ffn_down;  // [intermediate, hidden]
};

struct GgufModelConfig {
  GgufArch arch = GgufArch::kLlama;
  std::string arch_name;  // "llama" / "qwen2"
  std::string name;       // general.name, "" when absent
  std::int64_t num_layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_qo_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t vocab_size = 0;
  std::int64_t context_length = 0;
  float rope_theta = 10000.0f;
  GgufRopeLayout rope_layout = GgufRopeLayout::kInterleaved;
  GgufRopeScaling rope_scaling;
  float rms_norm_eps = 1e-5f;
  bool tie_embeddings = false;     // no "output.weight": the LM head is token_embd
  std::int64_t bos_token_id = -1;  // -1 when absent
  std::int64_t eos_token_id = -1;

  std::string token_embedding = "token_embd.weight";  // [hidden, vocab]
  std::string output_norm = "output_norm.weight";     // [hidden]
  std::string output;  // [hidden, vocab]: "output.weight", or token_embedding when tied
  std::vector<GgufLayerTensors> layers;
};

// Reads and checks the configuration: every required key present with a
// sane value, every tensor present with the shape the hyper-parameters
// imply and a type dequantize_row supports. InvalidArgument naming the key
// or tensor; Unsupported for another architecture or a partial rotary
// dimension.
GgufModelConfig read_model_config(const GgufFile& file);

}  // namespace pagedattn
