// Which activations a step's weight products take (ForwardBatch::
// int8_activations): the engine's choice per step, from its settings, the
// step's shape and a timing made once per process.
#pragma once

#include <array>
#include <cstdint>

#include "engine/gemm.h"
#include "pagedattn/engine.h"

namespace pagedattn::engine {

// By default a step that computes no prompt token and decodes at least
// Int8DecodeTiming::min_rows sequences takes int8 activations: its products
// multiply every weight by that many rows, so multiply-adds, not reading
// the weights, bound them, and int8 dot products carry 4x an f32 FMA's
// multiply-adds per instruction. Fewer sequences, and every prompt chunk,
// keep f32: a request served alone or beside a few others gets the exact
// path's tokens, the first token of every request included (docs/models.md,
// "Int8 activations"). The row counts timed, fewest first: never fewer than
// 8 (on Zen 4 the f32 register tiles beat the int8 tiles at 4 rows, which
// pack each weight group for so few).
inline constexpr std::array<std::int32_t, 3> kInt8DecodeRows = {8, 16, 32};

// The int8 path must take at most this fraction of the f32 path's time to
// be taken by default: it moves logits far more than f32 summation order
// does, so a marginal gain is not worth it.
inline constexpr double kInt8DecodeMargin = 0.8;

// An engine's settings that bear on the choice.
struct ActivationPolicy {
  bool int8_always = false;  // EngineConfig::int8_activations: every step, prompts too
  bool exact = false;        // EngineConfig::exact_products or ::deterministic: never
  bool bf16 = false;         // EngineConfig::bf16_products: batches may take bf16 (Bf16Route)
};

// The policy of an engine made with `config`.
inline ActivationPolicy activation_policy(const EngineConfig& config) {
  const bool exact = config.exact_products || config.deterministic;
  return {config.int8_activations, exact, config.bf16_products && !exact};
}

// The one-time timing: linear() on a Q4_K matrix held in cache
// (compute-bound, as a many-row decode step is) at each of kInt8DecodeRows
// rows, f32 against int8 activations on one thread (a core's multiply rate
// on each path), alternated over several rounds, the best call of each.
struct Int8DecodeTiming {
  struct Point {
    std::int32_t rows = 0;
    double f32_seconds = 0.0, int8_seconds = 0.0;
  };
  std::array<Point, kInt8DecodeRows.size()> points{};
  // The fewest rows of kInt8DecodeRows at which int8_seconds <=
  // kInt8DecodeMargin * f32_seconds; 0 where none (int8 never taken).
  std::int32_t min_rows = 0;
};

// Times on the first call (about 20 ms; PAGEDATTN_LOG_PRODUCT_PATHS=1
// prints the figures), returns the recorded timing after. Thread-safe.
const Int8DecodeTiming& int8_decode_timing();

// The routes of batches that may take bf16 products (Bf16Routes, gemm.h),
// timed once: linear() on the matrix above (Q4_K 576 x 1536, one thread) at
// each of kBf16RouteRows rows on f32, on the bf16 tiles and on oneDNN's
// bf16 matmul (where onednn_bf16_products()), alternated over rounds, the
// best call of each. A point takes a bf16 route only where it takes at most
// kBf16Margin of the f32 route's time (the user allowed the rounding, not a
// slower product), and of the two bf16 routes, whose bits differ, the one
// fixed_bf16_routes() names unless the other takes at most kBf16Margin of
// its time: a near tie does not flip a run's bits from one process to the
// next.
inline constexpr double kBf16Margin = 0.9;
struct Bf16RouteTiming {
  struct Point {
    std::int32_t rows = 0;
    double f32_seconds = 0.0, tiles_seconds = 0.0, onednn_seconds = 0.0;  // infinity: not run
  };
  std::array<Point, kBf16RouteRows.size()> points{};
  Bf16Routes routes;
};
// A point's route by the rule above, `fixed` its fixed_bf16_routes() route.
Bf16Route fastest_bf16_route(const Bf16RouteTiming::Point& point, Bf16Route fixed);
// Times on the first call (about 0.1 s on AVX512-BF16;
// PAGEDATTN_LOG_PRODUCT_PATHS=1 prints the figures), returns the recorded
// timing after; all f32 where !dot_tiles_bf16_available() (nothing run).
// Thread-safe.
const Bf16RouteTiming& bf16_route_timing();

// Makes the timings now where `policy` leaves the choices to them (an engine
// being made), so that no step pays for them, and sets the bf16 routes
// (set_bf16_routes) where the policy allows bf16 products.
void prepare_step_activations(const ActivationPolicy& policy);

// The fewest sequences a decode-only step needs to take int8 activations
// under `policy`: 1 with int8_always, 0 (never) when exact, else
// int8_decode_timing().min_rows.
std::int32_t int8_decode_rows(const ActivationPolicy& policy);

// Whether a step of `tokens` tokens, `decodes` of which are a running
// sequence's next token, takes int8 activations under `policy`:
// int8_always, else a decode-only step of at least int8_decode_rows (> 0)
// sequences.
bool step_takes_int8(const ActivationPolicy& policy, std::int32_t tokens, std::int32_t decodes);

}  // namespace pagedattn::engine
