// Sampling options (vLLM's SamplingParams): logit_bias, min_tokens, the
// repetition / frequency / presence penalties, min_p, logprobs and
// prompt_logprobs, and their validation - against a double-precision
// reference written here from vLLM's documented formulas, and through the
// engine with a small built-in Llama model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "engine/sampler.h"
#include "engine/sequence_group.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama.h"
#include "support/engine_jobs.h"
#include "support/expect_error.h"
#include "support/small_llama.h"

namespace pagedattn {
namespace {
namespace sampling_options_test {  // this file's own names in a unity batch

using engine::SampleContext;
using engine::Sampler;
using test::Tokens;

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- the reference -------------------------------------------------------------

// The row after logit_bias, min_tokens, then the repetition (prompt and
// output), frequency and presence (output) penalties.
std::vector<double> reference_processed(std::span<const float> logits, const SamplingParams& p,
                                        const Tokens& tokens, std::size_t prompt_len,
                                        std::int32_t eos) {
  std::vector<double> l(logits.begin(), logits.end());
  for (const auto& [t, bias] : p.logit_bias) l[std::size_t(t)] += bias;
  if (tokens.size() - prompt_len < std::size_t(p.min_tokens)) {
    for (const std::int32_t t : p.stop_token_ids) l[std::size_t(t)] = -kInf;
    if (!p.ignore_eos && eos >= 0) l[std::size_t(eos)] = -kInf;
  }
  for (const std::int32_t t : std::set<std::int32_t>(tokens.begin(), tokens.end())) {
    double& v = l[std::size_t(t)];
    v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
  }
  std::map<std::int32_t, int> counts;
  for (std::size_t i = prompt_len; i < tokens.size(); ++i) ++counts[tokens[i]];
  for (const auto& [t, n] : counts)
    l[std::size_t(t)] -= double(p.frequency_penalty) * n + double(p.presence_penalty);
  return l;
}

std::int32_t reference_argmax(const std::vector<double>& l) {
  std::int32_t best = 0;
  for (std::size_t t = 1; t < l.size(); ++t)
    if (l[t] > l[std::size_t(best)]) best = static_cast<std::int32_t>(t);
  return best;
}

void normalize(std::vector<double>& probs) {
  const double sum = std::accumulate(probs.begin(), probs.end(), 0.0);
  for (double& q : probs) q /= sum;
}

// The probability of each token under a draw from the processed row:
// softmax at the temperature, min_p, top_k, then top_p (by a full sort);
// greedy: the argmax.
std::vector<double> reference_distribution(const std::vector<double>& l, const SamplingParams& p) {
  std::vector<double> probs(l.size(), 0.0);
  if (p.temperature == 0.0f) {
    probs[std::size_t(reference_argmax(l))] = 1.0;
    return probs;
  }
  const double max = *std::max_element(l.begin(), l.end());
  for (std::size_t t = 0; t < l.size(); ++t) probs[t] = std::exp((l[t] - max) / p.temperature);
  normalize(probs);
  const double most_likely = *std::max_element(probs.begin(), probs.end());
  for (double& q : probs)
    if (q < p.min_p * most_likely) q = 0.0;
  std::vector<std::size_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return probs[a] > probs[b]; });
  std::size_t keep = p.top_k > 0 ? std::min(order.size(), std::size_t(p.top_k)) : order.size();
  for (std::size_t i = keep; i < order.size(); ++i) probs[order[i]] = 0.0;
  normalize(probs);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t prefix = 0;
    while (prefix < keep && mass < p.top_p) mass += probs[order[prefix++]];
    for (std::size_t i = prefix; i < order.size(); ++i) probs[order[i]] = 0.0;
    normalize(probs);
  }
  return probs;
}

// log-softmax of the raw row, in double.
std::vector<double> reference_log_softmax(std::span<const float> row) {
  const double max = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (const float v : row) sum += std::exp(double(v) - max);
  std::vector<double> lp(row.size());
  for (std::size_t t = 0; t < row.size(); ++t) lp[t] = double(row[t]) - max - std::log(sum);
  return lp;
}

