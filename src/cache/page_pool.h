// The page pool: reference counts, a stack of unused pages and an LRU list of
// cached pages. A page nobody holds is either unused (on the free stack) or
// cached (it holds a published prefix, see prefix_index.h): cached pages
// with refcount 0 wait in the LRU list, oldest first, and count as free
// because the pool may reclaim them. The pool knows nothing about sequences,
// storage or hashes: callers reclaim the oldest cached page (uncache) before
// take() when no page is unused.
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
  // Pages that can be taken: unused plus evictable cached ones.
  std::int64_t num_free() const { return num_unused() + num_evictable(); }
  std::int64_t num_unused() const { return static_cast<std::int64_t>(free_stack_.size()); }
  std::int64_t num_evictable() const { return lru_size_; }
  std::int32_t refcount(std::int32_t page) const { return refcounts_[page]; }
  bool is_shared(std::int32_t page) const { return refcounts_[page] > 1; }
  bool is_cached(std::int32_t page) const { return cached_[page] != 0; }
  // The least recently released cached page nobody holds, or -1.
  std::int32_t oldest_evictable() const { return lru_head_; }

  // Takes an unused page with refcount 1. Precondition: num_unused() > 0.
  std::int32_t take();
  // Undoes the last take() of `page` (takes are undone newest first, so the
  // free stack returns to its order). Precondition: refcount(page) == 1.
  void untake(std::int32_t page) {
    refcounts_[page] = 0;
    free_stack_.push_back(page);
  }
  // One more holder of `page` (a cached page leaves the LRU list).
  void retain(std::int32_t page);
  // One holder fewer; at zero the page becomes unused, or evictable (the
  // newest in the LRU list) if it is cached.
  void release(std::int32_t page);
  // Marks a held page as holding a published prefix.
  void cache(std::int32_t page) { cached_[page] = 1; }
  // Unmarks a cached page; if nobody holds it, it leaves the LRU list for
  // the free stack.
  void uncache(std::int32_t page);

  // Checks free stack and LRU list against refcounts and cached marks, and
  // refcounts == `expected`. Returns "" when consistent, else the first
  // problem found.
  std::string check(const std::vector<std::int32_t>& expected_refcounts) const;
  void hash_into(Hasher& h) const;
  // Cached pages nobody holds, oldest first.
  std::vector<std::int32_t> evictable_pages() const;

 private:
  void lru_push_back(std::int32_t page);
  void lru_unlink(std::int32_t page);

  std::vector<std::int32_t> refcounts_;   // [num_pages]
  std::vector<std::int32_t> free_stack_;  // unused page ids; back() is taken next
  std::vector<char> cached_;              // [num_pages] holds a published prefix
  // Intrusive doubly linked LRU list of evictable pages (-1 ends it).
  std::vector<std::int32_t> lru_prev_, lru_next_;
  std::int32_t lru_head_ = -1, lru_tail_ = -1;
  std::int64_t lru_size_ = 0;
};

}  // namespace pagedattn::cache
