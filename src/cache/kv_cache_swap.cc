// PagedKVCache host tier: swapping whole sequences out to host pages and back
// (vLLM's swap_blocks path for preemption).
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;

std::vector<std::int32_t> PagedKVCache::State::distinct_pages(std::span<const SeqId> ids) const {
  std::vector<std::int32_t> pages;
  std::unordered_set<std::int32_t> seen;
  for (SeqId id : ids)
    for (std::int32_t page : seqs.at(id).pages)
      if (seen.insert(page).second) pages.push_back(page);
  return pages;
}

void PagedKVCache::State::validate_swap(std::span<const SeqId> ids, bool swapped,
                                        const char* call) const {
  require_no_forward(call);
  require<InvalidState>(host != nullptr, "PagedKVCache::", call,
                        ": the cache has no host tier (KVCacheConfig.host_num_pages = 0)");
  require_unique_ids(ids, call);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = seqs.find(ids[i]);
    require(it != seqs.end(), "PagedKVCache::", call, ": seq_ids[", i, "] = ", ids[i],
            " does not exist");
    require<InvalidState>(it->second.swapped == swapped, "PagedKVCache::", call, ": seq_ids[", i,
                          "] = ", ids[i],
                          swapped ? " is not swapped out" : " is already swapped out");
    require_no_open_tree(it->second, ids[i], call);
  }
}

namespace {

// Replaces every page of the listed sequences by its counterpart in `to`:
// the first holder takes over the reference `to` was taken with, later
// holders retain it; every old reference is released from `from`.
void remap_pages(std::unordered_map<SeqId, Sequence>& seqs, std::span<const SeqId> ids,
                 const std::unordered_map<std::int32_t, std::int32_t>& to_page,
                 cache::PagePool& from, cache::PagePool& to) {
  std::unordered_map<std::int32_t, bool> claimed;
  for (SeqId id : ids) {
    Sequence& s = seqs.at(id);
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) {
      const std::int32_t old_page = *it, new_page = to_page.at(old_page);
      if (claimed[new_page]) to.retain(new_page);
      claimed[new_page] = true;
      from.release(old_page);
      *it = new_page;
    }
    s.swapped = !s.swapped;
  }
}

}  // namespace

void PagedKVCache::swap_out(std::span<const SeqId> seq_ids) {
  State& st = *state_;
  const auto lock = st.lock();
  st.validate_swap(seq_ids, false, "swap_out");
  const std::vector<std::int32_t> pages = st.distinct_pages(seq_ids);
  if (std::ssize(pages) > st.host->pool.num_free())
    throw OutOfPages(detail::concat("PagedKVCache::swap_out: needs ", pages.size(),
                                    " free host pages, ", st.host->pool.num_free(), " of ",
                                    st.host->pool.num_pages(), " are free"));
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  std::unordered_map<std::int32_t, std::int32_t> to_host;
  for (std::int32_t page : pages) {
    const std::int32_t h = st.take_host_page();
    pairs.emplace_back(page, h);
    to_host[page] = h;
  }
  cache::copy_pages_between(st.storage, st.host->storage, pairs);
  remap_pages(st.seqs, seq_ids, to_host, st.pool, st.host->pool);
  st.stats.swapped_out_pages += std::ssize(pages);
  st.notify_list(SequenceOp::Kind::kSwapOut, seq_ids, {});
}

void PagedKVCache::swap_in(std::span<const SeqId> seq_ids) {
  State& st = *state_;
  const auto lock = st.lock();
  st.validate_swap(seq_ids, true, "swap_in");
  const std::vector<std::int32_t> pages = st.distinct_pages(seq_ids);
  st.require_free_pages(std::ssize(pages), "swap_in");
  // The swapped pages are held, so the demotions of take_page never reuse them.
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  std::unordered_map<std::int32_t, std::int32_t> to_device;
  for (std::int32_t h : pages) {
    const std::int32_t page = st.take_page();
    pairs.emplace_back(h, page);
    to_device[h] = page;
  }
  cache::copy_pages_between(st.host->storage, st.storage, pairs);
  remap_pages(st.seqs, seq_ids, to_device, st.host->pool, st.pool);
  st.stats.swapped_in_pages += std::ssize(pages);
  st.notify_list(SequenceOp::Kind::kSwapIn, seq_ids, {});
}

bool PagedKVCache::is_swapped(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "is_swapped", "seq_id").swapped;
}

std::int64_t PagedKVCache::swap_in_pages_needed(std::span<const SeqId> seq_ids) const {
  const auto lock = state_->lock();
  state_->validate_swap(seq_ids, true, "swap_in_pages_needed");
  return std::ssize(state_->distinct_pages(seq_ids));
}

std::int64_t PagedKVCache::num_free_host_pages() const {
  const auto lock = state_->lock();
  return state_->host ? state_->host->pool.num_free() : 0;
}

std::int64_t PagedKVCache::num_host_pages() const {
  return state_->config.host_num_pages;  // fixed
}

}  // namespace pagedattn