// `got` against the raw row: the token's logprob and rank, and the k most
// likely tokens (most likely first, the lower id on ties).
void expect_logprobs_of_row(const TokenLogprobs& got, std::span<const float> row,
                            std::int32_t token, std::int32_t k, double tolerance,
                            const std::string& where) {
  const std::vector<double> lp = reference_log_softmax(row);
  EXPECT_EQ(got.token, token) << where;
  EXPECT_NEAR(got.logprob, lp[std::size_t(token)], tolerance) << where;
  const auto larger =
      std::count_if(lp.begin(), lp.end(), [&](double v) { return v > lp[std::size_t(token)]; });
  EXPECT_EQ(got.rank, 1 + larger) << where;
  std::vector<std::int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return lp[a] > lp[b]; });
  ASSERT_EQ(got.top.size(), std::size_t(k)) << where;
  for (std::size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].first, order[i]) << where << " top " << i;
    EXPECT_NEAR(got.top[i].second, lp[std::size_t(order[i])], tolerance) << where << " top " << i;
  }
}

std::vector<float> random_logits(std::size_t vocab, std::mt19937& gen, float scale = 2.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(gen);
  return logits;
}

// --- the sampler against the reference ------------------------------------------

TEST(SamplingOptions, EachStageMovesTheGreedyPickAsDocumented) {
  Sampler s;
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(s.sample(three, {.logit_bias = {{0, 5.0f}}}, 1, 0, 0), 0);
  EXPECT_EQ(s.sample(three, {.logit_bias = {{2, -1.5f}}}, 1, 0, 0), 1);
  // Repetition: 2.0 / 1.25 = 1.6 < 1.9; a negative logit is multiplied.
  const Tokens seen = {0};
  EXPECT_EQ(
      s.sample(std::vector<float>{2.0f, 1.9f}, {.repetition_penalty = 1.25f}, 1, 0, 1, {seen, 1}),
      1);
  EXPECT_EQ(
      s.sample(std::vector<float>{-1.0f, -1.1f}, {.repetition_penalty = 2.0f}, 1, 0, 1, {seen, 1}),
      1);
  // Frequency and presence count the output only: token 0 in the prompt is
  // not penalized; output twice, 3 - 2 x 0.6 = 1.8 < 2.
  const std::vector<float> two = {3.0f, 2.0f};
  const Tokens prompt_only = {0, 0};
  const Tokens output_twice = {1, 0, 0};
  EXPECT_EQ(s.sample(two, {.frequency_penalty = 0.6f}, 1, 0, 2, {prompt_only, 2}), 0);
  EXPECT_EQ(s.sample(two, {.frequency_penalty = 0.6f}, 1, 0, 3, {output_twice, 1}), 1);
  EXPECT_EQ(s.sample(two, {.presence_penalty = 0.6f}, 1, 0, 3, {output_twice, 1}), 0);
  EXPECT_EQ(s.sample(two, {.presence_penalty = 1.5f}, 1, 0, 3, {output_twice, 1}), 1);
  // min_tokens: EOS (token 0 here) and stop tokens wait for the output.
  const SamplingParams min2{.max_tokens = 4, .stop_token_ids = {1}, .min_tokens = 2};
  const std::vector<float> eos_first = {5.0f, 4.0f, 1.0f};
  EXPECT_EQ(s.sample(eos_first, min2, 1, 0, 2, {Tokens{2, 2}, 1, 0}), 2);  // one output token
  EXPECT_EQ(s.sample(eos_first, min2, 1, 0, 3, {Tokens{2, 2, 2}, 1, 0}), 0);
  SamplingParams keep_eos = min2;
  keep_eos.ignore_eos = true;
  EXPECT_EQ(s.sample(eos_first, keep_eos, 1, 0, 2, {Tokens{2, 2}, 1, 0}), 0);
}

