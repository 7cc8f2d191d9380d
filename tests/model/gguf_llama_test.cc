// make_gguf_model on small files the test writes: every supported weight
// type (in place: Q8_0 / Q4_0 / Q4_1; dequantised at load: F32, F16, BF16,
// Q4_K, Q5_K, Q6_K), tied and separate LM heads, qwen2 biases. Each file's
// logits must equal those of a copy whose tensors are all F32 holding the
// dequantised values - the in-place kernels and the fused q/k/v and
// gate/up matrices against plain f32 products - and errors name the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/gguf_model_support.h"
#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {

using test::as_f32;
using test::GgufTestTensor;
using test::GgufWriter;
using test::TinyShape;
using test::TinyTypes;

GgufTestTensor f32_tensor(std::string name, const std::vector<float>& values) {
  std::vector<std::byte> data(values.size() * sizeof(float));
  std::memcpy(data.data(), values.data(), data.size());
  return {std::move(name),
          static_cast<std::uint32_t>(GgufType::kF32),
          {values.size()},
          std::move(data),
          std::nullopt};
}

TEST(GgufLlama, InPlaceQuantisedWeightsGiveTheLogitsOfTheirF32Values) {
  test::expect_same_logits_as_f32_copy(test::tiny_model("llama", true, false));
  test::expect_same_logits_as_f32_copy(test::tiny_model("llama", false, false));
  TinyTypes all_in_place{.o = GgufType::kQ4_1, .gate = GgufType::kQ8_0};
  test::expect_same_logits_as_f32_copy(test::tiny_model("llama", false, false, {}, all_in_place));
}

TEST(GgufLlama, KQuantsAndFloatTypesLoad) {
  const TinyShape wide{.hidden = 256, .ff = 512};  // K-quant rows are 256-weight blocks
  test::expect_same_logits_as_f32_copy(test::tiny_model("llama", false, false, wide,
                                                        {.embedding = GgufType::kQ6_K,
                                                         .output = GgufType::kQ5_K,
                                                         .q = GgufType::kQ4_K,
                                                         .k = GgufType::kQ4_K,
                                                         .v = GgufType::kQ6_K,
                                                         .o = GgufType::kF32,
                                                         .gate = GgufType::kQ5_K,
                                                         .up = GgufType::kBF16,
                                                         .down = GgufType::kF16}));
}

TEST(GgufLlama, Qwen2BiasesAreAdded) {
  const GgufWriter w = test::tiny_model("qwen2", false, true);
  test::expect_same_logits_as_f32_copy(w);
  const std::vector<std::byte> bytes = w.build();
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()});
  EXPECT_EQ(read_model_config(file).rope_layout, GgufRopeLayout::kNeox);
}

// Every architecture's own tensors (fused phi3 weights, q/k norms, sandwich
// norms) and settings (windows, softcaps, RoPE scaling) load, and its
// quantised weights give the logits of their f32 values. Hugging Face
// transformers checks the architectures themselves
// (python/tests/test_model_families.py).
TEST(GgufLlama, EveryArchitectureLoads) {
  for (const char* arch : {"qwen3", "gemma2", "gemma3", "phi3"}) {
    SCOPED_TRACE(arch);
    GgufWriter w = test::tiny_model(arch, false, false, {.layers = 7});
    w.kv_u32(std::string(arch) + ".attention.sliding_window", 3);
    w.kv_f32(std::string(arch) + ".attn_logit_softcapping", 5.0f);
    w.kv_f32(std::string(arch) + ".final_logit_softcapping", 3.0f);
    w.kv_string(std::string(arch) + ".rope.scaling.type", "linear");
    w.kv_f32(std::string(arch) + ".rope.scaling.factor", 2.0f);
    test::expect_same_logits_as_f32_copy(w);
  }
  GgufWriter llama3 = test::tiny_model("llama", true, false);
  llama3.tensor(f32_tensor("rope_freqs.weight", {1.0f, 1.0f, 1.5f, 2.0f, 4.0f, 8.0f, 8.0f, 8.0f}));
  GgufWriter yarn = test::tiny_model("qwen2", false, true);
  yarn.kv_string("qwen2.rope.scaling.type", "yarn").kv_f32("qwen2.rope.scaling.factor", 4.0f);
  yarn.kv_u32("qwen2.rope.scaling.original_context_length", 512);
  for (const GgufWriter* w : {&llama3, &yarn}) test::expect_same_logits_as_f32_copy(*w);
}

TEST(GgufLlama, ErrorsNameTheFileAndTheProblem) {
  GgufWriter negative = test::tiny_model("llama", true, false);
  negative.tensor(
      f32_tensor("rope_freqs.weight", {1.0f, 1.0f, 1.0f, -2.0f, 1.0f, 1.0f, 1.0f, 1.0f}));
  const std::vector<std::byte> negative_bytes = negative.build();
  test::expect_throws<InvalidArgument>(
      [&] {
        make_gguf_model(GgufFile::parse({negative_bytes.data(), negative_bytes.size()}));
      },
      {"freq_factors[3] = -2 must be finite and > 0"});
  test::expect_throws<InvalidArgument>([] { make_gguf_model({"/nonexistent/model.gguf"}); },
                                       {"/nonexistent/model.gguf"});
  GgufWriter falcon = test::tiny_model("falcon", true, false);
  const std::vector<std::byte> bytes = falcon.build();
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()}, "falcon.gguf");
  test::expect_throws<Unsupported>([&] { make_gguf_model(file); },
                                   {"falcon.gguf", "general.architecture 'falcon'"});
  const std::vector<std::byte> plain = test::tiny_model("llama", true, false).build();
  const GgufFile ok = GgufFile::parse({plain.data(), plain.size()});
  test::expect_throws<InvalidArgument>([&] { make_gguf_model(ok, {.max_position = -1}); },
                                       {"max_position = -1"});
}

}  // namespace
}  // namespace pagedattn
