#include "model/gguf_model_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"

namespace pagedattn::test {

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
