// PagedKVCache automatic prefix caching: publishing told pages, matching new
// prompts against the index, and the page supply that evicts cached pages
// (demoting them to the host tier when there is one).
#include <algorithm>

#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;
using cache::Tier;

// --- page supply ---------------------------------------------------------------

std::int32_t PagedKVCache::State::take_page() {
  if (pool.num_unused() == 0) evict_oldest_cached_page();
  const std::int32_t page = pool.take();
  storage.clear_nan_flags(page);  // a new owner: none of its slots is written yet
  return page;
}

void PagedKVCache::State::evict_oldest_cached_page() {
  const std::int32_t victim = pool.oldest_evictable();
  const std::uint64_t serial = index.entry_at(Tier::kDevice, victim);
  ++stats.evictions;
  if (host && host->pool.num_free() > 0) {
    const std::int32_t h = take_host_page();
    const std::pair<std::int64_t, std::int64_t> pair{victim, h};
    cache::copy_pages_between(storage, host->storage, {&pair, 1});
    index.move(serial, Tier::kHost, h);
    host->pool.cache(h);
    host->pool.release(h);  // the newest evictable host page
    ++stats.demotions;
  } else {
    index.erase(serial);
  }
  pool.uncache(victim);
}

std::int32_t PagedKVCache::State::take_host_page() {
  cache::PagePool& hp = host->pool;
  if (hp.num_unused() > 0) return hp.take();
  const std::int32_t victim = hp.oldest_evictable();
  index.erase(index.entry_at(Tier::kHost, victim));
  hp.uncache(victim);
  ++stats.host_evictions;
  return hp.take();
}

void PagedKVCache::State::release_pages(const Sequence& s) {
  cache::PagePool& p = s.swapped ? host->pool : pool;
  if (!caching()) {  // the free stack's order as it always was
    for (std::int32_t page : s.pages) p.release(page);
    return;
  }
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) p.release(*it);
}

// --- publishing and matching ---------------------------------------------------

void PagedKVCache::State::publish_told_pages(Sequence& s) {
  const std::int32_t ps = page_size();
  const auto full = static_cast<std::size_t>(std::ssize(s.tokens) / ps);
  while (s.chain.size() < full) {
    const std::size_t i = s.chain.size();
    const std::span<const std::int32_t> tokens(s.tokens.data() + i * std::size_t(ps),
                                               static_cast<std::size_t>(ps));
    const cache::PageKey parent_key = i == 0 ? cache::PageKey{} : s.chain[i - 1].key;
    const std::uint64_t parent = i == 0 ? cache::kRootSerial : s.chain[i - 1].serial;
    cache::ChainLink link{index.key_of(parent_key, s.salt, tokens), cache::kUnlinked};
    const std::int32_t page = s.pages[i];
    if (parent != cache::kUnlinked) {
      link.serial = index.find(link.key, parent, s.salt, tokens);
      // New content in a page not yet holding an entry: publish it. (A page
      // already holding other content means the caller told tokens that
      // differ from a sharer's; it stays unlinked.)
      if (link.serial == 0 && index.entry_at(Tier::kDevice, page) == 0) {
        link.serial = index.publish({link.key,
                                     parent_key,
                                     parent,
                                     s.salt,
                                     {tokens.begin(), tokens.end()},
                                     Tier::kDevice,
                                     page});
        pool.cache(page);
      } else if (link.serial == 0) {
        link.serial = cache::kUnlinked;
      }
    }
    s.chain.push_back(link);
  }
}

std::vector<std::uint64_t> PagedKVCache::State::match(std::span<const std::int32_t> tokens,
                                                      std::uint64_t salt) const {
  if (!caching() || tokens.empty()) return {};
  const std::int64_t max_pages = (std::ssize(tokens) - 1) / page_size();
  return index.longest_match(tokens, salt, page_size(), max_pages);
}

PrefixMatch PagedKVCache::State::summarize(const std::vector<std::uint64_t>& hits) const {
  PrefixMatch m;
  m.num_tokens = std::ssize(hits) * page_size();
  for (std::uint64_t serial : hits) {
    const cache::PrefixEntry& e = index.entry(serial);
    if (e.tier == Tier::kHost) {
      ++m.host_pages;
      ++m.pages_taken;
    } else {
      ++m.device_pages;
      m.pages_taken += pool.refcount(e.page) == 0 ? 1 : 0;
    }
  }
  return m;
}