TEST(SamplingOptions, GreedyPicksMatchTheReferenceForRandomRowsAndOptions) {
  std::mt19937 gen(42);
  const std::size_t vocab = 40;
  const std::int32_t eos = 1;
  std::uniform_int_distribution<std::int32_t> token(0, std::int32_t(vocab) - 1);
  int moved = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::vector<float> logits = random_logits(vocab, gen);
    SamplingParams p{.max_tokens = 8};
    for (std::int32_t t : {token(gen), token(gen), token(gen)})
      if (std::none_of(p.logit_bias.begin(), p.logit_bias.end(),
                       [&](const auto& b) { return b.first == t; }))
        p.logit_bias.emplace_back(t, std::uniform_real_distribution<float>(-4.0f, 4.0f)(gen));
    p.repetition_penalty = std::array{1.0f, 0.7f, 1.6f}[trial % 3];
    p.frequency_penalty = std::array{0.0f, 0.9f, -0.5f, 2.0f}[trial % 4];
    p.presence_penalty = std::array{0.0f, 1.2f, -2.0f, 0.3f, 0.0f}[trial % 5];
    p.min_tokens = trial % 2 == 0 ? 3 : 0;
    p.stop_token_ids = {token(gen)};
    Tokens tokens(10 + std::size_t(trial % 6));
    for (std::int32_t& t : tokens) t = token(gen);
    const SampleContext context{tokens, 10, eos};
    const std::vector<double> expected = reference_processed(logits, p, tokens, 10, eos);
    const std::int32_t got = Sampler().sample(logits, p, 3, 0, std::ssize(tokens), context).value();
    EXPECT_EQ(got, reference_argmax(expected)) << "trial " << trial;
    moved += got != std::max_element(logits.begin(), logits.end()) - logits.begin();
  }
  EXPECT_GT(moved, 100);  // the options changed many picks: the comparison has teeth
}

// Draws at many positions follow the reference distribution, and never
// leave its support.
void expect_draws_follow(const std::vector<float>& logits, const SamplingParams& p,
                         const Tokens& tokens, std::size_t prompt_len, std::int32_t eos) {
  const std::vector<double> expected =
      reference_distribution(reference_processed(logits, p, tokens, prompt_len, eos), p);
  const SampleContext context{tokens, static_cast<std::int32_t>(prompt_len), eos};
  Sampler s;
  const int draws = 40000;
  std::vector<int> counts(logits.size());
  for (int i = 0; i < draws; ++i)
    ++counts[std::size_t(s.sample(logits, p, 17, 2, i, context).value())];
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (expected[t] == 0.0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " is outside the support";
      continue;
    }
    const double sigma = std::sqrt(expected[t] * (1.0 - expected[t]) / draws);
    EXPECT_NEAR(counts[t] / double(draws), expected[t], 5.0 * sigma + 1.0 / draws) << "token " << t;
  }
}

TEST(SamplingOptions, DrawsFollowTheReferenceDistribution) {
  std::mt19937 gen(7);
  const std::vector<float> logits = random_logits(24, gen, 1.5f);
  const Tokens tokens = {3, 5, 5, 9, 3, 3, 11, 0};  // prompt of 5, then 3 output tokens
  const std::int32_t eos = 0;
  const SamplingParams everything{.max_tokens = 10,
                                  .temperature = 0.8f,
                                  .top_k = 12,
                                  .top_p = 0.9f,
                                  .stop_token_ids = {4},
                                  .repetition_penalty = 1.3f,
                                  .presence_penalty = 0.4f,
                                  .frequency_penalty = 0.7f,
                                  .min_p = 0.05f,
                                  .min_tokens = 5,
                                  .logit_bias = {{1, 2.0f}, {2, -3.0f}}};
  expect_draws_follow(logits, everything, tokens, 5, eos);
  expect_draws_follow(logits,
                      {.temperature = 1.0f, .repetition_penalty = 0.6f, .frequency_penalty = -1.0f},
                      tokens, 5, eos);
  // min_p alone on a ramp in shuffled order: weights exp(-0.15 t / 1.3)
  // reach 0.2 of the largest at t = 14, so part of the vocabulary stays.
  std::vector<float> ramp(24);
  for (std::size_t t = 0; t < ramp.size(); ++t) ramp[(t * 7) % 24] = -0.15f * float(t);
  const SamplingParams min_p{.temperature = 1.3f, .min_p = 0.2f};
  expect_draws_follow(ramp, min_p, tokens, 5, eos);
  const std::vector<double> support =
      reference_distribution(reference_processed(ramp, min_p, tokens, 5, eos), min_p);
  EXPECT_EQ(std::count_if(support.begin(), support.end(), [](double q) { return q > 0; }), 14);
}

