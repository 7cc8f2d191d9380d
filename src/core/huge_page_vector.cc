#include "core/huge_page_vector.h"

#include <cstdint>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace pagedattn::core {

#if defined(__linux__)
namespace {
std::size_t whole_pages(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}
}  // namespace

void* allocate_huge_pages(std::size_t requested) {
  // Mapped one huge page longer, then trimmed to a huge-page boundary in
  // front and to the system page after `requested`: mmap itself only
  // aligns to the system page.
  const std::size_t bytes = whole_pages(requested), mapped = bytes + kHugePageBytes;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > begin) munmap(p, aligned - begin);
  const std::uintptr_t end = begin + mapped, aligned_end = aligned + bytes;
  if (end > aligned_end) munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  auto* data = reinterpret_cast<void*>(aligned);
  madvise(data, bytes, MADV_HUGEPAGE);  // a hint: refused, the system pages serve
  return data;
}

void free_huge_pages(void* p, std::size_t bytes) {
  if (p != nullptr) munmap(p, whole_pages(bytes));
}
#else
void* allocate_huge_pages(std::size_t bytes) {
  return ::operator new (bytes, std::align_val_t{kHugePageBytes});
}

void free_huge_pages(void* p, std::size_t) {
  ::operator delete (p, std::align_val_t{kHugePageBytes});
}
#endif

}  // namespace pagedattn::core
