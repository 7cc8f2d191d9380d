#include "engine/step_activations.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/seconds_since.h"
#include "core/team.h"
#include "engine/dot_tiles.h"
#include "engine/gemm.h"
#include "engine/onednn_matmul.h"
#include "kernels/cpu/product_paths.h"
#include "pagedattn/dtype.h"

namespace pagedattn::engine {

namespace {

// SmolLM2's down projection (576 x 1536, 0.5 MB of Q4_K: in L2), timed on
// one thread: each core's multiply rate on either path. (Split over many
// threads, each share of so small a matrix would time the rounding of x to
// int8, which every thread does for its columns, more than the products; a
// larger model's shares are larger.)
constexpr std::int32_t kTimedOut = 576, kTimedIn = 1536;

// Random Q4_K blocks with small scales: the kernels' cost does not depend
// on the values.
std::vector<std::uint8_t> random_q4_k(std::int32_t out, std::int32_t in) {
  std::vector<std::uint8_t> w(std::size_t(out) *
                              std::size_t(weight_row_bytes(WeightFormat::kQ4_K, in)));
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<std::uint8_t>(rng());
  const std::uint16_t scale = float_to_f16_bits(0.01f);
  const auto block = std::size_t(weight_block_bytes(WeightFormat::kQ4_K));
  for (std::size_t at = 0; at < w.size(); at += block) {
    std::memcpy(&w[at], &scale, 2);      // d
    std::memcpy(&w[at + 2], &scale, 2);  // dmin
  }
  return w;
}

// One product of the timings: x [rows][kTimedIn] in [-1, 1) times the Q4_K
// matrix w, and the mean time of a call of a route of linear() on it.
struct TimedProduct {
  std::vector<float> x, y;
  LinearArgs args;
  LinearScratch scratch;
  TimedProduct(const std::vector<std::uint8_t>& w, std::int32_t rows)
      : x(std::size_t(rows) * kTimedIn), y(std::size_t(rows) * kTimedOut) {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (float& v : x) v = value(rng);
    args = {x.data(), rows, kTimedIn, w.data(), kTimedOut, y.data()};
    args.w_format = WeightFormat::kQ4_K;
  }
  TimedProduct(const TimedProduct&) = delete;
  TimedProduct& operator=(const TimedProduct&) = delete;
  // run(args, scratch) `calls` times: the seconds of one call, on average.
  template <typename Run>
  double seconds(int calls, Run&& run) {
    const double start = steady_seconds();
    for (int call = 0; call < calls; ++call) run(args, scratch);
    return (steady_seconds() - start) / calls;
  }
};

// The best time of one call on each path at `rows` rows, alternated.
Int8DecodeTiming::Point time_rows(const std::vector<std::uint8_t>& w, std::int32_t rows) {
  constexpr std::int32_t kCalls = 4, kRounds = 5;
  TimedProduct product(w, rows);
  const auto seconds = [&](Activations activations) {
    return product.seconds(kCalls, [&](LinearArgs a, LinearScratch& scratch) {
      a.activations = activations;
      linear(a, scratch);
    });
  };
  seconds(Activations::kF32);  // warm-up: caches, scratch
  seconds(Activations::kInt8);
  Int8DecodeTiming::Point p{rows, std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::infinity()};
  for (int round = 0; round < kRounds; ++round) {
    p.f32_seconds = std::min(p.f32_seconds, seconds(Activations::kF32));
    p.int8_seconds = std::min(p.int8_seconds, seconds(Activations::kInt8));
  }
  return p;
}

Int8DecodeTiming time_int8_decode() {
  const std::vector<std::uint8_t> w = random_q4_k(kTimedOut, kTimedIn);
  const core::SoloScope one_thread;
  Int8DecodeTiming t;
  for (std::size_t i = 0; i < kInt8DecodeRows.size(); ++i) {
    t.points[i] = time_rows(w, kInt8DecodeRows[i]);
    if (t.points[i].int8_seconds <= kInt8DecodeMargin * t.points[i].f32_seconds) {
      t.min_rows = kInt8DecodeRows[i];
      break;  // more rows only favour int8 further
    }
  }
  if (kernels::log_product_measurements())
    for (const Int8DecodeTiming::Point& p : t.points)
      if (p.rows > 0)
        std::fprintf(stderr,
                     "pagedattn: int8 activations for decode steps of %d sequences: %.1f us "
                     "against %.1f us on f32 (Q4_K 576 x 1536, one thread): %s\n",
                     p.rows, p.int8_seconds * 1e6, p.f32_seconds * 1e6,
                     p.rows == t.min_rows ? "taken from here on" : "not taken");
  return t;
}

// The best time of one call on each bf16 route at `rows` rows, alternated
// (larger batches fewer calls: the 512-row f32 route takes milliseconds).
Bf16RouteTiming::Point time_bf16_rows(const std::vector<std::uint8_t>& w, std::int32_t rows) {
  constexpr double kNone = std::numeric_limits<double>::infinity();
  const int calls = rows >= 256 ? 1 : 3, rounds = rows >= 256 ? 2 : 4;
  TimedProduct product(w, rows);
  product.args.activations = Activations::kF32;
  product.args.bf16_batches = true;
  const auto seconds = [&](Bf16Route route) {
    return product.seconds(calls, [&](const LinearArgs& a, LinearScratch& scratch) {
      linear_on_bf16_route(a, scratch, route);
    });
  };
  const bool onednn = onednn_bf16_products();
  Bf16RouteTiming::Point p{rows, kNone, kNone, kNone};
  for (int round = -1; round < rounds; ++round) {  // round -1 warms caches and primitives
    const double f32 = seconds(Bf16Route::kF32), tiles = seconds(Bf16Route::kTiles);
    const double mat = onednn ? seconds(Bf16Route::kOneDnn) : kNone;
    if (round < 0) continue;
    p.f32_seconds = std::min(p.f32_seconds, f32);
    p.tiles_seconds = std::min(p.tiles_seconds, tiles);
    p.onednn_seconds = std::min(p.onednn_seconds, mat);
  }
  return p;
}

Bf16RouteTiming time_bf16_routes() {
  Bf16RouteTiming t;
  for (std::size_t i = 0; i < t.points.size(); ++i) t.points[i].rows = kBf16RouteRows[i];
  if (!dot_tiles_bf16_available()) return t;  // all f32, nothing to time
  const std::vector<std::uint8_t> w = random_q4_k(kTimedOut, kTimedIn);
  const core::SoloScope one_thread;
  const Bf16Routes fixed = fixed_bf16_routes();
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    t.points[i] = time_bf16_rows(w, kBf16RouteRows[i]);
    t.routes.route[i] = fastest_bf16_route(t.points[i], fixed.route[i]);
  }
  if (kernels::log_product_measurements())
    for (std::size_t i = 0; i < t.points.size(); ++i) {
      const Bf16RouteTiming::Point& p = t.points[i];
      std::fprintf(stderr,
                   "pagedattn: bf16 products from %d rows: f32 %.1f us, bf16 tiles %.1f us, oneDNN "
                   "bf16 %.1f us (Q4_K 576 x 1536, one thread): %s\n",
                   p.rows, p.f32_seconds * 1e6, p.tiles_seconds * 1e6, p.onednn_seconds * 1e6,
                   bf16_route_name(t.routes.route[i]));
    }
  return t;
}

}  // namespace

