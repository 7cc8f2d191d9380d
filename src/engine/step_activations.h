// Which activations a step's weight products take (ForwardBatch::
// int8_activations): the engine's choice per step, from its settings, the
// step's shape and a timing made once per process.
#pragma once

#include <cstdint>

namespace pagedattn::engine {

// A step that decodes at least this many sequences and computes no prompt
// token takes int8 activations by default. Its products multiply every
// weight by that many rows, so f32 multiply-adds, not reading the weights,
// bound them (on Zen 4's half-rate 512-bit FMAs from about 4 rows), and
// int8 dot products carry 4x the multiply-adds per instruction. Fewer
// sequences, and every prompt chunk, keep f32 activations: a request served
// alone or beside a few others gets the exact path's tokens, the first
// token of every request included (docs/models.md, "Int8 activations").
inline constexpr std::int32_t kInt8DecodeMinRows = 8;

// The int8 path must take at most this fraction of the f32 path's time to
// be taken by default: it moves logits far more than f32 summation order
// does, so a marginal gain is not worth it.
inline constexpr double kInt8DecodeMargin = 0.8;

// An engine's settings that bear on the choice.
struct ActivationPolicy {
  bool int8_always = false;  // EngineConfig::int8_activations: every step, prompts too
  bool exact = false;        // EngineConfig::exact_products or ::deterministic: never
};

// The one-time timing: linear() on a Q4_K matrix held in cache
// (compute-bound, as a many-row decode step is), kInt8DecodeMinRows rows,
// f32 against int8 activations on one thread (a core's multiply rate on
// each path), alternated over several rounds, the best call of each.
struct Int8DecodeTiming {
  double f32_seconds = 0.0;
  double int8_seconds = 0.0;
  bool pays = false;  // int8_seconds <= kInt8DecodeMargin * f32_seconds
};

// Times on the first call (a few ms; PAGEDATTN_LOG_PRODUCT_PATHS=1
// prints the figures), returns the recorded timing after. Thread-safe.
const Int8DecodeTiming& int8_decode_timing();

// Makes the timing now where `policy` leaves the choice to it (an engine
// being made), so that no step pays for it.
void prepare_step_activations(const ActivationPolicy& policy);

// Whether a step of `tokens` tokens, `decodes` of which are a running
// sequence's next token, takes int8 activations under `policy`:
// int8_always, else (not exact) a decode-only step of at least
// kInt8DecodeMinRows sequences where int8_decode_timing().pays.
bool step_takes_int8(const ActivationPolicy& policy, std::int32_t tokens, std::int32_t decodes);

}  // namespace pagedattn::engine
