// Reading GGUF's little-endian scalars from unaligned bytes (the reader and
// the metadata accessors share it).
#pragma once

#include <cstddef>
#include <cstring>

namespace pagedattn::gguf_detail {

// One fixed-size scalar at `p` (no alignment needed; GGUF is little-endian,
// as is every machine this builds for).
template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace pagedattn::gguf_detail
