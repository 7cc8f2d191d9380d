// A process-wide on/off switch that an environment variable sets when the
// switch is first read and a setter overrides later (tests, A/B runs).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace pagedattn::core {

class EnvSwitch {
 public:
  // Off unless `variable` is "1" (fallback false), or on unless it is "0"
  // (fallback true).
  constexpr EnvSwitch(const char* variable, bool fallback)
      : variable_(variable), fallback_(fallback) {}

  bool on() {
    int v = state_.load(std::memory_order_relaxed);
    if (v < 0) {
      const char* value = std::getenv(variable_);
      const bool flipped = value != nullptr && std::strcmp(value, fallback_ ? "0" : "1") == 0;
      v = fallback_ != flipped ? 1 : 0;
      state_.store(v, std::memory_order_relaxed);
    }
    return v == 1;
  }
  void set(bool on) { state_.store(on ? 1 : 0, std::memory_order_relaxed); }

 private:
  const char* variable_;
  bool fallback_;
  std::atomic<int> state_{-1};  // -1: not yet read from the environment
};

}  // namespace pagedattn::core
