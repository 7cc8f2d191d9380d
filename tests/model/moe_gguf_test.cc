// qwen2moe / qwen3moe files the test writes: the expert keys are read, the
// 3-D expert tensors load per expert (quantised ones sliced out of the
// tensor's blocks) and give the logits of a copy whose tensors are all F32
// (those sliced after dequantising), and refusals name the problem.
// Hugging Face transformers checks the architectures themselves
// (python/tests/test_model_families.py, families qwen2moe and qwen3moe).
#include <gtest/gtest.h>

#include <cmath>

#include "model/gguf_model_support.h"
#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"

namespace pagedattn {
// A namespace of its own: the unity build merges this file with others.
namespace moe_tests {
namespace {

using test::as_f32;
using test::GgufTestTensor;
using test::GgufWriter;

using test::moe_model;

TEST(GgufMoe, ExpertKeysAreRead) {
  for (const char* arch : {"qwen2moe", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    const std::vector<std::byte> bytes = moe_model(arch).build();
    const GgufModelConfig c = read_model_config(GgufFile::parse({bytes.data(), bytes.size()}));
    const bool qwen3 = std::string(arch) == "qwen3moe";
    EXPECT_EQ(c.arch, qwen3 ? GgufArch::kQwen3Moe : GgufArch::kQwen2Moe);
    EXPECT_EQ(c.num_experts, 4);
    EXPECT_EQ(c.num_experts_used, 2);
    EXPECT_EQ(c.expert_intermediate_size, 32);
    EXPECT_EQ(c.shared_expert_intermediate_size, qwen3 ? 0 : 64);
    EXPECT_EQ(c.normalize_expert_weights, qwen3);
    EXPECT_TRUE(c.layers[1].ffn_gate.empty() && c.layers[1].ffn_down.empty());
    EXPECT_EQ(c.layers[1].ffn_down_exps, "blk.1.ffn_down_exps.weight");
    EXPECT_EQ(c.layers[1].ffn_gate_shexp.empty(), qwen3);
  }
}

TEST(GgufMoe, QuantisedExpertsGiveTheLogitsOfTheirF32Values) {
  for (const char* arch : {"qwen2moe", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    test::expect_same_logits_as_f32_copy(moe_model(arch));
  }
}

TEST(GgufMoe, RefusalsNameTheProblem) {
  // Mixtral's files say "llama" with experts: refused by name, not by a missing ffn_gate.
  GgufWriter mixtral = test::tiny_model("llama", false, false);
  mixtral.kv_u32("llama.expert_count", 8);
  const std::vector<std::byte> m = mixtral.build();
  test::expect_throws<Unsupported>(
      [&] {
        read_model_config(GgufFile::parse({m.data(), m.size()}, "mixtral.gguf"));
      },
      {"mixtral.gguf", "llama.expert_count = 8", "qwen2moe and qwen3moe"});
  const std::vector<std::byte> t = moe_model("qwen3moe", {.used = 5}).build();
  test::expect_throws<InvalidArgument>(
      [&] {
        read_model_config(GgufFile::parse({t.data(), t.size()}, "moe.gguf"));
      },
      {"qwen3moe.expert_used_count = 5 exceeds qwen3moe.expert_count = 4"});
  const std::vector<std::byte> bytes = moe_model("qwen2moe").build();
  GgufModelOptions options;
  options.shard = {1, 2, [](std::span<float>) {}};
  test::expect_throws<InvalidArgument>(
      [&] {
        make_gguf_model(GgufFile::parse({bytes.data(), bytes.size()}), options);
      },
      {"ffn_down_exps"});  // each rank's 16 of an expert's 32 Q4_1 columns: not a block
}

}  // namespace
}  // namespace moe_tests
}  // namespace pagedattn
