// Token sampling (vLLM's SamplingParams semantics). Per row: logit_bias,
// min_tokens masks, repetition / frequency / presence penalties, then greedy
// argmax or temperature, min_p, top-k and top-p. Randomness is a pure
// function of (seed, sample index, position), so a request draws the same
// tokens whatever it is batched with and after a preemption. Logprobs are
// of the raw row (RawLogprobs), before any of that processing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::engine {

// check_sampling_params with `caller` ("Engine::add_request") opening each message.
void check_sampling_params(const SamplingParams& params, std::string_view caller);
// The token ids of `params` (stop_token_ids, logit_bias) against [0, vocab).
void check_sampling_token_ids(const SamplingParams& params, std::int32_t vocab,
                              std::string_view caller);

// How many logits of a row are NaN and how many infinite.
struct NonFiniteCount {
  std::int64_t nan = 0, inf = 0;
};
NonFiniteCount count_non_finite(std::span<const float> logits);
// "3 NaN and 0 Inf of 1024 logits", for error messages.
std::string describe_non_finite(std::span<const float> logits);

// What the processing stages read besides the logits: the sample's tokens
// so far (the prompt, then its output; ids in [0, vocab)) and its EOS token.
struct SampleContext {
  std::span<const std::int32_t> tokens{};
  std::int32_t prompt_len = 0;     // tokens[0, prompt_len) is the prompt
  std::int32_t eos_token_id = -1;  // -1: none
  std::int64_t num_output() const { return std::ssize(tokens) - prompt_len; }
};

// The raw distribution of one finite logit row: its log-softmax, in double
// (stored as float), and its `num_top` most likely tokens.
class RawLogprobs {
 public:
  RawLogprobs(std::span<const float> logits, std::int32_t num_top);
  // `token`'s logprob and rank, with the top tokens.
  TokenLogprobs of(std::int32_t token) const;

 private:
  std::span<const float> logits_;
  double log_normalizer_ = 0.0;  // log(sum(exp(logits)))
  std::vector<std::pair<std::int32_t, float>> top_;
};

class Sampler {
 public:
  // logits [vocab]; `position` is the index the new token will have.
  // nullopt when a logit is NaN or infinite: no token is meaningful then
  // (found on the pass that takes the row's maximum, which every mode makes).
  std::optional<std::int32_t> sample(std::span<const float> logits, const SamplingParams& params,
                                     std::uint64_t seed, std::int32_t sample_index,
                                     std::int64_t position, const SampleContext& context = {});

 private:
  // processed_ = the row after logit_bias, min_tokens and the penalties.
  void process(std::span<const float> logits, const SamplingParams& params,
               const SampleContext& context);
  // A draw from processed_ with temperature, min_p, top_k and top_p; u in [0, 1).
  std::int32_t draw(const SamplingParams& params, double u);
  // top_k / top_p; sum: of weights_.
  std::int32_t draw_truncated(const SamplingParams& params, double max, double sum, double u);
  // candidates_ = the most likely tokens, in token order, enough to hold the
  // top_k tokens (ties included) or, without top_k, the top_p nucleus.
  void gather_candidates(const SamplingParams& params, double max, double sum);

  std::vector<double> processed_;                            // [vocab]
  std::vector<double> weights_;                              // [vocab]: softmax_weights
  std::vector<std::int32_t> bins_;                           // [vocab]: distance_bins
  std::vector<std::pair<double, std::int32_t>> candidates_;  // (logit, token)
  std::vector<double> probs_;
  std::vector<std::int32_t> sorted_tokens_;  // the penalties' token counts
};

}  // namespace pagedattn::engine
