// Counter-based random numbers: a value is a pure function of its
// coordinates, so results do not depend on the order of draws (sampling
// under any batching, weights filled by any number of threads).
#pragma once

#include <cstdint>

namespace pagedattn::engine {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) at coordinates (stream, index) of generator `seed`.
inline double counter_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace pagedattn::engine
