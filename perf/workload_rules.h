// How the attention benchmarks size their K/V working sets and count FLOPs,
// header-only (std only), so that the peer harnesses built outside CMake
// (bench/peers/) follow the same rules as bench-attention.
#pragma once

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <string>

namespace pagedattn::bench {

// The L3 size in bytes from sysfs, or `fallback`. sysfs describes what this
// (virtual) machine exposes; sysconf may report the host's figure instead.
inline std::size_t l3_cache_bytes(std::size_t fallback = std::size_t{32} << 20) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
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

// The K/V bytes all copies of a workload add up to (at least): several
// times the last-level cache, so that calls rotating through them read K/V
// from DRAM.
inline std::size_t min_working_set_bytes() {
  return std::max<std::size_t>(std::size_t{256} << 20, 4 * l3_cache_bytes());
}

// 2 FLOP per multiply-add in QK^T and PV over the keys each query sees
// (causal, bottom-right: query i of q_len sees kv_len - q_len + i + 1 keys).
inline double attention_flops(double batch, double qo_heads, double head_dim, double q_len,
                              double kv_len) {
  const double prefix = kv_len - q_len;
  return batch * 4.0 * head_dim * (q_len * prefix + q_len * (q_len + 1) / 2) * qo_heads;
}

}  // namespace pagedattn::bench