TEST(SamplingOptions, RawLogprobsAreTheLogSoftmaxOfTheUnmodifiedRow) {
  std::mt19937 gen(5);
  for (const std::int32_t k : {0, 1, 5, 20}) {
    const std::vector<float> logits = random_logits(1000, gen, 3.0f);
    const engine::RawLogprobs raw(logits, k);
    for (const std::int32_t token : {0, 17, 999})
      expect_logprobs_of_row(raw.of(token), logits, token, k, 1e-5, "k " + std::to_string(k));
  }
  // Ties: the lower id first, and the same rank for equal logits.
  const std::vector<float> tied = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 0.5f};
  const engine::RawLogprobs raw(tied, 4);
  expect_logprobs_of_row(raw.of(3), tied, 3, 4, 1e-6, "ties");
  EXPECT_EQ(raw.of(3).rank, 1);
  EXPECT_EQ(raw.of(5).rank, 4);
  ASSERT_EQ(raw.of(3).top.size(), 4u);
  EXPECT_EQ(raw.of(3).top[0].first, 1);
  EXPECT_EQ(raw.of(3).top[1].first, 3);
  EXPECT_EQ(raw.of(3).top[2].first, 4);
  EXPECT_EQ(raw.of(3).top[3].first, 0);
}

TEST(SamplingOptions, SampleTokenAppliesTheSameProcessing) {
  const std::vector<float> logits = {4.0f, 3.0f, 1.0f};
  // Token 0 is EOS: min_tokens holds it back for the first token.
  EXPECT_EQ(sample_token(logits, {.min_tokens = 1}, 1, 0, 2, Tokens{2, 2}, 0), 1);
  EXPECT_EQ(sample_token(logits, {.min_tokens = 1}, 1, 0, 2), 0);  // no EOS given
  // The prompt feeds the repetition penalty: 4 / 2 = 2 < 3.
  EXPECT_EQ(sample_token(logits, {.repetition_penalty = 2.0f}, 1, 0, 2, Tokens{0, 2}), 1);
  EXPECT_EQ(sample_token(logits, {.logit_bias = {{2, 5.0f}}}, 1, 0, 2), 2);
  test::expect_throws<InvalidArgument>(
      [&] {
        sample_token(logits, {.logit_bias = {{3, 1.0f}}}, 1, 0, 2);
      },
      {"sample_token", "logit_bias[0] token = 3"});
  test::expect_throws<InvalidArgument>(
      [&] {
        sample_token(logits, {}, 1, 0, 2, Tokens{0, 9});
      },
      {"sample_token", "prompt_token_ids[1] = 9"});
  test::expect_throws<InvalidArgument>(
      [&] {
        sample_token(logits, {}, 1, 0, 5, Tokens{0, 1});
      },
      {"sample_token", "position = 5"});
  test::expect_throws<InvalidArgument>([&] { sample_token(logits, {.min_p = 2.0f}, 1, 0, 2); },
                                       {"sample_token", "min_p = 2"});
}

// Every field's bad value is rejected with its name and value.
std::vector<std::pair<SamplingParams, std::string>> bad_params() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {{.max_tokens = 0}, "max_tokens = 0"},
      {{.temperature = -1.0f}, "temperature = -1"},
      {{.top_k = -1}, "top_k = -1"},
      {{.top_p = 1.5f}, "top_p = 1.5"},
      {{.n = 0}, "n = 0"},
      {{.n = 257}, "n = 257"},
      {{.stop_token_ids = {4, -2}}, "stop_token_ids[1] = -2"},
      {{.repetition_penalty = 0.0f}, "repetition_penalty = 0"},
      {{.repetition_penalty = nan}, "repetition_penalty = nan"},
      {{.presence_penalty = 2.5f}, "presence_penalty = 2.5"},
      {{.frequency_penalty = -3.0f}, "frequency_penalty = -3"},
      {{.min_p = 1.5f}, "min_p = 1.5"},
      {{.min_p = -0.25f}, "min_p = -0.25"},
      {{.max_tokens = 16, .min_tokens = 17}, "min_tokens = 17"},
      {{.min_tokens = -1}, "min_tokens = -1"},
      {{.logit_bias = {{5, 101.0f}}}, "logit_bias[0] (token 5) bias = 101"},
      {{.logit_bias = {{5, nan}}}, "logit_bias[0] (token 5) bias = nan"},
      {{.logit_bias = {{-1, 0.0f}}}, "logit_bias[0] token = -1"},
      {{.logit_bias = {{5, 1.0f}, {6, 1.0f}, {5, 2.0f}}}, "logit_bias[2] repeats token 5"},
      {{.logprobs = 21}, "logprobs = 21"},
      {{.logprobs = -1}, "logprobs = -1"},
      {{.prompt_logprobs = 21}, "prompt_logprobs = 21"},
      {{.stop = {"end", ""}}, "stop[1] is empty"},
  };
}

