#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "counter_random.h"
#include "engine/sampler_kernels.h"
#include "pagedattn/errors.h"
#include "sequence_group.h"

namespace pagedattn::engine {
namespace {

// --- validation ----------------------------------------------------------------

void check_penalties(const SamplingParams& p, std::string_view caller) {
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f, caller,
          ": repetition_penalty = ", p.repetition_penalty, " must be finite and > 0 (1 = off)");
  require(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f, caller,
          ": presence_penalty = ", p.presence_penalty, " must be in [-2, 2]");
  require(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f, caller,
          ": frequency_penalty = ", p.frequency_penalty, " must be in [-2, 2]");
}

void check_logit_bias(const std::vector<std::pair<std::int32_t, float>>& bias,
                      std::string_view caller) {
  for (std::size_t i = 0; i < bias.size(); ++i) {
    const auto [token, value] = bias[i];
    require(token >= 0, caller, ": logit_bias[", i, "] token = ", token, " must be >= 0");
    // Comparisons with NaN are false: NaN and the infinities fail here.
    require(value >= -100.0f && value <= 100.0f, caller, ": logit_bias[", i, "] (token ", token,
            ") bias = ", value, " must be finite and in [-100, 100]");
  }
  std::vector<std::pair<std::int32_t, std::size_t>> order;  // (token, index)
  for (std::size_t i = 0; i < bias.size(); ++i) order.emplace_back(bias[i].first, i);
  std::sort(order.begin(), order.end());
  for (std::size_t i = 1; i < order.size(); ++i)
    require(order[i].first != order[i - 1].first, caller, ": logit_bias[", order[i].second,
            "] repeats token ", order[i].first, " (logit_bias[", order[i - 1].second,
            "]): each token at most once");
}

void check_logprobs_count(const char* field, const std::optional<std::int32_t>& count,
                          std::string_view caller) {
  if (!count) return;
  require(*count >= 0 && *count <= kMaxLogprobs, caller, ": ", field, " = ", *count,
          " must be in [0, ", kMaxLogprobs, "]");
}

// --- processing stages, on the row as doubles --------------------------------

using Row = std::span<double>;

void add_logit_bias(Row row, const SamplingParams& p) {
  for (const auto& [token, bias] : p.logit_bias) row[std::size_t(token)] += bias;
}

// Before min_tokens new tokens, EOS (unless ignore_eos) and stop_token_ids
// cannot be drawn. Nothing is masked where that would mask every token.
void mask_early_stops(Row row, const SamplingParams& p, const SampleContext& context,
                      std::vector<std::int32_t>& stops) {
  if (context.num_output() >= p.min_tokens) return;
  stops.assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
  if (!p.ignore_eos && context.eos_token_id >= 0 && context.eos_token_id < std::ssize(row))
    stops.push_back(context.eos_token_id);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  if (std::ssize(stops) >= std::ssize(row)) return;
  for (const std::int32_t t : stops) row[std::size_t(t)] = -std::numeric_limits<double>::infinity();
}

// CTRL's rule, once per distinct token of `sorted` (the prompt and output).
void apply_repetition_penalty(Row row, float penalty, std::span<const std::int32_t> sorted) {
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0 && sorted[i] == sorted[i - 1]) continue;
    double& logit = row[std::size_t(sorted[i])];
    logit = logit > 0.0 ? logit / penalty : logit * penalty;
  }
}

// OpenAI's rule over `sorted` (the output): frequency x count + presence.
void apply_output_penalties(Row row, const SamplingParams& p,
                            std::span<const std::int32_t> sorted) {
  for (std::size_t begin = 0; begin < sorted.size();) {
    std::size_t end = begin;
    while (end < sorted.size() && sorted[end] == sorted[begin]) ++end;
    const double count = static_cast<double>(end - begin);
    row[std::size_t(sorted[begin])] -= double(p.frequency_penalty) * count + p.presence_penalty;
    begin = end;
  }
}

