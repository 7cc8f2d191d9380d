// The model's layers in teams (core/team.h: one OpenMP region for the
// step's layers, the products, norms, RoPE and attention split over its
// threads; engine::TeamAttention) give bitwise the logits of the same step
// with a region per piece and the cache's own attention, for every product
// route a step can take: in place, tiles, int8 activations (the
// thread-local choice must reach every thread of a team), bf16 products,
// deterministic mode (its fixed tiles, f32 weights' BLAS tiles included,
// and its fixed KV chunks); with biases, q/k norms, sandwich norms, windows
// and softcaps, mixtures of experts, latent attention (DeepSeek), attention
// split over the threads by keys (a sequence of 600), and the LM head in
// the last team.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "core/team.h"
#include "model/gguf_model_support.h"
#include "model/gguf_writer.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

struct Flags {
  bool int8_activations = false, bf16_products = false, deterministic = false;
};

// A prompt of 40 tokens (norms and RoPE split over the threads, products
// above the int8 and bf16 thresholds) and one of 600 (keys split between
// threads), then decodes of 1, 3 and 4 rows (with two more sequences):
// every step's logits, one after the other.
std::vector<float> steps(Model& model, Flags flags) {
  KVCacheConfig config = kv_cache_config(model.spec());
  config.page_size = 16;
  config.num_pages = 64;
  config.kv_dtype = DType::kF32;  // random weights overflow f16
  if (flags.deterministic) config.attention_plan.fixed_kv_chunk = 256;  // as the engine's
  PagedKVCache cache(config);
  const std::int32_t vocab = model.spec().vocab_size;
  std::vector<float> all;
  const auto step = [&](const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens) {
    std::vector<std::int32_t> tokens, rows;
    std::int64_t total = 0;
    for (std::int64_t n : lens) total += n;
    for (std::int64_t i = 0; i < total; ++i) {
      tokens.push_back(std::int32_t((i * 7 + std::int64_t(all.size())) % vocab));
      rows.push_back(std::int32_t(i));
    }
    std::vector<float> logits(rows.size() * std::size_t(vocab));
    cache.begin_forward(ids, lens);
    ForwardBatch batch{tokens, rows, flags.deterministic};
    batch.int8_activations = flags.int8_activations;
    batch.bf16_products = flags.bf16_products;
    model.forward(batch, cache, logits);
    cache.end_forward();
    all.insert(all.end(), logits.begin(), logits.end());
  };
  for (SeqId s : {0, 1, 2, 3}) cache.add_sequence(s);
  step({0}, {40});
  step({1}, {600});
  step({0}, {1});
  step({1, 2, 3}, {1, 1, 1});
  step({0, 1, 2, 3}, {1, 1, 1, 1});
  return all;
}

struct Restore {
  int threads = omp_get_max_threads();
  ~Restore() {
    omp_set_num_threads(threads);
    core::set_teams_enabled(true);
  }
};

void expect_teams_change_nothing(const test::GgufWriter& w) {
  const std::vector<std::byte> bytes = w.build();
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()}, "model.gguf");
  const std::unique_ptr<Model> model = make_gguf_model(file);
  const Restore restore;
  omp_set_num_threads(3);  // more than the machine may have is fine
  for (const Flags flags :
       {Flags{}, Flags{true, false}, Flags{false, true}, Flags{false, false, true}}) {
    SCOPED_TRACE(flags.int8_activations ? "int8 activations"
                 : flags.bf16_products  ? "bf16 products"
                 : flags.deterministic  ? "deterministic"
                                        : "f32 x");
    core::set_teams_enabled(false);
    const std::vector<float> regions = steps(*model, flags);
    core::set_teams_enabled(true);
    const std::vector<float> teams = steps(*model, flags);
    ASSERT_EQ(teams.size(), regions.size());
    EXPECT_EQ(std::memcmp(teams.data(), regions.data(), teams.size() * sizeof(float)), 0);
    std::size_t finite = 0;
    for (float v : teams) finite += std::isfinite(v) ? 1 : 0;
    EXPECT_EQ(finite, teams.size());
  }
}

TEST(LayerTeams, GiveBitwiseTheLogitsOfARegionPerPiece) {
  const test::TinyShape wide{.hidden = 256, .heads = 4, .kv_heads = 2, .ff = 512, .vocab = 64};
  // q and k in Q4_K, v in Q6_K: the fused projection is two products.
  expect_teams_change_nothing(test::tiny_model("llama", false, false, wide,
                                               {.embedding = GgufType::kQ8_0,
                                                .output = GgufType::kQ6_K,
                                                .q = GgufType::kQ4_K,
                                                .k = GgufType::kQ4_K,
                                                .v = GgufType::kQ6_K,
                                                .o = GgufType::kQ4_K,
                                                .gate = GgufType::kQ5_K,
                                                .up = GgufType::kQ5_K,
                                                .down = GgufType::kQ6_K}));
  expect_teams_change_nothing(test::tiny_model("qwen2", false, true, wide, {}));  // biases
  // f32 weights: deterministic mode's BLAS tiles, split over the team.
  expect_teams_change_nothing(test::tiny_model("llama", false, false, wide,
                                               {.output = GgufType::kF32,
                                                .q = GgufType::kF32,
                                                .k = GgufType::kF32,
                                                .v = GgufType::kF32,
                                                .o = GgufType::kF32,
                                                .gate = GgufType::kF32,
                                                .up = GgufType::kF32,
                                                .down = GgufType::kF32}));
  // Mixtures of experts: each expert's columns split over the team, a
  // shared expert's products over all of it.
  for (const char* arch : {"qwen2moe", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    expect_teams_change_nothing(test::moe_model(
        arch, {.hidden = 256, .experts = 8, .expert_ff = 128, .shared_ff = 192, .used = 3}));
  }
  // Latent attention with a query bottleneck, a leading dense layer, then
  // experts with a shared one: softmax routing and V3's grouped sigmoid.
  for (const bool sigmoid : {false, true}) {
    SCOPED_TRACE(sigmoid ? "deepseek2, sigmoid routing" : "deepseek2");
    expect_teams_change_nothing(test::deepseek_model(
        {.q_lora_rank = 64, .sigmoid = sigmoid, .overrides = {{"context_length", 1024}}}));
  }
  for (const char* arch : {"qwen3", "gemma2"}) {  // q/k norms; sandwich norms
    SCOPED_TRACE(arch);
    test::GgufWriter w = test::tiny_model(arch, false, false, wide, {});
    w.kv_u32(std::string(arch) + ".attention.sliding_window", 5);
    if (std::string(arch) == "gemma2") {  // both softcaps: the last one in the team too
      w.kv_f32("gemma2.attn_logit_softcapping", 50.0f);
      w.kv_f32("gemma2.final_logit_softcapping", 3.0f);
    }
    expect_teams_change_nothing(w);
  }
}

}  // namespace
}  // namespace pagedattn