// Gives `s` the pages of `hits`: device pages shared, host pages copied
// into fresh device pages (the entries move with them).
void PagedKVCache::State::hold_hits(const std::vector<std::uint64_t>& hits, Sequence& s) {
  s.pages.reserve(hits.size() + 1);
  // Every hit is held first, so that no take below can reclaim one of them.
  for (std::uint64_t serial : hits) {
    const cache::PrefixEntry& e = index.entry(serial);
    (e.tier == Tier::kDevice ? pool : host->pool).retain(e.page);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> host_to_device;
  for (std::uint64_t serial : hits) {
    const cache::PrefixEntry& e = index.entry(serial);
    if (e.tier == Tier::kHost) {  // promoted: the entry moves to a device page
      const std::int32_t host_page = e.page, page = take_page();
      host_to_device.emplace_back(host_page, page);
      index.move(serial, Tier::kDevice, page);
      pool.cache(page);
    }
    s.pages.push_back(index.entry(serial).page);
    s.chain.push_back({index.entry(serial).key, serial});
  }
  if (host_to_device.empty()) return;
  // The host pages go only after the copy (a demotion above must not reuse them).
  cache::copy_pages_between(host->storage, storage, host_to_device);
  for (const auto& [host_page, page] : host_to_device) {
    host->pool.uncache(static_cast<std::int32_t>(host_page));
    host->pool.release(static_cast<std::int32_t>(host_page));
  }
}

PrefixMatch PagedKVCache::match_prefix(std::span<const std::int32_t> token_ids,
                                       std::uint64_t cache_salt) const {
  const auto lock = state_->lock();
  return state_->summarize(state_->match(token_ids, cache_salt));
}

std::int64_t PagedKVCache::add_sequence_with_prefix(SeqId seq_id,
                                                    std::span<const std::int32_t> token_ids,
                                                    std::uint64_t cache_salt) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("add_sequence_with_prefix");
  require(!st.seqs.contains(seq_id), "PagedKVCache::add_sequence_with_prefix: seq_id = ", seq_id,
          " already exists");
  require(std::ssize(token_ids) <= kMaxInt32,
          "PagedKVCache::add_sequence_with_prefix: ", token_ids.size(),
          " token ids, more than 2^31 - 1");
  const std::vector<std::uint64_t> hits = st.match(token_ids, cache_salt);
  const PrefixMatch m = st.summarize(hits);
  st.require_free_pages(m.pages_taken, "add_sequence_with_prefix");

  st.seqs.reserve(st.seqs.size() + 1);
  Sequence s;
  s.salt = cache_salt;
  s.length = m.num_tokens;
  s.tokens.assign(token_ids.begin(), token_ids.begin() + m.num_tokens);
  st.hold_hits(hits, s);
  st.seqs.emplace(seq_id, std::move(s));

  PrefixCacheStats& c = st.stats;
  c.queries += 1;
  c.query_tokens += std::ssize(token_ids);
  c.hit_tokens += m.num_tokens;
  c.device_hit_tokens += m.device_pages * st.page_size();
  c.host_hit_tokens += m.host_pages * st.page_size();
  if (st.observer) {
    SequenceOp op{.kind = SequenceOp::Kind::kAddWithPrefix,
                  .seq_id = seq_id,
                  .count = m.num_tokens,
                  .salt = cache_salt};
    op.token_ids.assign(token_ids.begin(), token_ids.end());
    st.notify(op);
  }
  return m.num_tokens;
}

void PagedKVCache::set_sequence_tokens(SeqId seq_id, std::span<const std::int32_t> token_ids) {
  const auto lock = state_->lock();
  state_->set_tokens(seq_id, token_ids);
}

void PagedKVCache::State::set_tokens(SeqId seq_id, std::span<const std::int32_t> token_ids) {
  State& st = *this;
  st.require_no_forward("set_sequence_tokens");
  Sequence& s = st.find(seq_id, "set_sequence_tokens", "seq_id");
  st.require_not_swapped(s, seq_id, "set_sequence_tokens");
  if (!st.caching() || !s.prefix_trackable()) return;
  require(std::ssize(token_ids) <= s.committed_length(),
          "PagedKVCache::set_sequence_tokens: ", token_ids.size(),
          " token ids for seq_id = ", seq_id, ", which holds ", s.committed_length(),
          " committed tokens");
  const std::size_t common = std::min(token_ids.size(), s.tokens.size());
  const auto diff =
      std::mismatch(s.tokens.begin(), s.tokens.begin() + std::ptrdiff_t(common), token_ids.begin());
  require(diff.first == s.tokens.begin() + std::ptrdiff_t(common),
          "PagedKVCache::set_sequence_tokens: token_ids[", diff.first - s.tokens.begin(),
          "] = ", diff.second == token_ids.end() ? 0 : *diff.second, " for seq_id = ", seq_id,
          " differs from the token id told before (",
          diff.first == s.tokens.end() ? 0 : *diff.first, ")");
  if (token_ids.size() <= s.tokens.size()) return;
  const auto told_before = std::ssize(s.tokens);
  s.tokens.insert(s.tokens.end(), token_ids.begin() + told_before, token_ids.end());
  st.publish_told_pages(s);
  if (st.observer) {  // only the new tokens: a replica was told the others
    SequenceOp op{.kind = SequenceOp::Kind::kTellTokens, .seq_id = seq_id, .count = told_before};
    op.token_ids.assign(token_ids.begin() + told_before, token_ids.end());
    st.notify(op);
  }
}

std::int64_t PagedKVCache::num_cached_pages() const {
  const auto lock = state_->lock();
  return state_->pool.num_evictable();
}

PrefixCacheStats PagedKVCache::prefix_cache_stats() const {
  const auto lock = state_->lock();
  return state_->stats;
}

void PagedKVCache::reset_prefix_cache() {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("reset_prefix_cache");
  for (std::int32_t page : st.pool.evictable_pages()) {
    st.index.erase(st.index.entry_at(Tier::kDevice, page));
    st.pool.uncache(page);
  }
  if (st.host)
    for (std::int32_t page : st.host->pool.evictable_pages()) {
      st.index.erase(st.index.entry_at(Tier::kHost, page));
      st.host->pool.uncache(page);
    }
  st.notify({.kind = SequenceOp::Kind::kResetPrefixCache});
}

}  // namespace pagedattn