TEST(SamplingOptions, CheckSamplingParamsNamesEachField) {
  for (const auto& bad : bad_params())  // (clang 14 lambdas cannot capture bindings)
    test::expect_throws<InvalidArgument>([&] { check_sampling_params(bad.first); },
                                         {"check_sampling_params: ", bad.second});
  // The ends of every range are accepted.
  for (const SamplingParams& ok : std::vector<SamplingParams>{
           {.n = 256},
           {.repetition_penalty = 0.01f, .presence_penalty = -2.0f, .frequency_penalty = 2.0f},
           {.presence_penalty = 2.0f, .frequency_penalty = -2.0f, .min_p = 1.0f},
           {.max_tokens = 5, .min_tokens = 5, .logit_bias = {{0, -100.0f}, {9, 100.0f}}},
           {.logprobs = 0, .prompt_logprobs = 20, .stop = {"x"}}})
    EXPECT_NO_THROW(check_sampling_params(ok));
}

// --- through the engine -----------------------------------------------------------

std::shared_ptr<Model> test_model() {
  return test::small_llama();
}

EngineConfig config(std::int64_t kv_bytes = 8 << 20) {
  EngineConfig c;
  c.model = test_model();
  c.kv_memory_bytes = kv_bytes;
  c.page_size = 8;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 16;  // prompts run in several chunks
  c.deterministic = true;
  return c;
}

// Keeps every logit row the engine asks for, by (sequence id, position of
// the token whose logits they are); the first one where a row is recomputed.
class LogitRecorder final : public Model {
 public:
  explicit LogitRecorder(std::shared_ptr<Model> model) : model_(std::move(model)) {}
  const ModelSpec& spec() const override { return model_->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    model_->forward(batch, cache, logits);
    const BatchPlan& plan = cache.plan();
    const std::size_t vocab = std::size_t(spec().vocab_size);
    for (std::size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const std::int32_t token = batch.logit_rows[r];
      const auto b = std::upper_bound(plan.qo_indptr.begin(), plan.qo_indptr.end(), token) -
                     plan.qo_indptr.begin() - 1;
      const std::pair<SeqId, std::int32_t> key{plan.seq_ids[std::size_t(b)],
                                               plan.positions[std::size_t(token)]};
      rows.emplace(
          key, std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab));
    }
  }
  std::map<std::pair<SeqId, std::int32_t>, std::vector<float>> rows;

 private:
  std::shared_ptr<Model> model_;
};

// What a request reported over all steps.
struct Reported {
  std::map<std::int32_t, Tokens> tokens;  // per sample
  std::map<std::int32_t, std::vector<TokenLogprobs>> logprobs;
  std::map<std::int32_t, FinishReason> finish;
  std::vector<TokenLogprobs> prompt_logprobs;
  int prompt_logprob_reports = 0;
  bool prompt_logprobs_came_with_the_first_tokens = true;
};

std::map<RequestId, Reported> run_to_end(Engine& engine) {
  std::map<RequestId, Reported> out;
  while (engine.has_unfinished())
    for (const RequestOutput& o : engine.step()) {
      Reported& r = out[o.request_id];
      const bool had_tokens = !r.tokens.empty();
      const bool carries =
          std::any_of(o.samples.begin(), o.samples.end(),
                      [](const SampleOutput& s) { return !s.new_token_ids.empty(); });
      if (!o.prompt_logprobs.empty()) {
        ++r.prompt_logprob_reports;
        r.prompt_logprobs = o.prompt_logprobs;
        if (had_tokens || !carries) r.prompt_logprobs_came_with_the_first_tokens = false;
      }
      for (const SampleOutput& s : o.samples) {
        Tokens& t = r.tokens[s.index];
        t.insert(t.end(), s.new_token_ids.begin(), s.new_token_ids.end());
        std::vector<TokenLogprobs>& l = r.logprobs[s.index];
        l.insert(l.end(), s.logprobs.begin(), s.logprobs.end());
        r.finish[s.index] = s.finish_reason;
      }
    }
  return out;
}

