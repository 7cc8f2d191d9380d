// Broken weights (NaN or Inf planted in a small GGUF file the test writes):
// a request whose logits are not finite ends with FinishReason::kError and a
// message instead of a token, the rest of its batch carries on and no page
// is left behind; GgufModelOptions.check_tensors refuses such a file at load,
// naming the tensor and the first bad element.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "model/gguf_writer.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/llama.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {

using ::testing::HasSubstr;

constexpr std::uint32_t kVocab = 64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A tiny llama file whose embedding and LM head are F32 (values easy to plant).
std::vector<std::byte> tiny_file() {
  test::TinyTypes types;
  types.embedding = GgufType::kF32;
  types.output = GgufType::kF32;
  return test::tiny_model("llama", /*tied=*/false, /*biases=*/false, {.vocab = kVocab}, types)
      .build();
}

// Where tensor `name`'s data starts in `bytes`.
std::size_t tensor_data_offset(const std::vector<std::byte>& bytes, std::string_view name) {
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()});
  return std::size_t(file.tensor(name).data - bytes.data());
}

void plant_f32(std::vector<std::byte>& bytes, std::string_view tensor, std::size_t element,
               float value) {
  std::memcpy(bytes.data() + tensor_data_offset(bytes, tensor) + element * sizeof(float), &value,
              sizeof(float));
}

std::shared_ptr<Model> load(const std::vector<std::byte>& bytes, bool check_tensors = false) {
  const GgufFile file = GgufFile::parse({bytes.data(), bytes.size()}, "broken.gguf");
  return make_gguf_model(file, {.check_tensors = check_tensors});
}

struct Finished {
  std::map<std::int32_t, std::vector<std::int32_t>> tokens;  // per sample
  std::map<std::int32_t, FinishReason> reasons;              // per sample
  std::string error;
};

struct BatchResult {
  std::map<RequestId, Finished> requests;
  std::int64_t pages_in_use = -1;
};

// Runs every request to the end; `late` is added once the first request has
// failed (its pages then are reused).
BatchResult run_batch(std::shared_ptr<Model> model,
                      const std::vector<std::vector<std::int32_t>>& prompts,
                      const std::vector<SamplingParams>& params,
                      const std::vector<std::int32_t>& late = {}) {
  Engine engine({.model = std::move(model),
                 .kv_memory_bytes = 1 << 20,
                 .page_size = 4,
                 .deterministic = true});
  BatchResult r;
  for (std::size_t i = 0; i < prompts.size(); ++i) engine.add_request(prompts[i], params[i]);
  bool late_added = late.empty();
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) {
      Finished& f = r.requests[out.request_id];
      for (const SampleOutput& s : out.samples) {
        auto& t = f.tokens[s.index];
        t.insert(t.end(), s.new_token_ids.begin(), s.new_token_ids.end());
        if (s.finish_reason != FinishReason::kNone) f.reasons[s.index] = s.finish_reason;
      }
      if (!out.error.empty()) f.error = out.error;
      if (!late_added && !out.error.empty()) {
        engine.add_request(late, params.front());
        late_added = true;
      }
    }
  }
  r.pages_in_use = engine.stats().pages_in_use;
  return r;
}

SamplingParams greedy() {
  return {.max_tokens = 12, .ignore_eos = true};
}
SamplingParams sampled(std::int32_t n) {
  return {.max_tokens = 12, .temperature = 1.0f, .n = n, .seed = 7, .ignore_eos = true};
}

