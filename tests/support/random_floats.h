// Random test data from a 32- or 64-bit engine, without the standard
// distributions: libstdc++'s std::generate_canonical (behind
// std::uniform_real_distribution and std::normal_distribution) evaluates a
// long double logarithm on every call, which made generating K/V values most
// of the kernel tests' run time (more so under the sanitizers). The values
// are a pure function of the engine's outputs, so a seed gives the same data
// with every compiler and standard library.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace pagedattn::test {

// A float in [0, 1) with 24 random bits (every such value is exact in f32).
template <class Engine>
float unit_float(Engine& engine) {
  // The engine's range, not its result type, gives the random bits: mt19937
  // returns 32 of them in a 64-bit unsigned long.
  constexpr bool k32 = Engine::max() == 0xFFFFFFFFu;
  static_assert(
      Engine::min() == 0 && (k32 || Engine::max() == std::numeric_limits<std::uint64_t>::max()),
      "unit_float needs an engine with 32 or 64 random bits");
  constexpr int kDrop = (k32 ? 32 : 64) - 24;
  return static_cast<float>(static_cast<std::uint64_t>(engine()) >> kDrop) * 0x1p-24f;
}

// Uniform floats in [lo, hi): a stand-in for std::uniform_real_distribution.
class UniformFloats {
 public:
  UniformFloats(float lo, float hi) : lo_(lo), width_(hi - lo) {}
  template <class Engine>
  float operator()(Engine& engine) {
    return lo_ + width_ * unit_float(engine);
  }

 private:
  float lo_;
  float width_;
};

// Normal floats (Marsaglia's polar method, which yields them in pairs): a
// stand-in for std::normal_distribution.
class NormalFloats {
 public:
  explicit NormalFloats(float mean = 0.0f, float stddev = 1.0f) : mean_(mean), stddev_(stddev) {}
  template <class Engine>
  float operator()(Engine& engine) {
    if (has_spare_) {
      has_spare_ = false;
      return mean_ + stddev_ * spare_;
    }
    float u = 0.0f, v = 0.0f, s = 0.0f;
    do {
      u = 2.0f * unit_float(engine) - 1.0f;
      v = 2.0f * unit_float(engine) - 1.0f;
      s = u * u + v * v;
    } while (s >= 1.0f || s == 0.0f);
    const float scale = std::sqrt(-2.0f * std::log(s) / s);
    spare_ = v * scale;
    has_spare_ = true;
    return mean_ + stddev_ * u * scale;
  }

 private:
  float mean_;
  float stddev_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

}  // namespace pagedattn::test
