#include "model/gguf_model_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"

namespace pagedattn::test {
namespace {

using namespace tiny_deepseek;

// kv_b [H (nope + v)][latent] as F32 values, shared by both forms of a file.
std::vector<float> kv_b_values(std::uint32_t layer) {
  std::vector<float> v(kHeads * (kNope + kV) * kLatent);
  for (std::size_t i = 0; i < v.size(); ++i)  // a fixed scramble in [-0.5, 0.5)
    v[i] = static_cast<float>(((i * 2654435761u + layer * 40503u) % 1000u) / 1000.0 - 0.5);
  return v;
}

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The key/value up-projections of `layer` in the file's form.
void add_up_projections(GgufWriter& w, const DeepseekForm& f, std::uint32_t layer) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const std::vector<float> kv_b = kv_b_values(layer);
  if (layer == 1 && !f.layer1_up_projections) return;
  if (!f.split) {
    w.tensor(GgufTestTensor{p + "attn_kv_b.weight",
                            std::uint32_t(GgufType::kF32),
                            {kLatent, kHeads * (kNope + kV)},
                            f32_bytes(kv_b),
                            {}});
    return;
  }
  // The converter's split: k_b[h] = (key rows of head h)^T, v_b[h] = its value rows.
  std::vector<float> k_b(kHeads * kLatent * kNope), v_b(kHeads * kV * kLatent);
  for (std::size_t h = 0; h < kHeads; ++h) {
    const float* head = kv_b.data() + h * (kNope + kV) * kLatent;
    for (std::size_t i = 0; i < kNope; ++i)
      for (std::size_t j = 0; j < kLatent; ++j)
        k_b[(h * kLatent + j) * kNope + i] = head[i * kLatent + j];
    std::copy_n(head + kNope * kLatent, kV * kLatent, v_b.data() + h * kV * kLatent);
  }
  w.tensor(GgufTestTensor{p + "attn_k_b.weight",
                          std::uint32_t(GgufType::kF32),
                          {kNope, kLatent, kHeads},
                          f32_bytes(k_b),
                          {}});
  w.tensor(GgufTestTensor{p + "attn_v_b.weight",
                          std::uint32_t(GgufType::kF32),
                          {kLatent, kV, kHeads},
                          f32_bytes(v_b),
                          {}});
}

// Keys as llama.cpp's converter writes them for the form.
void add_keys(GgufWriter& w, const DeepseekForm& f) {
  const auto u32 = [&](const std::string& suffix, std::uint64_t value) {
    for (const auto& [key, override_value] : f.overrides)
      if (key == suffix) value = override_value;
    w.kv_u32("deepseek2." + suffix, static_cast<std::uint32_t>(value));
  };
  w.kv_string("general.architecture", "deepseek2").kv_string("general.name", "tiny-deepseek");
  u32("block_count", 2);
  u32("context_length", 256);
  u32("embedding_length", kHidden);
  u32("feed_forward_length", kFf);
  u32("attention.head_count", kHeads);
  u32("attention.head_count_kv", f.split ? 1 : kHeads);
  w.kv_f32("deepseek2.rope.freq_base", 10000.0f);
  w.kv_f32("deepseek2.attention.layer_norm_rms_epsilon", 1e-6f);
  u32("attention.kv_lora_rank", kLatent);
  u32("rope.dimension_count", kRope);
  if (f.q_lora_rank > 0) u32("attention.q_lora_rank", f.q_lora_rank);
  u32("attention.key_length", f.split ? kLatent + kRope : kNope + kRope);
  u32("attention.value_length", f.split ? kLatent : kV);
  if (f.split) {
    u32("attention.key_length_mla", kNope + kRope);
    u32("attention.value_length_mla", kV);
  }
  u32("leading_dense_block_count", 1);
  u32("expert_count", kExperts);
  u32("expert_used_count", 2);
  u32("expert_feed_forward_length", kExpertFf);
  u32("expert_shared_count", 1);
  w.kv_f32("deepseek2.expert_weights_scale", 1.5f);
  u32("expert_gating_func", f.sigmoid ? 2 : 1);
  if (f.sigmoid) {
    u32("expert_group_count", 4);
    u32("expert_group_used_count", 2);
    w.kv_bool("deepseek2.expert_weights_norm", true);
  }
}

}  // namespace

