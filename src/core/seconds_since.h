#pragma once

#include <chrono>

namespace pagedattn {

// Wall time since `start` on the steady clock, in seconds: how the engine's
// and the distributed modes' statistics count step and transfer times.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The steady clock's reading in seconds: only differences between two
// readings mean anything (CPU-load samples, the CLI's progress bar).
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace pagedattn
