// The last-level cache size, header-only (std only), so that the peer
// harnesses built outside CMake (bench/peers/) size their working sets as
// the project's benchmarks do.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

namespace pagedattn::bench {

// The L3 size in bytes from sysfs, or `fallback`. sysfs describes what this
// (virtual) machine exposes; sysconf may report the host's figure instead.
inline std::size_t l3_cache_bytes(std::size_t fallback = std::size_t{32} << 20) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || level != 3 || size.empty()) continue;
    std::size_t multiplier = 1;
    if (size.back() == 'K') multiplier = std::size_t{1} << 10;
    if (size.back() == 'M') multiplier = std::size_t{1} << 20;
    if (multiplier != 1) size.pop_back();
    try {
      return std::stoull(size) * multiplier;
    } catch (...) {
      continue;
    }
  }
  return fallback;
}

}  // namespace pagedattn::bench
