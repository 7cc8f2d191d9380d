// The AMX tile configuration (the 64 bytes ldtilecfg reads) and its loading
// where a thread's tiles are not configured so already. Only where the CPU
// has AMX tiles and Linux permitted them (cpu_features(): amx_bf16,
// amx_int8): sttilecfg and ldtilecfg fault elsewhere.
#pragma once

#include <cstdint>

namespace pagedattn::kernels {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
  friend bool operator==(const TileConfig&, const TileConfig&) = default;
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Tiles [0, count) of `rows` rows of `bytes` bytes each, the others unused.
constexpr TileConfig uniform_tile_config(int count, std::uint8_t rows, std::uint16_t bytes) {
  TileConfig c;
  for (int t = 0; t < count; ++t) {
    c.rows[t] = rows;
    c.bytes_per_row[t] = bytes;
  }
  return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Loads `want` unless the calling thread's tiles hold it already: reading
// the configuration back takes about a tenth of loading it (ldtilecfg
// costs about as long as a few rows' products of a weight group). The asm
// names all 64 bytes (GCC 12's _tile_loadconfig names 8 as read, so the
// stores that build a local configuration may be dropped).
inline void use_tile_config(const TileConfig& want) {
  TileConfig now;
  asm volatile("sttilecfg %0" : "=m"(now));
  if (!(now == want)) asm volatile("ldtilecfg %0" : : "m"(want));
}
#endif

}  // namespace pagedattn::kernels
