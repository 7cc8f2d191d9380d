// read_model_config on small llama / qwen2 files written by the test, its
// errors, and the real SmolLM2-135M file when scripts/get_test_model.sh has
// fetched it (PAGEDATTN_TEST_MODEL, else the default cache path; skipped
// when absent).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf_model.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {

using test::expect_throws;
using test::GgufWriter;

using test::tiny_model;
using test::TinyShape;

TEST(GgufModelConfig, LlamaTied) {
  const std::vector<std::byte> bytes = tiny_model("llama", true, false).build();
  const GgufFile f = GgufFile::parse({bytes.data(), bytes.size()});
  const GgufModelConfig c = read_model_config(f);
  EXPECT_EQ(c.arch, GgufArch::kLlama);
  EXPECT_EQ(c.rope_layout, GgufRopeLayout::kInterleaved);
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_qo_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.output, "token_embd.weight");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  ASSERT_EQ(c.layers.size(), 2u);
  EXPECT_EQ(c.layers[1].ffn_down, "blk.1.ffn_down.weight");
  EXPECT_TRUE(c.layers[0].attn_q_bias.empty());
}

TEST(GgufModelConfig, Qwen2WithBiasesAndUntiedHead) {
  GgufWriter w = tiny_model("qwen2", false, true);
  w.kv_string("qwen2.rope.scaling.type", "yarn").kv_f32("qwen2.rope.scaling.factor", 4.0f);
  w.kv_u32("qwen2.rope.scaling.original_context_length", 32768);
  const std::vector<std::byte> bytes = w.build();
  const GgufModelConfig c = read_model_config(GgufFile::parse({bytes.data(), bytes.size()}));
  EXPECT_EQ(c.arch, GgufArch::kQwen2);
  EXPECT_EQ(c.rope_layout, GgufRopeLayout::kNeox);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.output, "output.weight");
  EXPECT_EQ(c.layers[1].attn_v_bias, "blk.1.attn_v.bias");
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_context_length, 32768);
}

GgufModelConfig config_of(const GgufWriter& w) {
  const std::vector<std::byte> bytes = w.build();
  return read_model_config(GgufFile::parse({bytes.data(), bytes.size()}, "m.gguf"));
}

TEST(GgufModelConfig, PartialRotaryAndRopeFactors) {
  GgufWriter w = tiny_model("llama", true, false);
  w.kv_u32("llama.rope.dimension_count", 8);
  w.tensor("rope_freqs.weight", GgufType::kF32, {4});
  const GgufModelConfig c = config_of(w);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.rope_scaling.freq_factors_tensor, "rope_freqs.weight");
  EXPECT_EQ(c.layer_windows, std::vector<std::int64_t>(2, 0));
}

TEST(GgufModelConfig, MistralWindowCoversEveryLayer) {
  GgufWriter w = tiny_model("llama", true, false, {.layers = 3});
  w.kv_u32("llama.attention.sliding_window", 4096);
  EXPECT_EQ(config_of(w).layer_windows, std::vector<std::int64_t>(3, 4096));
}

TEST(GgufModelConfig, Qwen3HasQkNorms) {
  const GgufModelConfig c = config_of(tiny_model("qwen3", false, false));
  EXPECT_EQ(c.arch, GgufArch::kQwen3);
  EXPECT_EQ(c.rope_layout, GgufRopeLayout::kNeox);
  EXPECT_EQ(c.layers[1].attn_q_norm, "blk.1.attn_q_norm.weight");
  EXPECT_EQ(c.layers[1].attn_k_norm, "blk.1.attn_k_norm.weight");
  EXPECT_TRUE(c.layers[1].post_attention_norm.empty());
  EXPECT_EQ(c.activation, GgufActivation::kSilu);
}