GgufWriter deepseek_model(const DeepseekForm& f) {
  GgufWriter w;
  add_keys(w, f);
  const GgufType q8 = f.quantised ? GgufType::kQ8_0 : GgufType::kF32;
  const GgufType q4 = f.quantised ? GgufType::kQ4_0 : GgufType::kF32;
  const std::uint64_t h = kHidden, q = kHeads * (kNope + kRope);
  std::uint64_t seed = 1;
  w.tensor("token_embd.weight", q8, {h, kVocab}, seed++);
  w.tensor("output_norm.weight", GgufType::kF32, {h}, seed++);
  w.tensor("output.weight", q4, {h, kVocab}, seed++);
  for (std::uint32_t l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w.tensor(p + "attn_norm.weight", GgufType::kF32, {h}, seed++);
    if (f.q_lora_rank > 0) {
      w.tensor(p + "attn_q_a.weight", q8, {h, f.q_lora_rank}, seed++);
      w.tensor(p + "attn_q_a_norm.weight", GgufType::kF32, {f.q_lora_rank}, seed++);
      w.tensor(p + "attn_q_b.weight", q8, {f.q_lora_rank, q}, seed++);
    } else {
      w.tensor(p + "attn_q.weight", q4, {h, q}, seed++);
    }
    w.tensor(p + "attn_kv_a_mqa.weight", q8, {h, kLatent + kRope}, seed++);
    w.tensor(p + "attn_kv_a_norm.weight", GgufType::kF32, {kLatent}, seed++);
    add_up_projections(w, f, l);
    w.tensor(p + "attn_output.weight", q8, {kHeads * kV, h}, seed++);
    w.tensor(p + "ffn_norm.weight", GgufType::kF32, {h}, seed++);
    if (l == 0) {  // leading dense layer
      w.tensor(p + "ffn_gate.weight", GgufType::kF16, {h, kFf}, seed++);
      w.tensor(p + "ffn_up.weight", q8, {h, kFf}, seed++);
      w.tensor(p + "ffn_down.weight", q8, {kFf, h}, seed++);
      continue;
    }
    w.tensor(p + "ffn_gate_inp.weight", GgufType::kF32, {h, kExperts}, seed++);
    if (f.sigmoid) w.tensor(p + "exp_probs_b.bias", GgufType::kF32, {kExperts}, seed++);
    w.tensor(p + "ffn_gate_exps.weight", q4, {h, kExpertFf, kExperts}, seed++);
    w.tensor(p + "ffn_up_exps.weight", q8, {h, kExpertFf, kExperts}, seed++);
    w.tensor(p + "ffn_down_exps.weight", q8, {kExpertFf, h, kExperts}, seed++);
    w.tensor(p + "ffn_gate_shexp.weight", GgufType::kF16, {h, kExpertFf}, seed++);
    w.tensor(p + "ffn_up_shexp.weight", q8, {h, kExpertFf}, seed++);
    w.tensor(p + "ffn_down_shexp.weight", q8, {kExpertFf, h}, seed++);
  }
  return w;
}

