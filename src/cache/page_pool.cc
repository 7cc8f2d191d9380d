#include "page_pool.h"

#include <string>

#include "pagedattn/errors.h"

namespace pagedattn::cache {

PagePool::PagePool(std::int64_t num_pages)
    : refcounts_(static_cast<std::size_t>(num_pages), 0),
      cached_(static_cast<std::size_t>(num_pages), 0),
      lru_prev_(static_cast<std::size_t>(num_pages), -1),
      lru_next_(static_cast<std::size_t>(num_pages), -1) {
  free_stack_.reserve(static_cast<std::size_t>(num_pages));
  // Low page ids are handed out first.
  for (std::int64_t p = num_pages - 1; p >= 0; --p)
    free_stack_.push_back(static_cast<std::int32_t>(p));
}

std::int32_t PagePool::take() {
  const std::int32_t page = free_stack_.back();
  free_stack_.pop_back();
  refcounts_[page] = 1;
  return page;
}

void PagePool::retain(std::int32_t page) {
  if (refcounts_[page]++ == 0) lru_unlink(page);  // only cached pages are held from 0
}

void PagePool::release(std::int32_t page) {
  if (--refcounts_[page] != 0) return;
  if (cached_[page])
    lru_push_back(page);
  else
    free_stack_.push_back(page);
}

void PagePool::uncache(std::int32_t page) {
  cached_[page] = 0;
  if (refcounts_[page] != 0) return;
  lru_unlink(page);
  free_stack_.push_back(page);
}

void PagePool::lru_push_back(std::int32_t page) {
  lru_prev_[page] = lru_tail_;
  lru_next_[page] = -1;
  if (lru_tail_ >= 0)
    lru_next_[lru_tail_] = page;
  else
    lru_head_ = page;
  lru_tail_ = page;
  ++lru_size_;
}

void PagePool::lru_unlink(std::int32_t page) {
  const std::int32_t prev = lru_prev_[page], next = lru_next_[page];
  (prev >= 0 ? lru_next_[prev] : lru_head_) = next;
  (next >= 0 ? lru_prev_[next] : lru_tail_) = prev;
  lru_prev_[page] = lru_next_[page] = -1;
  --lru_size_;
}

std::vector<std::int32_t> PagePool::evictable_pages() const {
  std::vector<std::int32_t> pages;
  for (std::int32_t p = lru_head_; p >= 0 && std::ssize(pages) <= lru_size_; p = lru_next_[p])
    pages.push_back(p);
  return pages;
}

std::string PagePool::check(const std::vector<std::int32_t>& expected) const {
  // 1 = on the free stack, 2 = in the LRU list.
  std::vector<char> seen(refcounts_.size(), 0);
  for (std::int32_t page : free_stack_) {
    if (page < 0 || page >= num_pages()) return detail::concat("free stack holds page id ", page);
    if (seen[page]) return detail::concat("page ", page, " is on the free stack twice");
    seen[page] = 1;
    if (refcounts_[page] != 0)
      return detail::concat("page ", page, " is free but has refcount ", refcounts_[page]);
    if (cached_[page]) return detail::concat("page ", page, " is free but marked cached");
  }
  const std::vector<std::int32_t> lru = evictable_pages();
  if (std::ssize(lru) != lru_size_)
    return detail::concat("the LRU list has ", lru.size(), " pages, its count says ", lru_size_);
  std::int32_t prev = -1;
  for (std::int32_t page : lru) {
    if (seen[page]) return detail::concat("page ", page, " is in the LRU list and free or twice");
    seen[page] = 2;
    if (refcounts_[page] != 0 || !cached_[page])
      return detail::concat("page ", page, " is evictable with refcount ", refcounts_[page],
                            ", cached ", int{cached_[page]});
    if (lru_prev_[page] != prev) return detail::concat("page ", page, " has a broken LRU link");
    prev = page;
  }
  if (prev != lru_tail_) return detail::concat("the LRU tail is ", lru_tail_, ", not ", prev);
  for (std::size_t p = 0; p < refcounts_.size(); ++p) {
    if (refcounts_[p] != expected[p])
      return detail::concat("page ", p, " has refcount ", refcounts_[p], " but ", expected[p],
                            " references");
    if (refcounts_[p] == 0 && !seen[p])
      return detail::concat("page ", p, " has refcount 0 but is neither free nor cached (leak)");
  }
  return {};
}

void PagePool::hash_into(Hasher& h) const {
  h.add_span(std::span<const std::int32_t>(refcounts_));
  h.add_span(std::span<const std::int32_t>(free_stack_));
  h.add_span(std::span<const char>(cached_));
  const std::vector<std::int32_t> lru = evictable_pages();
  h.add_span(std::span<const std::int32_t>(lru));
}

}  // namespace pagedattn::cache