// Every prompt position's logits from one forward over the whole prompt,
// outside any engine: [prompt.size()][vocab].
std::vector<std::vector<float>> full_prompt_logits(const EngineConfig& c, const Tokens& prompt) {
  PagedKVCache cache(engine_cache_config(c));
  const std::size_t vocab = std::size_t(c.model->spec().vocab_size);
  const std::array<SeqId, 1> ids{0};
  const std::array<std::int64_t, 1> lengths{std::ssize(prompt)};
  std::vector<std::int32_t> rows(prompt.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> logits(prompt.size() * vocab);
  cache.add_sequence(0);
  cache.begin_forward(ids, lengths);
  c.model->forward({prompt, rows, c.deterministic}, cache, logits);
  cache.end_forward();
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < prompt.size(); ++p)
    out.emplace_back(logits.begin() + p * vocab, logits.begin() + (p + 1) * vocab);
  return out;
}

// Entry i is prompt token i + 1's, from the logits at position i.
void expect_prompt_logprobs(const Reported& r, const EngineConfig& c, const Tokens& prompt,
                            std::int32_t k, const std::string& what) {
  EXPECT_EQ(r.prompt_logprob_reports, 1) << what;
  EXPECT_TRUE(r.prompt_logprobs_came_with_the_first_tokens) << what;
  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1) << what;
  const std::vector<std::vector<float>> rows = full_prompt_logits(c, prompt);
  for (std::size_t i = 0; i + 1 < prompt.size(); ++i)
    expect_logprobs_of_row(r.prompt_logprobs[i], rows[i], prompt[i + 1], k, 1e-4,
                           what + " prompt token " + std::to_string(i + 1));
}

TEST(SamplingOptions, PenaltiesAndLogprobsThroughTheEngineFollowTheReference) {
  EngineConfig c = config();
  auto recorder = std::make_shared<LogitRecorder>(test_model());
  c.model = recorder;
  Engine engine(c);
  const std::int32_t eos = recorder->spec().eos_token_id;
  const Tokens greedy_prompt = test::token_stream(21, 1);
  const Tokens sampled_prompt = test::token_stream(13, 2);
  const SamplingParams greedy{.max_tokens = 12,
                              .ignore_eos = true,
                              .repetition_penalty = 1.4f,
                              .presence_penalty = 0.5f,
                              .frequency_penalty = 0.8f,
                              .logit_bias = {{greedy_prompt[3], 2.5f}, {7, -1.0f}},
                              .logprobs = 5};
  const SamplingParams sampled{.max_tokens = 10,
                               .temperature = 0.9f,
                               .top_k = 8,
                               .n = 2,
                               .seed = 99,
                               .repetition_penalty = 0.8f,
                               .frequency_penalty = 1.0f,
                               .min_p = 0.1f,
                               .min_tokens = 4,
                               .logprobs = 0};
  const RequestId a = engine.add_request(greedy_prompt, greedy);
  const RequestId b = engine.add_request(sampled_prompt, sampled);
  const std::map<RequestId, Reported> out = run_to_end(engine);
  for (const auto& [id, prompt, params] :
       {std::tuple{a, greedy_prompt, greedy}, std::tuple{b, sampled_prompt, sampled}}) {
    for (std::int32_t i = 0; i < params.n; ++i) {
      const Tokens& output = out.at(id).tokens.at(i);
      const std::vector<TokenLogprobs>& logprobs = out.at(id).logprobs.at(i);
      ASSERT_EQ(output.size(), logprobs.size());
      Tokens tokens = prompt;
      for (std::size_t j = 0; j < output.size(); ++j) {
        const std::string where = "request " + std::to_string(id) + " sample " + std::to_string(i) +
                                  " token " + std::to_string(j);
        const auto position = static_cast<std::int32_t>(tokens.size()) - 1;
        const SeqId seq = id * engine::kMaxSamples + (j == 0 ? 0 : i);  // samples fork after 1
        const std::vector<float>& row = recorder->rows.at({seq, position});
        const std::vector<double> processed =
            reference_processed(row, params, tokens, prompt.size(), eos);
        if (params.temperature == 0.0f)
          EXPECT_EQ(output[j], reference_argmax(processed)) << where;
        else
          EXPECT_GT(reference_distribution(processed, params)[std::size_t(output[j])], 0.0)
              << where;
        expect_logprobs_of_row(logprobs[j], row, output[j], *params.logprobs, 1e-5, where);
        tokens.push_back(output[j]);
      }
    }
  }
}