bool needs_processing(const SamplingParams& p, const SampleContext& context) {
  return !p.logit_bias.empty() || context.num_output() < p.min_tokens ||
         p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

// --- the draw ------------------------------------------------------------------

// Larger logit first; the lower token id wins ties.
template <class Logit>
bool before(const std::pair<Logit, std::int32_t>& a, const std::pair<Logit, std::int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// The sum of kPickBlock values in kSumChains independent chains (a single
// chain waits on each add's latency), then the chains in order.
constexpr std::size_t kPickBlock = 256, kSumChains = 8;
double block_sum(const double* v) {
  double part[kSumChains] = {};
  for (std::size_t i = 0; i < kPickBlock; i += kSumChains)
    for (std::size_t c = 0; c < kSumChains; ++c) part[c] += v[i + c];
  double sum = 0.0;
  for (const double p : part) sum += p;
  return sum;
}

// The first index where the running sum of `probs` passes `target`; the
// last positive one should rounding leave target beyond the sum. Whole
// blocks are skipped by their sums, then the block is walked value by value.
std::size_t pick(std::span<const double> probs, double target) {
  double acc = 0.0;
  std::size_t i = 0;
  for (; i + kPickBlock <= probs.size(); i += kPickBlock) {
    const double block = block_sum(probs.data() + i);
    if (target < acc + block) break;
    acc += block;
  }
  for (; i < probs.size(); ++i)
    if (target < (acc += probs[i])) return i;
  for (std::size_t j = probs.size(); j-- > 0;)
    if (probs[j] > 0.0) return j;
  return 0;
}

// Candidates for top_k / top_p: tokens in bins of their distance below the
// most likely one, s = (max - logit) / temperature, kBinsPerUnit bins per
// unit of s up to kBinnedUnits (weights above e^-32 of the largest), then
// one bin for the rest (and masked tokens). Bins follow the logit order, so
// the tokens of the first b bins are the most likely ones, ties included.
constexpr int kBinsPerUnit = 8, kBinnedUnits = 32;
constexpr int kRestBin = kBinsPerUnit * kBinnedUnits;

// Nucleus candidates are sorted this many at first, then twice as many each
// time the mass so far falls short.
constexpr std::size_t kFirstNucleusChunk = 64;

}  // namespace

void check_sampling_params(const SamplingParams& p, std::string_view caller) {
  require(p.max_tokens >= 1, caller, ": max_tokens = ", p.max_tokens, " must be >= 1");
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f, caller,
          ": temperature = ", p.temperature, " must be finite and >= 0");
  require(p.top_k >= 0, caller, ": top_k = ", p.top_k, " must be >= 0 (0 = off)");
  require(p.top_p > 0.0f && p.top_p <= 1.0f, caller, ": top_p = ", p.top_p, " must be in (0, 1]");
  require(p.n >= 1 && p.n <= kMaxSamples, caller, ": n = ", p.n, " must be in [1, ", kMaxSamples,
          "]");
  for (std::size_t i = 0; i < p.stop_token_ids.size(); ++i)
    require(p.stop_token_ids[i] >= 0, caller, ": stop_token_ids[", i, "] = ", p.stop_token_ids[i],
            " must be >= 0");
  check_penalties(p, caller);
  require(p.min_p >= 0.0f && p.min_p <= 1.0f, caller, ": min_p = ", p.min_p, " must be in [0, 1]");
  require(p.min_tokens >= 0 && p.min_tokens <= p.max_tokens, caller,
          ": min_tokens = ", p.min_tokens, " must be in [0, max_tokens = ", p.max_tokens, "]");
  check_logit_bias(p.logit_bias, caller);
  check_logprobs_count("logprobs", p.logprobs, caller);
  check_logprobs_count("prompt_logprobs", p.prompt_logprobs, caller);
  for (std::size_t i = 0; i < p.stop.size(); ++i)
    require(!p.stop[i].empty(), caller, ": stop[", i, "] is empty");
}

void check_sampling_token_ids(const SamplingParams& p, std::int32_t vocab,
                              std::string_view caller) {
  for (std::size_t i = 0; i < p.stop_token_ids.size(); ++i)
    require(p.stop_token_ids[i] >= 0 && p.stop_token_ids[i] < vocab, caller, ": stop_token_ids[", i,
            "] = ", p.stop_token_ids[i], " is outside [0, vocab_size = ", vocab, ")");
  for (std::size_t i = 0; i < p.logit_bias.size(); ++i)
    require(p.logit_bias[i].first >= 0 && p.logit_bias[i].first < vocab, caller, ": logit_bias[", i,
            "] token = ", p.logit_bias[i].first, " is outside [0, vocab_size = ", vocab, ")");
}

NonFiniteCount count_non_finite(std::span<const float> logits) {
  NonFiniteCount c;
  for (const float v : logits) {
    c.nan += std::isnan(v) ? 1 : 0;
    c.inf += std::isinf(v) ? 1 : 0;
  }
  return c;
}

std::string describe_non_finite(std::span<const float> logits) {
  const NonFiniteCount c = count_non_finite(logits);
  return detail::concat(c.nan, " NaN and ", c.inf, " Inf of ", logits.size(), " logits");
}

