// deepseek2 files the test writes: the MLA and routing keys are read in both
// file forms, the old single attn_kv_b and the split attn_k_b / attn_v_b of
// the same weights give the same logits, quantised weights (per-head slices
// of 3-D tensors among them) give the logits of their F32 values, and
// refusals name the key or tensor. Hugging Face transformers checks the
// architecture itself (python/tests/test_model_families.py, the deepseek-*
// families).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "model/gguf_model_support.h"
#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"
#include "support/in_memory_all_reduce.h"

namespace pagedattn {
// A namespace of its own: the unity build merges this file with others.
namespace deepseek_tests {
namespace {

using test::GgufTestTensor;
using test::GgufWriter;

using namespace test::tiny_deepseek;
using Form = test::DeepseekForm;
using test::deepseek_model;

GgufModelConfig config_of(const GgufWriter& w) {
  const std::vector<std::byte> bytes = w.build();
  return read_model_config(GgufFile::parse({bytes.data(), bytes.size()}, "deepseek.gguf"));
}

std::vector<float> logits_of(const GgufWriter& w, const std::vector<std::int32_t>& tokens) {
  const std::vector<std::byte> bytes = w.build();
  return test::teacher_forced_logits(
      *make_gguf_model(GgufFile::parse({bytes.data(), bytes.size()}, "deepseek.gguf")), tokens);
}

const std::vector<std::int32_t> kTokens = {1, 5, 3, 3, 9, 0, 7, 2, 8};

TEST(GgufDeepseek, LatentAttentionAndRoutingKeysAreRead) {
  for (const bool split : {true, false}) {
    SCOPED_TRACE(split ? "split form" : "attn_kv_b form");
    const GgufModelConfig c = config_of(deepseek_model({split, 64, true}));
    EXPECT_EQ(c.arch, GgufArch::kDeepseek2);
    EXPECT_EQ(c.num_kv_heads, 1);
    EXPECT_EQ(c.head_dim, kLatent + kRope);
    EXPECT_EQ(c.rotary_dim, kRope);
    EXPECT_EQ(c.kv_lora_rank, kLatent);
    EXPECT_EQ(c.q_lora_rank, 64);
    EXPECT_EQ(c.qk_nope_head_dim, kNope);
    EXPECT_EQ(c.v_head_dim, kV);
    EXPECT_EQ(c.rope_layout, GgufRopeLayout::kInterleaved);
    EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / std::sqrt(float(kNope + kRope)));
    EXPECT_EQ(c.leading_dense_layers, 1);
    EXPECT_EQ(c.shared_expert_intermediate_size, kExpertFf);
    EXPECT_FALSE(c.shared_expert_gated);
    EXPECT_EQ(c.expert_gating, GgufExpertGating::kSigmoid);
    EXPECT_EQ(c.expert_groups, 4);
    EXPECT_EQ(c.expert_groups_used, 2);
    EXPECT_TRUE(c.normalize_expert_weights);
    EXPECT_FLOAT_EQ(c.expert_weights_scale, 1.5f);
    EXPECT_EQ(c.layers[0].ffn_down, "blk.0.ffn_down.weight");
    EXPECT_TRUE(c.layers[0].ffn_gate_inp.empty());
    EXPECT_EQ(c.layers[1].exp_probs_b, "blk.1.exp_probs_b.bias");
    EXPECT_EQ(c.layers[1].attn_kv_b.empty(), split);
    EXPECT_EQ(c.layers[1].attn_k_b.empty(), !split);
  }
}

TEST(GgufDeepseek, YarnScalesTheSoftmaxByMscaleSquared) {
  GgufWriter w = deepseek_model({});
  w.kv_string("deepseek2.rope.scaling.type", "yarn").kv_f32("deepseek2.rope.scaling.factor", 40.0f);
  w.kv_u32("deepseek2.rope.scaling.original_context_length", 4096);
  w.kv_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
  const double mscale = 1.0 + 0.1 * std::log(40.0);  // DeepSeek-V3's settings
  EXPECT_NEAR(config_of(w).attention_scale, mscale * mscale / std::sqrt(double(kNope + kRope)),
              1e-7);
  w.kv_f32("deepseek2.rope.scaling.yarn_attn_factor", 0.5f);  // would scale cos and sin
  test::expect_throws<Unsupported>([&] { config_of(w); },
                                   {"deepseek2.rope.scaling.yarn_attn_factor = 0.5"});
}

TEST(GgufDeepseek, BothFormsOfTheSameWeightsGiveTheSameLogits) {
  for (const std::uint32_t q_lora_rank : {0u, 64u}) {
    SCOPED_TRACE(q_lora_rank);
    const std::vector<float> split = logits_of(deepseek_model({true, q_lora_rank}), kTokens);
    const std::vector<float> single = logits_of(deepseek_model({false, q_lora_rank}), kTokens);
    ASSERT_EQ(split.size(), single.size());
    for (std::size_t i = 0; i < split.size(); ++i) {
      ASSERT_TRUE(std::isfinite(split[i])) << i;
      ASSERT_NEAR(split[i], single[i], 1e-5 * (1.0 + std::abs(split[i]))) << "logit " << i;
    }
  }
}

TEST(GgufDeepseek, QuantisedWeightsGiveTheLogitsOfTheirF32Values) {
  for (const bool sigmoid : {false, true}) {
    SCOPED_TRACE(sigmoid ? "sigmoid routing" : "softmax routing");
    test::expect_same_logits_as_f32_copy(deepseek_model({true, 64, sigmoid}), kTokens);
  }
}

// Two sequences in one cache, prefilled in chunks of different lengths and
// then decoded a token per step side by side: every position's logits are
// those of each sequence run alone in one step (the latent rows appended
// step by step, across pages, attend as those written at once). Both runs
// are deterministic, so the logits match bit for bit: outside that mode a
// step's batch picks the latent form (absorbed or expanded) and the BLAS
// kernel's blocking, which associate the sums differently.
TEST(GgufDeepseek, BatchedDecodeStepsGiveTheOneStepLogits) {
  const GgufWriter w = deepseek_model({true, 64, true});
  const std::vector<std::byte> bytes = w.build();
  const auto model = make_gguf_model(GgufFile::parse({bytes.data(), bytes.size()}));
  const std::vector<std::vector<std::int32_t>> seqs = {{1, 5, 3, 3, 9, 0, 7, 2, 8},
                                                       {4, 4, 6, 1, 0, 2, 9}};
  const std::int64_t vocab = model->spec().vocab_size;
  KVCacheConfig config = kv_cache_config(model->spec());
  config.page_size = 4;
  config.num_pages = 16;
  config.kv_dtype = DType::kF32;
  PagedKVCache cache(config);
  const std::vector<SeqId> ids = {0, 1};
  for (SeqId id : ids) cache.add_sequence(id);
  std::vector<std::size_t> done = {0, 0};
  const std::vector<std::size_t> first_chunk = {3, 5};
  while (done[0] < seqs[0].size() || done[1] < seqs[1].size()) {
    std::vector<SeqId> step_ids;
    std::vector<std::int64_t> lengths;
    std::vector<std::int32_t> tokens, rows;
    std::vector<std::pair<std::size_t, std::size_t>> row_of;  // (sequence, position)
    for (std::size_t b = 0; b < 2; ++b) {
      const std::size_t take =
          std::min(seqs[b].size() - done[b], done[b] == 0 ? first_chunk[b] : 1);
      if (take == 0) continue;
      step_ids.push_back(ids[b]);
      lengths.push_back(static_cast<std::int64_t>(take));
      for (std::size_t i = 0; i < take; ++i) {
        rows.push_back(static_cast<std::int32_t>(tokens.size()));
        tokens.push_back(seqs[b][done[b] + i]);
        row_of.emplace_back(b, done[b] + i);
      }
      done[b] += take;
    }
    std::vector<float> logits(rows.size() * std::size_t(vocab));
    cache.begin_forward(step_ids, lengths);
    model->forward({tokens, rows, true}, cache, logits);
    cache.end_forward();
    for (std::size_t r = 0; r < row_of.size(); ++r) {
      const auto [b, position] = row_of[r];
      const std::vector<std::int32_t> prefix(seqs[b].begin(),
                                             seqs[b].begin() + std::ptrdiff_t(position) + 1);
      const std::vector<float> want = test::teacher_forced_logits(*model, prefix, true);
      for (std::int64_t v = 0; v < vocab; ++v) {
        const float expected = want[position * std::size_t(vocab) + std::size_t(v)];
        ASSERT_EQ(logits[r * std::size_t(vocab) + std::size_t(v)], expected)
            << "sequence " << b << ", position " << position << ", logit " << v;
      }
    }
  }
}

// llama_parameter_count of the test model's config: the file's element count.
TEST(GgufDeepseek, ParameterCountIsTheFilesElementCount) {
  const std::vector<std::byte> bytes = deepseek_model({true, 64}).build();
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()});
  std::int64_t elements = 0;
  for (const GgufTensor& t : file.tensors()) elements += t.element_count();
  LlamaConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.intermediate_size = kFf;
  c.num_layers = 2;
  c.num_qo_heads = kHeads;
  c.num_kv_heads = 1;
  c.head_dim = kLatent + kRope;
  c.rotary_dim = kRope;
  c.tie_embeddings = false;
  c.q_lora_rank = 64;
  c.kv_lora_rank = kLatent;
  c.qk_nope_head_dim = kNope;
  c.v_head_dim = kV;
  c.num_experts = kExperts;
  c.num_experts_used = 2;
  c.expert_intermediate_size = kExpertFf;
  c.shared_expert_intermediate_size = kExpertFf;
  c.shared_expert_gated = false;
  c.leading_dense_layers = 1;
  EXPECT_EQ(llama_parameter_count(c), elements);
}

