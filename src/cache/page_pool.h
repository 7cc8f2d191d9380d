// The page pool: reference counts and a free stack. It knows nothing about
// sequences or storage; callers check num_free() before take().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hasher.h"

namespace pagedattn::cache {

class PagePool {
 public:
  explicit PagePool(std::int64_t num_pages);

  std::int64_t num_pages() const { return static_cast<std::int64_t>(refcounts_.size()); }
  std::int64_t num_free() const { return static_cast<std::int64_t>(free_stack_.size()); }
  std::int32_t refcount(std::int32_t page) const { return refcounts_[page]; }
  bool is_shared(std::int32_t page) const { return refcounts_[page] > 1; }

  // Takes one free page with refcount 1. Precondition: num_free() > 0.
  std::int32_t take();
  // Undoes the last take() of `page` (takes are undone newest first, so the
  // free stack returns to its order). Precondition: refcount(page) == 1.
  void untake(std::int32_t page) {
    refcounts_[page] = 0;
    free_stack_.push_back(page);
  }
  // One more holder of `page`.
  void retain(std::int32_t page) { ++refcounts_[page]; }
  // One holder fewer; the page returns to the free stack at zero.
  void release(std::int32_t page);

  // Checks free stack == pages with refcount 0 and refcounts == `expected`.
  // Returns an empty string when consistent, else the first problem found.
  std::string check(const std::vector<std::int32_t>& expected_refcounts) const;
  void hash_into(Hasher& h) const;

 private:
  std::vector<std::int32_t> refcounts_;   // [num_pages]
  std::vector<std::int32_t> free_stack_;  // free page ids; back() is taken next
};

}  // namespace pagedattn::cache