TEST(SamplingOptions, MinTokensHoldsBackEosAndStopTokens) {
  Engine engine(config());
  const std::int32_t eos = test_model()->spec().eos_token_id;
  const Tokens prompt = test::token_stream(9, 3);
  // The bias makes EOS (then token 5) the greedy pick at every step.
  const RequestId free =
      engine.add_request(prompt, {.max_tokens = 10, .logit_bias = {{eos, 100.0f}}});
  const RequestId held = engine.add_request(
      prompt, {.max_tokens = 10, .min_tokens = 4, .logit_bias = {{eos, 100.0f}}});
  const RequestId stop = engine.add_request(prompt, {.max_tokens = 10,
                                                     .stop_token_ids = {5},
                                                     .ignore_eos = true,
                                                     .min_tokens = 3,
                                                     .logit_bias = {{5, 100.0f}}});
  const RequestId ignored = engine.add_request(
      prompt,
      {.max_tokens = 6, .ignore_eos = true, .min_tokens = 3, .logit_bias = {{eos, 100.0f}}});
  const std::map<RequestId, Reported> out = run_to_end(engine);
  EXPECT_EQ(out.at(free).tokens.at(0), Tokens{eos});
  const Tokens& h = out.at(held).tokens.at(0);
  ASSERT_EQ(h.size(), 5u);
  EXPECT_EQ(std::count(h.begin(), h.end(), eos), 1);
  EXPECT_EQ(h.back(), eos);
  EXPECT_EQ(out.at(held).finish.at(0), FinishReason::kStop);
  const Tokens& s = out.at(stop).tokens.at(0);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(std::count(s.begin(), s.end(), 5), 1);
  EXPECT_EQ(out.at(stop).finish.at(0), FinishReason::kStop);
  EXPECT_EQ(out.at(ignored).tokens.at(0), Tokens(6, eos));  // ignore_eos: EOS is not masked
}

TEST(SamplingOptions, PromptLogprobsOverChunkedPrefillMatchAFullPromptForward) {
  const EngineConfig c = config();
  Engine engine(c);
  const Tokens long_prompt = test::token_stream(53, 4);  // 4 chunks of 16
  const Tokens short_prompt = test::token_stream(6, 5);
  const RequestId a = engine.add_request(long_prompt, {.max_tokens = 3, .prompt_logprobs = 5});
  const RequestId b = engine.add_request(short_prompt, {.max_tokens = 2, .prompt_logprobs = 0});
  const RequestId n3 = engine.add_request(
      long_prompt, {.max_tokens = 3, .temperature = 1.0f, .n = 3, .prompt_logprobs = 20});
  const RequestId none = engine.add_request(short_prompt, {.max_tokens = 2});
  const std::map<RequestId, Reported> out = run_to_end(engine);
  expect_prompt_logprobs(out.at(a), c, long_prompt, 5, "k 5");
  expect_prompt_logprobs(out.at(b), c, short_prompt, 0, "k 0");
  expect_prompt_logprobs(out.at(n3), c, long_prompt, 20, "n 3");
  EXPECT_EQ(out.at(none).prompt_logprob_reports, 0);
  EXPECT_TRUE(out.at(none).logprobs.at(0).empty());
  EXPECT_TRUE(engine.cache().empty());
}

TEST(SamplingOptions, PromptLogprobsTakeNoCachedPrefix) {
  EngineConfig c = config();
  c.enable_prefix_caching = true;
  Engine engine(c);
  const Tokens prompt = test::token_stream(40, 6);
  engine.add_request(prompt, {.max_tokens = 2});
  run_to_end(engine);
  const std::int64_t hits = engine.stats().prefix_hit_tokens;
  const RequestId with = engine.add_request(prompt, {.max_tokens = 2, .prompt_logprobs = 3});
  const std::map<RequestId, Reported> out = run_to_end(engine);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, hits);  // computed every prompt position
  expect_prompt_logprobs(out.at(with), c, prompt, 3, "prefix caching");
  engine.add_request(prompt, {.max_tokens = 2});  // others still share the first one's pages
  run_to_end(engine);
  EXPECT_GT(engine.stats().prefix_hit_tokens, hits);
}