TEST(GgufModelConfig, Gemma2AlternatesWindowsAndCapsLogits) {
  GgufWriter w = tiny_model("gemma2", true, false, {.layers = 4});
  w.kv_u32("gemma2.attention.sliding_window", 4096);
  w.kv_f32("gemma2.attn_logit_softcapping", 50.0f).kv_f32("gemma2.final_logit_softcapping", 30.0f);
  const GgufModelConfig c = config_of(w);
  EXPECT_EQ(c.arch, GgufArch::kGemma2);
  EXPECT_EQ(c.layer_windows, (std::vector<std::int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(c.attention_softcap, 50.0f);
  EXPECT_EQ(c.final_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c.attention_scale, 0.25f);  // 1 / sqrt(head dim 16)
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.0f);   // sqrt(hidden 64)
  EXPECT_EQ(c.activation, GgufActivation::kGeluTanh);
  EXPECT_EQ(c.layers[0].post_ffw_norm, "blk.0.post_ffw_norm.weight");
  EXPECT_EQ(c.rope_theta_windowed, 0.0f);
}

TEST(GgufModelConfig, Gemma3FiveLocalLayersPerGlobalOne) {
  GgufWriter w = tiny_model("gemma3", true, false, {.layers = 7});
  w.kv_u32("gemma3.attention.sliding_window", 512);
  w.kv_string("gemma3.rope.scaling.type", "linear").kv_f32("gemma3.rope.scaling.factor", 8.0f);
  const GgufModelConfig c = config_of(w);
  EXPECT_EQ(c.layer_windows, (std::vector<std::int64_t>{512, 512, 512, 512, 512, 0, 512}));
  EXPECT_EQ(c.rope_theta_windowed, 10000.0f);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.layers[0].attn_q_norm, "blk.0.attn_q_norm.weight");
  GgufWriter pattern = tiny_model("gemma3", true, false, {.layers = 3});
  pattern.kv_u32("gemma3.attention.sliding_window", 8);
  pattern.kv_raw(
      "gemma3.attention.sliding_window_pattern", GgufValueType::kArray,
      test::encode_array(GgufValueType::kBool, 3, {std::byte{0}, std::byte{1}, std::byte{1}}));
  EXPECT_EQ(config_of(pattern).layer_windows, (std::vector<std::int64_t>{0, 8, 8}));
  GgufWriter own_base = tiny_model("gemma3", true, false);
  own_base.kv_f32("gemma3.rope.freq_base_swa", 20000.0f);
  EXPECT_EQ(config_of(own_base).rope_theta_windowed, 20000.0f);
}

TEST(GgufModelConfig, Phi3FusesQkvAndGateUp) {
  const GgufModelConfig c = config_of(tiny_model("phi3", false, false));
  EXPECT_EQ(c.arch, GgufArch::kPhi3);
  EXPECT_EQ(c.layers[0].attn_qkv, "blk.0.attn_qkv.weight");
  EXPECT_TRUE(c.layers[0].attn_q.empty());
  EXPECT_TRUE(c.layers[0].ffn_gate.empty());
  EXPECT_EQ(c.layers[0].ffn_up, "blk.0.ffn_up.weight");  // [hidden, 2 ff]: gate, then up
  EXPECT_TRUE(c.rope_scaling.long_factors_tensor.empty());
  GgufWriter longrope = tiny_model("phi3", false, false);
  longrope.kv_u32("phi3.rope.scaling.original_context_length", 512);
  longrope.kv_f32("phi3.rope.scaling.attn_factor", 1.19f);
  longrope.tensor("rope_factors_long.weight", GgufType::kF32, {8});
  longrope.tensor("rope_factors_short.weight", GgufType::kF32, {8});
  const GgufModelConfig l = config_of(longrope);
  EXPECT_EQ(l.rope_scaling.long_factors_tensor, "rope_factors_long.weight");
  EXPECT_EQ(l.rope_scaling.short_factors_tensor, "rope_factors_short.weight");
  EXPECT_EQ(l.rope_scaling.attention_factor, 1.19f);
  GgufWriter no_window = tiny_model("phi3", false, false);
  no_window.kv_u32("phi3.attention.sliding_window", 0);  // what phi3 files without one say
  EXPECT_EQ(config_of(no_window).layer_windows, std::vector<std::int64_t>(2, 0));
}