// Two tensor-parallel shards on two threads (their all_reduce_sum meets in
// memory) give the whole model's logits: each rank attends with its query
// heads over the latent rows every rank computes and caches, and holds half
// of every expert's features (the router on both). F32 weights: Q8_0
// halves of the 32-feature experts would not be whole blocks.
TEST(GgufDeepseek, TwoTensorParallelShardsGiveTheWholeModelsLogits) {
  for (const bool sigmoid : {false, true})
    for (const std::uint32_t q_lora_rank : {0u, 64u}) {
      SCOPED_TRACE(::testing::Message()
                   << "sigmoid " << sigmoid << ", q_lora_rank " << q_lora_rank);
      const std::vector<std::byte> bytes =
          deepseek_model({true, q_lora_rank, sigmoid, /*quantised=*/false}).build();
      const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()});
      const std::vector<float> expected =
          test::teacher_forced_logits(*make_gguf_model(file), kTokens);
      test::InMemoryAllReduce reduce(2);
      std::vector<float> got[2];
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
          GgufModelOptions options;
          options.shard = {r, 2, [&](std::span<float> v) { reduce(v); }};
          const auto shard = make_gguf_model(file, options);
          EXPECT_EQ(shard->spec().num_qo_heads, int(kHeads) / 2);
          EXPECT_EQ(shard->spec().num_kv_heads, 1);
          got[r] = test::teacher_forced_logits(*shard, kTokens);
        });
      for (std::thread& t : ranks) t.join();
      EXPECT_EQ(got[0], got[1]);  // the same residual stream and LM head on both
      ASSERT_EQ(got[0].size(), expected.size());
      double worst = 0.0, scale = 1.0;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        worst = std::max(worst, std::abs(double(got[0][i]) - expected[i]));
        scale = std::max(scale, 1.0 + std::abs(double(expected[i])));
      }
      EXPECT_LE(worst, 2e-4 * scale);
      EXPECT_GT(worst, 0.0);  // the partial sums were added in another order
    }
}