TEST(NonFiniteWeights, NaNLogitsEndTheRequestWithAnErrorWhileTheBatchCarriesOn) {
  const std::vector<std::byte> clean = tiny_file();
  const std::vector<std::vector<std::int32_t>> healthy = {{3, 4, 5, 6, 7}, {8, 9, 10}};
  const std::vector<std::int32_t> late = {11, 12, 13, 14, 15, 16};
  const std::vector<SamplingParams> healthy_params = {greedy(), sampled(2)};
  const BatchResult reference =
      run_batch(load(clean), {healthy[0], healthy[1], late}, {greedy(), sampled(2), greedy()});
  // A token no healthy request reads or draws: its embedding row becomes NaN.
  std::set<std::int32_t> used(late.begin(), late.end());
  for (const auto& p : healthy) used.insert(p.begin(), p.end());
  for (const auto& [id, f] : reference.requests)
    for (const auto& [index, tokens] : f.tokens) used.insert(tokens.begin(), tokens.end());
  std::int32_t poisoned = 0;
  while (used.contains(poisoned)) ++poisoned;
  ASSERT_LT(poisoned, std::int32_t(kVocab));
  std::vector<std::byte> broken = clean;
  plant_f32(broken, "token_embd.weight", std::size_t(poisoned) * 64 + 5, kNaN);

  // 0 and 1: healthy; 2 (greedy) and 3 (sampled, n = 3) read the poisoned token.
  const std::vector<std::int32_t> bad_prompt = {3, poisoned, 4};
  const BatchResult got = run_batch(load(broken), {healthy[0], healthy[1], bad_prompt, bad_prompt},
                                    {greedy(), sampled(2), greedy(), sampled(3)}, late);

  for (RequestId id : {2, 3}) {
    const Finished& f = got.requests.at(id);
    EXPECT_EQ(f.reasons.size(), id == 2 ? 1u : 3u) << id;
    for (const auto& [index, reason] : f.reasons) {
      EXPECT_EQ(reason, FinishReason::kError) << id << "." << index;
      EXPECT_TRUE(f.tokens.at(index).empty()) << "request " << id << " drew a token from NaN";
    }
    EXPECT_THAT(f.error, HasSubstr("request " + std::to_string(id) + ":"));
    EXPECT_THAT(f.error, HasSubstr("64 NaN and 0 Inf of 64 logits"));
    EXPECT_THAT(f.error, HasSubstr("after 0 output tokens"));
  }
  // The healthy requests, and one admitted after the failure onto the freed
  // pages, give exactly their tokens without the broken row.
  for (RequestId id : {0, 1}) {
    EXPECT_EQ(got.requests.at(id).tokens, reference.requests.at(id).tokens) << id;
    EXPECT_TRUE(got.requests.at(id).error.empty());
  }
  EXPECT_EQ(got.requests.at(4).tokens, reference.requests.at(2).tokens);
  EXPECT_EQ(got.pages_in_use, 0);
  EXPECT_EQ(finish_reason_name(FinishReason::kError), std::string("error"));
}

TEST(NonFiniteWeights, InfInTheLmHeadFailsGreedyAndSampledRequests) {
  std::vector<std::byte> broken = tiny_file();
  plant_f32(broken, "output.weight", 9 * 64 + 2, kInf);  // token 9's logit is +-Inf
  const BatchResult got =
      run_batch(load(broken), {{1, 2, 3}, {4, 5}, {6}}, {greedy(), sampled(1), sampled(4)});
  ASSERT_EQ(got.requests.size(), 3u);
  for (const auto& [id, f] : got.requests) {
    for (const auto& [index, reason] : f.reasons) EXPECT_EQ(reason, FinishReason::kError) << id;
    EXPECT_EQ(f.reasons.size(), id == 2 ? 4u : 1u);
    EXPECT_THAT(f.error, HasSubstr("0 NaN and 1 Inf of 64 logits"));
    EXPECT_THAT(f.error, HasSubstr("engine step 1"));
  }
  EXPECT_EQ(got.pages_in_use, 0);
}

TEST(NonFiniteWeights, SampleTokenRefusesNonFiniteLogits) {
  std::vector<float> logits(8, 0.5f);
  logits[3] = kNaN;
  test::expect_throws<InvalidArgument>(
      [&] { sample_token(logits, greedy(), 1, 0, 5); },
      {"sample_token", "1 NaN and 0 Inf of 8 logits", "position 5"});
  logits[3] = -kInf;
  test::expect_throws<InvalidArgument>([&] { sample_token(logits, sampled(1), 1, 0, 5); },
                                       {"0 NaN and 1 Inf of 8 logits"});
}

TEST(NonFiniteWeights, CheckTensorsRefusesTheFileNamingTensorAndElement) {
  std::vector<std::byte> f32_nan = tiny_file();
  plant_f32(f32_nan, "output_norm.weight", 5, kNaN);
  EXPECT_NO_THROW(load(f32_nan));  // off by default
  test::expect_throws<InvalidArgument>([&] { load(f32_nan, true); },
                                       {"check_tensors", "broken.gguf", "'output_norm.weight'",
                                        "element 5 (row 0, column 5) is NaN"});

  // A quantised block whose f16 scale is +Inf (blk.1.attn_v is Q8_0: a 2-byte
  // scale, then 32 int8 weights per block; rows of 64 weights).
  std::vector<std::byte> q8_inf = tiny_file();
  const std::uint16_t f16_inf = 0x7C00;
  const std::size_t row = 3, block = 1, block_bytes = 34, blocks_per_row = 2;
  std::memcpy(q8_inf.data() + tensor_data_offset(q8_inf, "blk.1.attn_v.weight") +
                  (row * blocks_per_row + block) * block_bytes,
              &f16_inf, sizeof f16_inf);
  test::expect_throws<InvalidArgument>([&] { load(q8_inf, true); },
                                       {"'blk.1.attn_v.weight'", "(row 3, column 32) is",
                                        "Q8_0 block (block 1 of the row)", "non-finite f16 scale"});
  EXPECT_NO_THROW(load(tiny_file(), true));
}

}  // namespace
}  // namespace pagedattn