TEST(GgufModelConfig, ErrorsNameTheKeyOrTensor) {
  const auto config_of = [](const GgufWriter& w) {
    const std::vector<std::byte> bytes = w.build();
    return read_model_config(GgufFile::parse({bytes.data(), bytes.size()}, "m.gguf"));
  };
  expect_throws<Unsupported>([&] { config_of(tiny_model("gpt2", true, false)); },
                             {"general.architecture 'gpt2' is not supported"});
  GgufWriter missing;
  missing.kv_string("general.architecture", "llama");
  expect_throws<InvalidArgument>([&] { config_of(missing); }, {"missing key 'llama.block_count'"});
  TinyShape odd;
  odd.kv_heads = 3;
  expect_throws<InvalidArgument>(
      [&] { config_of(tiny_model("llama", true, false, odd)); },
      {"head_count = 4 is not a multiple of llama.attention.head_count_kv = 3"});
  GgufWriter zero = tiny_model("llama", true, false);
  zero.kv_u32("llama.vocab_size", 11);
  expect_throws<InvalidArgument>([&] { config_of(zero); }, {"llama.vocab_size = 11 differs"});
  GgufWriter partial = tiny_model("llama", true, false);
  partial.kv_u32("llama.rope.dimension_count", 18);
  expect_throws<InvalidArgument>([&] { config_of(partial); },
                                 {"llama.rope.dimension_count = 18 must be even and at most the "
                                  "head dim 16"});
  GgufWriter scaling = tiny_model("llama", true, false);
  scaling.kv_string("llama.rope.scaling.type", "su");
  expect_throws<Unsupported>([&] { config_of(scaling); },
                             {"llama.rope.scaling.type = 'su' is not supported"});
  GgufWriter half_longrope = tiny_model("phi3", false, false);
  half_longrope.tensor("rope_factors_long.weight", GgufType::kF32, {8});
  expect_throws<InvalidArgument>([&] { config_of(half_longrope); },
                                 {"missing tensor 'rope_factors_short.weight'"});
  GgufWriter no_original = tiny_model("phi3", false, false);
  no_original.tensor("rope_factors_long.weight", GgufType::kF32, {8});
  no_original.tensor("rope_factors_short.weight", GgufType::kF32, {8});
  expect_throws<InvalidArgument>([&] { config_of(no_original); },
                                 {"LongRoPE needs phi3.rope.scaling.original_context_length > 1"});
  GgufWriter wrong_factors = tiny_model("llama", true, false);
  wrong_factors.tensor("rope_freqs.weight", GgufType::kF32, {4});
  expect_throws<InvalidArgument>([&] { config_of(wrong_factors); },
                                 {"tensor 'rope_freqs.weight' has dims [4], expected [8]"});
  GgufWriter bad_type = tiny_model("llama", true, false);
  bad_type.kv_u32("llama.block_count", 3);
  expect_throws<InvalidArgument>([&] { config_of(bad_type); },
                                 {"key 'llama.block_count': duplicate key"});
}

// One layer of width 64, 4 heads of 16, 2 KV heads, ff 96; `k_heads` sets
// the width of attn_k; attn_v and the rest are absent.
GgufWriter partial_layer(std::uint64_t k_heads) {
  GgufWriter w;
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 1);
  w.kv_u32("llama.context_length", 64).kv_u32("llama.embedding_length", 64);
  w.kv_u32("llama.feed_forward_length", 96).kv_u32("llama.attention.head_count", 4);
  w.kv_u32("llama.attention.head_count_kv", 2);
  w.tensor("token_embd.weight", GgufType::kF32, {64, 10});
  w.tensor("output_norm.weight", GgufType::kF32, {64});
  w.tensor("blk.0.attn_norm.weight", GgufType::kF32, {64});
  w.tensor("blk.0.attn_q.weight", GgufType::kF32, {64, 64});
  w.tensor("blk.0.attn_k.weight", GgufType::kF32, {64, 16 * k_heads});
  return w;
}

TEST(GgufModelConfig, WrongTensorShapeOrMissingTensor) {
  const auto config_of = [](const GgufWriter& w) {
    const std::vector<std::byte> bytes = w.build();
    return read_model_config(GgufFile::parse({bytes.data(), bytes.size()}, "m.gguf"));
  };
  expect_throws<InvalidArgument>(
      [&] { config_of(partial_layer(4)); },
      {"tensor 'blk.0.attn_k.weight' has dims [64, 64], expected [64, 32]"});
  expect_throws<InvalidArgument>([&] { config_of(partial_layer(2)); },
                                 {"m.gguf: missing tensor 'blk.0.attn_v.weight'"});
  GgufWriter unsupported = partial_layer(2);
  unsupported.tensor("blk.0.attn_v.weight", GgufType::kQ2_K, {256, 32});
  expect_throws<InvalidArgument>([&] { config_of(unsupported); }, {"attn_v.weight", "[256, 32]"});
}

std::string test_model_path() {
  if (const char* env = std::getenv("PAGEDATTN_TEST_MODEL")) return env;
  std::string cache;
  if (const char* c = std::getenv("PAGEDATTN_MODEL_CACHE")) {
    cache = c;
  } else if (const char* home = std::getenv("HOME")) {
    cache = std::string(home) + "/.cache/pagedattn/models";
  }
  return cache + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufModelConfig, RealSmolLM2WhenPresent) {
  const std::string path = test_model_path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "no " << path << " (scripts/get_test_model.sh)";
  const GgufFile f = GgufFile::open(path);
  const GgufModelConfig c = read_model_config(f);
  EXPECT_EQ(c.arch, GgufArch::kLlama);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_qo_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.tokens"), 49152u);
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.merges"), 48900u);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgufType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgufType::kQ4_1);
  // Every weight dequantises to finite values.
  for (const GgufTensor& t : f.tensors()) {
    const std::vector<float> values = f.dequantize(t);
    for (float v : values) ASSERT_TRUE(std::isfinite(v)) << t.name;
  }
}

}  // namespace
}  // namespace pagedattn