GgufWriter moe_model(const std::string& arch, TinyExperts e) {
  const bool qwen3 = arch == "qwen3moe";
  GgufWriter w = tiny_model(arch, qwen3, !qwen3, {.hidden = std::uint32_t(e.hidden)});
  w.kv_u32(arch + ".expert_count", std::uint32_t(e.experts))
      .kv_u32(arch + ".expert_used_count", e.used);
  w.kv_u32(arch + ".expert_feed_forward_length", std::uint32_t(e.expert_ff));
  if (!qwen3) w.kv_u32(arch + ".expert_shared_feed_forward_length", std::uint32_t(e.shared_ff));
  std::uint64_t seed = 1000;
  for (std::uint32_t l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (qwen3) {
      w.tensor(p + "attn_q_norm.weight", GgufType::kF32, {e.hidden / 4}, seed++);
      w.tensor(p + "attn_k_norm.weight", GgufType::kF32, {e.hidden / 4}, seed++);
    }
    w.tensor(p + "ffn_gate_inp.weight", GgufType::kF32, {e.hidden, e.experts}, seed++);
    w.tensor(p + "ffn_gate_exps.weight", GgufType::kQ4_0, {e.hidden, e.expert_ff, e.experts},
             seed++);
    w.tensor(p + "ffn_up_exps.weight", GgufType::kQ8_0, {e.hidden, e.expert_ff, e.experts}, seed++);
    w.tensor(p + "ffn_down_exps.weight", GgufType::kQ4_1, {e.expert_ff, e.hidden, e.experts},
             seed++);
    if (qwen3) continue;
    // Layer 0's gate 1-D (older converters), layer 1's [1][H] (current ones).
    w.tensor(
        p + "ffn_gate_inp_shexp.weight", GgufType::kF32,
        l == 0 ? std::vector<std::uint64_t>{e.hidden} : std::vector<std::uint64_t>{e.hidden, 1},
        seed++);
    w.tensor(p + "ffn_gate_shexp.weight", GgufType::kQ8_0, {e.hidden, e.shared_ff}, seed++);
    w.tensor(p + "ffn_up_shexp.weight", GgufType::kF16, {e.hidden, e.shared_ff}, seed++);
    w.tensor(p + "ffn_down_shexp.weight", GgufType::kQ4_0, {e.shared_ff, e.hidden}, seed++);
  }
  return w;
}

std::vector<std::byte> as_f32(const GgufWriter& metadata_source, const GgufFile& file) {
  GgufWriter w = metadata_source;
  w.clear_tensors();
  for (const GgufTensor& t : file.tensors()) {
    const std::vector<float> values = file.dequantize(t);
    std::vector<std::byte> data(values.size() * sizeof(float));
    std::memcpy(data.data(), values.data(), data.size());
    std::vector<std::uint64_t> dims(t.dims.begin(), t.dims.end());
    w.tensor(GgufTestTensor{std::string(t.name), static_cast<std::uint32_t>(GgufType::kF32), dims,
                            std::move(data), std::nullopt});
  }
  return w.build();
}

std::vector<float> teacher_forced_logits(Model& model, const std::vector<std::int32_t>& tokens,
                                         bool deterministic) {
  const ModelSpec& s = model.spec();
  KVCacheConfig config = kv_cache_config(s);
  config.page_size = 4;
  config.num_pages = 8;
  config.kv_dtype = DType::kF32;
  PagedKVCache cache(config);
  const SeqId seq = 0;
  const auto n = static_cast<std::int64_t>(tokens.size());
  std::vector<std::int32_t> rows;
  for (std::int32_t i = 0; i < n; ++i) rows.push_back(i);
  std::vector<float> out(tokens.size() * std::size_t(s.vocab_size));
  cache.add_sequence(seq);
  cache.begin_forward({&seq, 1}, {&n, 1});
  model.forward({tokens, rows, deterministic}, cache, out);
  cache.end_forward();
  return out;
}

void expect_same_logits_as_f32_copy(const GgufWriter& w, const std::vector<std::int32_t>& tokens) {
  const std::vector<std::byte> bytes = w.build();
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()}, "model.gguf");
  const std::vector<std::byte> f32_bytes = as_f32(w, file);
  const GgufFile f32_file = GgufFile::parse({f32_bytes.data(), f32_bytes.size()}, "model-f32.gguf");
  const std::vector<float> got = teacher_forced_logits(*make_gguf_model(file), tokens);
  const std::vector<float> want = teacher_forced_logits(*make_gguf_model(f32_file), tokens);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(want[i])) << i;
    ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::abs(want[i]))) << "logit " << i;
  }
}

}  // namespace pagedattn::test
