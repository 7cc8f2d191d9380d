#include "engine/step_activations.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/seconds_since.h"
#include "core/team.h"
#include "engine/gemm.h"
#include "kernels/cpu/product_paths.h"
#include "pagedattn/dtype.h"

namespace pagedattn::engine {

namespace {

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

Int8DecodeTiming time_int8_decode() {
  // SmolLM2's down projection (576 x 1536, 0.5 MB of Q4_K: in L2) on one
  // thread: each core's multiply rate on either path. (Split over many
  // threads, each share of so small a matrix would time the rounding of x
  // to int8, which every thread does for its columns, more than the
  // products; a larger model's shares are larger.)
  constexpr std::int32_t kIn = 1536, kOut = 576, kCalls = 8, kRounds = 7;
  const std::vector<std::uint8_t> w = random_q4_k(kOut, kIn);
  std::vector<float> x(std::size_t(kInt8DecodeMinRows) * kIn);
  std::vector<float> y(std::size_t(kInt8DecodeMinRows) * kOut);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (float& v : x) v = value(rng);
  LinearScratch scratch;
  const core::SoloScope one_thread;
  auto seconds = [&](Activations activations) {
    LinearArgs a{x.data(), kInt8DecodeMinRows, kIn, w.data(), kOut, y.data()};
    a.w_format = WeightFormat::kQ4_K;
    a.activations = activations;
    const double start = steady_seconds();
    for (int call = 0; call < kCalls; ++call) linear(a, scratch);
    return (steady_seconds() - start) / kCalls;
  };
  seconds(Activations::kF32);  // warm-up: caches, scratch
  seconds(Activations::kInt8);
  Int8DecodeTiming t;
  t.f32_seconds = t.int8_seconds = std::numeric_limits<double>::infinity();
  for (int round = 0; round < kRounds; ++round) {
    t.f32_seconds = std::min(t.f32_seconds, seconds(Activations::kF32));
    t.int8_seconds = std::min(t.int8_seconds, seconds(Activations::kInt8));
  }
  t.pays = t.int8_seconds <= kInt8DecodeMargin * t.f32_seconds;
  if (kernels::log_product_measurements())
    std::fprintf(stderr,
                 "pagedattn: int8 activations for decode steps of %d or more sequences: %.1f us "
                 "against %.1f us on f32 activations (Q4_K 576 x 1536, %d rows): %s\n",
                 kInt8DecodeMinRows, t.int8_seconds * 1e6, t.f32_seconds * 1e6, kInt8DecodeMinRows,
                 t.pays ? "taken" : "not taken");
  return t;
}

}  // namespace

const Int8DecodeTiming& int8_decode_timing() {
  static const Int8DecodeTiming timing = time_int8_decode();
  return timing;
}

void prepare_step_activations(const ActivationPolicy& policy) {
  if (!policy.int8_always && !policy.exact) int8_decode_timing();
}

bool step_takes_int8(const ActivationPolicy& policy, std::int32_t tokens, std::int32_t decodes) {
  if (policy.int8_always) return true;
  if (policy.exact || tokens != decodes || decodes < kInt8DecodeMinRows) return false;
  return int8_decode_timing().pays;
}

}  // namespace pagedattn::engine