TEST(GgufDeepseek, RefusalsNameTheProblem) {
  Form no_up;
  no_up.layer1_up_projections = false;
  test::expect_throws<InvalidArgument>(
      [&] { config_of(deepseek_model(no_up)); },
      {"deepseek.gguf", "layer 1 has neither tensor 'attn_kv_b.weight' nor the split"});
  const auto refused = [](std::vector<std::pair<std::string, std::uint32_t>> overrides,
                          bool sigmoid) {
    Form f;
    f.sigmoid = sigmoid;
    f.overrides = std::move(overrides);
    return deepseek_model(f);
  };
  test::expect_throws<Unsupported>(
      [&] {
        config_of(refused({{"expert_gating_func", 3}}, false));
      },
      {"deepseek2.expert_gating_func = 3", "1 softmax, 2 sigmoid"});
  test::expect_throws<Unsupported>(
      [&] {
        config_of(refused({{"attention.head_count_kv", 2}}, false));
      },
      {"deepseek2.attention.head_count_kv = 2"});
  test::expect_throws<InvalidArgument>(
      [&] {
        config_of(refused({{"expert_group_count", 3}}, true));
      },
      {"deepseek2.expert_group_count = 3"});
  test::expect_throws<InvalidArgument>(
      [&] {
        config_of(refused({{"attention.key_length", 99}}, false));
      },
      {"deepseek2.attention.key_length = 99, expected 40"});
  test::expect_throws<InvalidArgument>(
      [&] {
        config_of(refused({{"rope.dimension_count", 24}}, false));
      },
      {"deepseek2.attention.key_length_mla = 24 must exceed deepseek2.rope.dimension_count = 24"});
  const GgufWriter full = deepseek_model({});
  const std::vector<std::byte> bytes = full.build();
  GgufModelOptions options;
  options.shard = {1, 3, [](std::span<float>) {}};
  test::expect_throws<InvalidArgument>(
      [&] {
        make_gguf_model(GgufFile::parse({bytes.data(), bytes.size()}), options);
      },
      {"cannot be split over 3 ranks", "num_qo_heads = 4", "expert_intermediate_size = 32",
       "Tensor-parallel sizes that work for this model: 1, 2, 4"});
  // Two ranks split each Q8_0 expert's 32 features into 16-column halves of
  // ffn_down_exps: not whole blocks.
  options.shard = {1, 2, [](std::span<float>) {}};
  test::expect_throws<InvalidArgument>(
      [&] {
        make_gguf_model(GgufFile::parse({bytes.data(), bytes.size()}), options);
      },
      {"ffn_down"});
  LlamaConfig synthetic;
  synthetic.num_kv_heads = 1;
  synthetic.kv_lora_rank = 48;
  synthetic.qk_nope_head_dim = 16;
  synthetic.v_head_dim = 16;
  synthetic.rotary_dim = 16;
  synthetic.head_dim = 64;
  test::expect_throws<InvalidArgument>([&] { make_llama_model(synthetic); },
                                       {"kv_lora_rank = 48", "no synthetic weights"});
}

}  // namespace
}  // namespace deepseek_tests
}  // namespace pagedattn