RawLogprobs::RawLogprobs(std::span<const float> logits, std::int32_t num_top) : logits_(logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float v : logits) sum += std::exp(double(v) - max);
  log_normalizer_ = max + std::log(sum);
  // The most likely tokens by insertion into a short sorted list: tokens
  // come in id order, so an equal logit never displaces a lower id.
  std::vector<std::pair<float, std::int32_t>> top;
  const auto k = static_cast<std::size_t>(num_top);
  for (std::int32_t t = 0; t < std::ssize(logits) && k > 0; ++t) {
    const std::pair<float, std::int32_t> entry{logits[std::size_t(t)], t};
    if (top.size() == k && !before(entry, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), entry, before<float>), entry);
    if (top.size() > k) top.pop_back();
  }
  for (const auto& [logit, token] : top)
    top_.emplace_back(token, static_cast<float>(double(logit) - log_normalizer_));
}

TokenLogprobs RawLogprobs::of(std::int32_t token) const {
  const float logit = logits_[std::size_t(token)];
  const auto larger =
      std::count_if(logits_.begin(), logits_.end(), [&](float v) { return v > logit; });
  return {token, static_cast<float>(double(logit) - log_normalizer_),
          static_cast<std::int32_t>(1 + larger), top_};
}

std::optional<std::int32_t> Sampler::sample(std::span<const float> logits,
                                            const SamplingParams& params, std::uint64_t seed,
                                            std::int32_t sample_index, std::int64_t position,
                                            const SampleContext& context) {
  const RowMax raw = row_max(logits);
  if (!raw.finite) return std::nullopt;
  if (params.temperature == 0.0f && !needs_processing(params, context)) return raw.token;
  process(logits, params, context);
  const double u = counter_uniform(seed, static_cast<std::uint64_t>(sample_index),
                                   static_cast<std::uint64_t>(position));
  return draw(params, u);
}

void Sampler::process(std::span<const float> logits, const SamplingParams& params,
                      const SampleContext& context) {
  processed_.assign(logits.begin(), logits.end());
  const Row row(processed_);
  if (!params.logit_bias.empty()) add_logit_bias(row, params);
  mask_early_stops(row, params, context, sorted_tokens_);
  if (params.repetition_penalty != 1.0f) {
    sorted_tokens_.assign(context.tokens.begin(), context.tokens.end());
    std::sort(sorted_tokens_.begin(), sorted_tokens_.end());
    apply_repetition_penalty(row, params.repetition_penalty, sorted_tokens_);
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    sorted_tokens_.assign(context.tokens.begin() + context.prompt_len, context.tokens.end());
    std::sort(sorted_tokens_.begin(), sorted_tokens_.end());
    apply_output_penalties(row, params, sorted_tokens_);
  }
}

std::int32_t Sampler::draw(const SamplingParams& params, double u) {
  const std::int32_t best = first_max(processed_);
  if (params.temperature == 0.0f) return best;
  const double max = processed_[std::size_t(best)];
  weights_.resize(processed_.size());
  const double sum =
      softmax_weights(processed_, max, params.temperature, params.min_p, weights_.data());
  const std::size_t vocab = processed_.size();
  const bool top_k = params.top_k > 0 && static_cast<std::size_t>(params.top_k) < vocab;
  if (top_k || params.top_p < 1.0f) return draw_truncated(params, max, sum, u);
  // The whole vocabulary, in token order: no sorting.
  return static_cast<std::int32_t>(pick(weights_, u * sum));
}

