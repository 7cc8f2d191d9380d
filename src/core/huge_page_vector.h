// Vectors of weights, which a decode step streams end to end: from
// kHugePageBytes up their storage is a mapping of its own, on a huge-page
// boundary, marked MADV_HUGEPAGE, so that Linux backs it with 2 MiB pages
// where transparent huge pages are "madvise" (Debian's and Ubuntu's
// default) as well as "always". With 4 KiB pages a stream through a model's
// weights misses the TLB at every page, and the hardware prefetchers stop
// at every page boundary (docs/benchmarks.md, "Weights on huge pages").
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "core/cache_line_vector.h"

namespace pagedattn::core {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// A fresh anonymous mapping of at least `bytes`, aligned to kHugePageBytes
// and advised MADV_HUGEPAGE (std::bad_alloc when none can be mapped);
// free_huge_pages(p, the same bytes) gives it back. It ends at the system
// page after `bytes`: a last, partial huge page takes small pages, not a
// whole 2 MiB.
void* allocate_huge_pages(std::size_t bytes);
void free_huge_pages(void* p, std::size_t bytes);

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(std::size_t n) {
    if (n * sizeof(T) < kHugePageBytes) return CacheLineAllocator<T>().allocate(n);
    return static_cast<T*>(allocate_huge_pages(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    if (n * sizeof(T) < kHugePageBytes) return CacheLineAllocator<T>().deallocate(p, n);
    free_huge_pages(p, n * sizeof(T));
  }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
};

template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace pagedattn::core
