// Vectors whose storage starts on a cache line.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace pagedattn::core {

inline constexpr std::size_t kCacheLineBytes = 64;

// Rows of activations whose length is a multiple of 16 floats then all start
// on a line, and no 512-bit load from them splits over two lines (a split
// load takes two of a core's load slots).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLineBytes}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{kCacheLineBytes}); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
};

template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace pagedattn::core