void Sampler::gather_candidates(const SamplingParams& params, double max, double sum) {
  const std::size_t vocab = processed_.size();
  const bool top_k = params.top_k > 0 && static_cast<std::size_t>(params.top_k) < vocab;
  const double inverse_t = 1.0 / params.temperature;
  bins_.resize(vocab);
  distance_bins(processed_, max, inverse_t, kBinsPerUnit, kRestBin, bins_.data());
  // kCopies histograms, token t in copy t % kCopies: neighbouring tokens
  // mostly share a bin, and one copy would wait on each update of it.
  constexpr std::size_t kCopies = 4;
  std::int64_t counts[kCopies][kRestBin + 1] = {};
  double masses[kCopies][kRestBin + 1] = {};
  for (std::size_t t = 0; t < vocab; ++t) {
    ++counts[t % kCopies][bins_[t]];
    masses[t % kCopies][bins_[t]] += weights_[t];
  }
  std::int64_t count[kRestBin + 1];
  double mass[kRestBin + 1];
  for (int b = 0; b <= kRestBin; ++b) {
    count[b] = counts[0][b] + counts[1][b] + counts[2][b] + counts[3][b];
    mass[b] = masses[0][b] + masses[1][b] + masses[2][b] + masses[3][b];
  }
  // The first bins that hold the k most likely tokens (top_k), or a mass
  // that reaches top_p of the row (top_p alone), and one bin more: the
  // nucleus is summed again in another order below.
  const double goal = top_k ? 0.0 : params.top_p * sum;
  std::int64_t tokens = 0;
  double so_far = 0.0;
  int last = 0;
  for (; last < kRestBin; ++last) {
    tokens += count[last];
    so_far += mass[last];
    if (top_k ? tokens >= params.top_k : so_far >= goal) break;
  }
  last = std::min(last + 1, kRestBin);
  candidates_.clear();
  for (std::size_t t = 0; t < vocab; ++t)
    if (bins_[t] <= last) candidates_.emplace_back(processed_[t], static_cast<std::int32_t>(t));
}

// top_k, then the smallest most-likely-first prefix whose mass reaches
// top_p (sorted only as far as that prefix reaches), among the candidates
// (gather_candidates), which hold both. `sum`: the whole row's weights.
std::int32_t Sampler::draw_truncated(const SamplingParams& params, double max, double sum,
                                     double u) {
  gather_candidates(params, max, sum);
  const auto first = candidates_.begin();
  std::size_t keep = candidates_.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < processed_.size()) {
    keep = std::min(keep, static_cast<std::size_t>(params.top_k));  // the k most likely
    std::nth_element(first, first + keep, candidates_.end(), before<double>);
    probs_.resize(keep);
    sum = 0.0;
    for (std::size_t i = 0; i < keep; ++i)
      sum += probs_[i] = weights_[std::size_t(candidates_[i].second)];
  } else {
    probs_.resize(keep);
  }
  if (params.top_p < 1.0f) {
    const double goal = params.top_p * sum;
    double mass = 0.0;
    std::size_t prefix = 0, sorted = 0, chunk = kFirstNucleusChunk;
    while (prefix < keep && mass < goal) {
      if (prefix == sorted) {
        const std::size_t end = std::min(keep, sorted + chunk);
        std::nth_element(first + sorted, first + end, first + keep, before<double>);
        std::sort(first + sorted, first + end, before<double>);
        sorted = end;
        chunk *= 2;
      }
      mass += probs_[prefix] = weights_[std::size_t(candidates_[prefix].second)];
      ++prefix;
    }
    keep = prefix;
    sum = mass;
  }
  const std::size_t i = pick(std::span<const double>(probs_).first(keep), u * sum);
  return candidates_[i].second;
}

}  // namespace pagedattn::engine

namespace pagedattn {

void check_sampling_params(const SamplingParams& params) {
  engine::check_sampling_params(params, "check_sampling_params");
}

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t seed, std::int32_t sample_index, std::int64_t position,
                          std::span<const std::int32_t> prompt_token_ids,
                          std::int32_t eos_token_id) {
  require(!logits.empty() && std::ssize(logits) <= std::numeric_limits<std::int32_t>::max(),
          "sample_token: logits has ", logits.size(), " entries, must be in [1, 2^31)");
  engine::check_sampling_params(params, "sample_token");
  const auto vocab = static_cast<std::int32_t>(logits.size());
  engine::check_sampling_token_ids(params, vocab, "sample_token");
  for (std::size_t i = 0; i < prompt_token_ids.size(); ++i)
    require(prompt_token_ids[i] >= 0 && prompt_token_ids[i] < vocab,
            "sample_token: prompt_token_ids[", i, "] = ", prompt_token_ids[i],
            " is outside [0, vocab_size = ", vocab, ")");
  require(prompt_token_ids.empty() || position == std::ssize(prompt_token_ids),
          "sample_token: position = ", position, " must be the prompt's length (",
          prompt_token_ids.size(), "): the token follows the prompt");
  const engine::SampleContext context{
      prompt_token_ids, static_cast<std::int32_t>(prompt_token_ids.size()), eos_token_id};
  engine::Sampler sampler;
  const std::optional<std::int32_t> token =
      sampler.sample(logits, params, seed, sample_index, position, context);
  require(token.has_value(), "sample_token: logits are not finite (",
          engine::describe_non_finite(logits), "; position ", position, ")");
  return *token;
}

}  // namespace pagedattn