TEST(SamplingOptions, PromptLogprobsAreReportedOnceUnderRecomputePreemption) {
  // Bytes per page: 2 (K, V) x 2 layers x 2 KV heads x 24 dims x 8 tokens x 2 bytes.
  const std::int64_t page_bytes = 2 * 2 * 2 * 24 * 8 * 2;
  const EngineConfig c = config(12 * page_bytes);
  Engine engine(c);
  std::vector<std::pair<RequestId, Tokens>> requests;
  for (std::int32_t j = 0; j < 5; ++j) {
    const Tokens prompt = test::token_stream(20 + 7 * j, 10 + j);
    requests.emplace_back(
        engine.add_request(prompt, {.max_tokens = 24, .ignore_eos = true, .prompt_logprobs = 2}),
        prompt);
  }
  const std::map<RequestId, Reported> out = run_to_end(engine);
  EXPECT_GT(engine.stats().recomputed_tokens, 0);
  for (const auto& [id, prompt] : requests) {
    expect_prompt_logprobs(out.at(id), c, prompt, 2, "request " + std::to_string(id));
    EXPECT_EQ(out.at(id).tokens.at(0).size(), 24u);
  }
}

// A model whose logits at position 2 are NaN: only a prompt_logprobs
// request asks for that row of a longer prompt.
class NanAtPositionTwo final : public Model {
 public:
  const ModelSpec& spec() const override { return test_model()->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    test_model()->forward(batch, cache, logits);
    const std::size_t vocab = std::size_t(spec().vocab_size);
    for (std::size_t r = 0; r < batch.logit_rows.size(); ++r)
      if (cache.plan().positions[std::size_t(batch.logit_rows[r])] == 2)
        std::fill_n(logits.begin() + r * vocab, vocab, std::numeric_limits<float>::quiet_NaN());
  }
};

TEST(SamplingOptions, APromptRowThatIsNotFiniteFailsOnlyItsRequest) {
  EngineConfig c = config();
  c.model = std::make_shared<NanAtPositionTwo>();
  Engine engine(c);
  const Tokens prompt = test::token_stream(30, 7);
  const RequestId bad = engine.add_request(prompt, {.max_tokens = 4, .n = 2, .prompt_logprobs = 1});
  const RequestId good = engine.add_request(prompt, {.max_tokens = 4, .ignore_eos = true});
  std::string error;
  engine.set_stream_callback([&](const RequestOutput& o) {
    if (!o.error.empty()) error = o.error;
  });
  const std::map<RequestId, Reported> out = run_to_end(engine);
  EXPECT_THAT(error, ::testing::HasSubstr("not finite"));
  EXPECT_EQ(out.at(bad).finish.at(0), FinishReason::kError);
  EXPECT_EQ(out.at(bad).finish.at(1), FinishReason::kError);
  EXPECT_TRUE(out.at(bad).tokens.at(0).empty());
  EXPECT_EQ(out.at(good).tokens.at(0).size(), 4u);
  EXPECT_TRUE(engine.cache().empty());
}

TEST(SamplingOptions, BadRequestsAreRejectedByNameAndLeaveTheEngineUnchanged) {
  Engine engine(config());
  const Tokens prompt = {1, 2, 3};
  for (const auto& bad : bad_params())
    test::expect_throws<InvalidArgument>([&] { engine.add_request(prompt, bad.first); },
                                         {"Engine::add_request: ", bad.second});
  test::expect_throws<InvalidArgument>(
      [&] {
        engine.add_request(prompt, {.logit_bias = {{300, 1.0f}}});
      },
      {"Engine::add_request: ", "logit_bias[0] token = 300", "vocab_size = 300"});
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.stats().num_waiting_requests, 0);
  EXPECT_EQ(engine.add_request(prompt, {.max_tokens = 1}), 0);  // no id was taken
  // Imports refuse what needs the prefill instance's logits.
  const std::int64_t free_pages = engine.cache().num_free_pages();
  test::expect_throws<InvalidArgument>([&] { engine.reserve_import(prompt, {.logprobs = 1}); },
                                       {"Engine::reserve_import", "logprobs = 1"});
  test::expect_throws<InvalidArgument>(
      [&] { engine.reserve_import(prompt, {.prompt_logprobs = 0}); },
      {"Engine::reserve_import", "prompt_logprobs = 0"});
  EXPECT_EQ(engine.num_pending_imports(), 0);
  EXPECT_EQ(engine.cache().num_free_pages(), free_pages);
}

}  // namespace sampling_options_test
}  // namespace
}  // namespace pagedattn
