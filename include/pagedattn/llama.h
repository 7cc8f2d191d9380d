// A built-in Llama-architecture model with seeded synthetic weights (no
// checkpoint is loaded: outputs are deterministic but meaningless). RMSNorm,
// fused QKV projection with GQA, RoPE (applied by the cache), paged attention
// through PagedKVCache::attention_with_fused_qkv, output projection, SwiGLU
// MLP, LM head. Matrix products go through BLAS (cblas_sgemm), f32 weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "pagedattn/model.h"
#include "pagedattn/tensor_parallel_shard.h"

namespace pagedattn {

class GgufFile;

struct LlamaConfig {
  std::string name = "tiny";
  std::int32_t vocab_size = 1024;
  std::int32_t hidden_size = 256;
  std::int32_t intermediate_size = 688;
  std::int32_t num_layers = 4;
  std::int32_t num_qo_heads = 4;
  std::int32_t num_kv_heads = 2;
  std::int32_t head_dim = 64;
  RopeStyle rope_style = RopeStyle::kNeox;  // GGUF `llama` files: kGptJ (pairs 2t, 2t + 1)
  float rope_theta = 10000.0f;
  float llama3_rope_factor = 0.0f;  // > 0: Llama-3 RoPE scaling (low 1, high 4, original 8192)
  float rms_norm_eps = 1e-5f;
  std::int32_t max_position = 4096;
  bool tie_embeddings = true;  // LM head = embedding matrix (Llama-3.2)
  std::int32_t eos_token_id = 2;
  std::uint64_t weight_seed = 0x5eed;
  // Tensor parallelism: the slice this process computes (see
  // tensor_parallel_shard.h). Every field above describes the whole model;
  // the model's spec() reports this shard's head counts. num_kv_heads and
  // intermediate_size must be multiples of shard.size.
  TensorParallelShard shard{};
};

// Presets: "tiny" (fast demo, ~3M parameters), "small" (~100M), "1b"
// (Llama-3.2-1B shapes, ~1.2B parameters, ~5 GB of f32 weights).
// InvalidArgument for any other name.
LlamaConfig llama_preset(std::string_view name);
std::int64_t llama_parameter_count(const LlamaConfig& config);

// Builds the model and draws its weights (seeded, so two builds are equal).
// With config.shard.size > 1: draws the whole model's weights and keeps the
// shard's slice, so the shards of one config add up to its whole model.
std::unique_ptr<Model> make_llama_model(const LlamaConfig& config);

struct GgufModelOptions {
  std::int32_t max_position = 0;  // longest sequence; 0: the file's context length
  // Tensor parallelism (see LlamaConfig.shard). Q8_0 / Q4_0 / Q4_1 weights
  // also need the shard's attention-output and down-projection input
  // columns (num_qo_heads / size x head_dim, intermediate_size / size) to be
  // whole 32-weight blocks.
  TensorParallelShard shard{};
};

// Loads a Llama-family GGUF file (architectures llama and qwen2; weights
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K). Q8_0 / Q4_0 / Q4_1
// weights are kept as stored and multiplied in place; the other types are
// dequantised to f32 at load. InvalidArgument / Unsupported naming the file
// and the key or tensor for a file that cannot be served.
std::unique_ptr<Model> make_gguf_model(const std::string& path,
                                       const GgufModelOptions& options = {});
// The same from an open file (weights are copied out of it: the file may close).
std::unique_ptr<Model> make_gguf_model(const GgufFile& file, const GgufModelOptions& options = {});

}  // namespace pagedattn
