// A request as the scheduler sees it: a group of up to n sequences (samples)
// that share the prompt. Sample 0 starts alone; the others appear when the
// prompt's first token is sampled and are forked from a sibling's pages.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::engine {

// Sequence ids in the cache: request id x kMaxSamples + sample index.
inline constexpr std::int32_t kMaxSamples = 256;

struct Sequence {
  SeqId id = 0;
  std::int32_t index = 0;            // sample index
  std::vector<std::int32_t> tokens;  // prompt, then generated tokens
  std::int32_t num_computed = 0;     // tokens whose K/V the cache holds
  std::int32_t published = 0;        // prefix caching: tokens reported to the cache
  bool in_cache = false;             // in the cache (on the device or swapped out)
  FinishReason finish = FinishReason::kNone;

  bool finished() const { return finish != FinishReason::kNone; }
  // Tokens still to run through the model (>= 1 while unfinished: the last
  // token is always pending - its logits give the next one).
  std::int32_t remaining() const { return static_cast<std::int32_t>(tokens.size()) - num_computed; }
};

struct SequenceGroup {
  RequestId id = 0;
  SamplingParams params;
  std::uint64_t seed = 0;
  std::int32_t prompt_len = 0;
  std::vector<Sequence> seqs;  // [1] until the first sampling, then [n]
  // SamplingParams::prompt_logprobs: entry i for prompt token i + 1, from
  // the logits at position i, gathered over the prefill chunks and moved
  // into the first output that carries tokens. Positions below
  // prompt_logprobs_done have theirs (a recompute does not add them again).
  std::vector<TokenLogprobs> prompt_logprobs;
  std::int32_t prompt_logprobs_done = 0;
  bool prompt_logprobs_reported = false;

  bool finished() const {
    for (const Sequence& s : seqs)
      if (!s.finished()) return false;
    return static_cast<std::int32_t>(seqs.size()) == params.n;
  }
  // An in-cache sequence holding the whole prompt (a fork source), or null.
  const Sequence* fork_source() const {
    for (const Sequence& s : seqs)
      if (s.in_cache && s.num_computed >= prompt_len) return &s;
    return nullptr;
  }
  // While the group runs: unfinished sequences outside the cache wait to be
  // forked from fork_source().
  bool waits_for_fork(const Sequence& s) const { return !s.in_cache && !s.finished(); }
  // The sequence that recomputes the prompt when the group is (re)admitted.
  Sequence* lead() {
    for (Sequence& s : seqs)
      if (!s.finished()) return &s;
    return nullptr;
  }
};

}  // namespace pagedattn::engine
