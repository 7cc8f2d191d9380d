#include "page_pool.h"

#include <string>

#include "pagedattn/errors.h"

namespace pagedattn::cache {

PagePool::PagePool(std::int64_t num_pages)
    : refcounts_(static_cast<std::size_t>(num_pages), 0) {
  free_stack_.reserve(static_cast<std::size_t>(num_pages));
  // Low page ids are handed out first.
  for (std::int64_t p = num_pages - 1; p >= 0; --p) free_stack_.push_back(static_cast<std::int32_t>(p));
}

std::int32_t PagePool::take() {
  const std::int32_t page = free_stack_.back();
  free_stack_.pop_back();
  refcounts_[page] = 1;
  return page;
}

void PagePool::release(std::int32_t page) {
  if (--refcounts_[page] == 0) free_stack_.push_back(page);
}

std::string PagePool::check(const std::vector<std::int32_t>& expected) const {
  std::vector<char> seen_free(refcounts_.size(), 0);
  for (std::int32_t page : free_stack_) {
    if (page < 0 || page >= num_pages()) return detail::concat("free stack holds page id ", page);
    if (seen_free[page]) return detail::concat("page ", page, " is on the free stack twice");
    seen_free[page] = 1;
    if (refcounts_[page] != 0)
      return detail::concat("page ", page, " is free but has refcount ", refcounts_[page]);
  }
  for (std::size_t p = 0; p < refcounts_.size(); ++p) {
    if (refcounts_[p] != expected[p])
      return detail::concat("page ", p, " has refcount ", refcounts_[p], " but ", expected[p],
                            " references");
    if (refcounts_[p] == 0 && !seen_free[p])
      return detail::concat("page ", p, " has refcount 0 but is not free (leak)");
  }
  return {};
}

void PagePool::hash_into(Hasher& h) const {
  h.add_span(std::span<const std::int32_t>(refcounts_));
  h.add_span(std::span<const std::int32_t>(free_stack_));
}

}  // namespace pagedattn::cache
