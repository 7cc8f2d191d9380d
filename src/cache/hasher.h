// A small 64-bit streaming hash for state digests (not cryptographic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace pagedattn::cache {

class Hasher {
 public:
  void add_bytes(const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= size; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, p + i, 8);
      mix(word);
    }
    std::uint64_t tail = 0;
    if (i < size) {
      std::memcpy(&tail, p + i, size - i);
      mix(tail ^ (static_cast<std::uint64_t>(size - i) << 56));
    }
    mix(size);
  }
  template <typename T>
  void add(const T& value) {
    add_bytes(&value, sizeof(T));
  }
  template <typename T>
  void add_span(std::span<const T> values) {
    add_bytes(values.data(), values.size_bytes());
  }
  std::uint64_t value() const { return state_; }

 private:
  void mix(std::uint64_t word) {
    // splitmix64-style finaliser over the running state.
    std::uint64_t z = state_ ^ (word + 0x9e3779b97f4a7c15ull + (state_ << 6) + (state_ >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    state_ = z ^ (z >> 31);
  }
  std::uint64_t state_ = 0x243f6a8885a308d3ull;
};

}  // namespace pagedattn::cache
