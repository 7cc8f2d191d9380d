#include "model/gguf_model_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"

namespace pagedattn::test {

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

std::vector<float> teacher_forced_logits(Model& model, const std::vector<std::int32_t>& tokens) {
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
  model.forward({tokens, rows, false}, cache, out);
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
