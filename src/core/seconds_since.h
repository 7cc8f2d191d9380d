#pragma once

#include <chrono>

namespace pagedattn {

// Wall time since `start` on the steady clock, in seconds: how the engine's
// and the distributed modes' statistics count step and transfer times.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace pagedattn