Bf16Route fastest_bf16_route(const Bf16RouteTiming::Point& p, Bf16Route fixed) {
  const bool fixed_onednn = fixed == Bf16Route::kOneDnn;
  const double kept = fixed_onednn ? p.onednn_seconds : p.tiles_seconds;
  const double other = fixed_onednn ? p.tiles_seconds : p.onednn_seconds;
  const bool onednn = other <= kBf16Margin * kept ? !fixed_onednn : fixed_onednn;
  const double bf16 = onednn ? p.onednn_seconds : p.tiles_seconds;
  if (!(bf16 <= kBf16Margin * p.f32_seconds)) return Bf16Route::kF32;
  return onednn ? Bf16Route::kOneDnn : Bf16Route::kTiles;
}

const Bf16RouteTiming& bf16_route_timing() {
  static const Bf16RouteTiming timing = time_bf16_routes();
  return timing;
}

const Int8DecodeTiming& int8_decode_timing() {
  static const Int8DecodeTiming timing = time_int8_decode();
  return timing;
}

void prepare_step_activations(const ActivationPolicy& policy) {
  int8_decode_rows(policy);  // times where the choice rests on the timing
  if (policy.bf16) set_bf16_routes(bf16_route_timing().routes);
}

std::int32_t int8_decode_rows(const ActivationPolicy& policy) {
  if (policy.int8_always) return 1;
  return policy.exact ? 0 : int8_decode_timing().min_rows;
}

bool step_takes_int8(const ActivationPolicy& policy, std::int32_t tokens, std::int32_t decodes) {
  if (policy.int8_always) return true;
  if (tokens != decodes) return false;
  const std::int32_t min_rows = int8_decode_rows(policy);
  return min_rows > 0 && decodes >= min_rows;
}

}  // namespace pagedattn::engine
