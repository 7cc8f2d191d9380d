// PagedKVCache queries, invariant checker and state digest.
#include <algorithm>

#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;
using detail::concat;

// Every query holds the lock too: another thread may be mutating the state.
std::int64_t PagedKVCache::num_pages() const {
  return state_->pool.num_pages();
}  // fixed
std::int64_t PagedKVCache::num_free_pages() const {
  const auto lock = state_->lock();
  return state_->pool.num_free();
}
std::int64_t PagedKVCache::num_sequences() const {
  const auto lock = state_->lock();
  return std::ssize(state_->seqs);
}
bool PagedKVCache::has_sequence(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->seqs.contains(seq_id);
}

std::int64_t PagedKVCache::sequence_length(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "sequence_length", "seq_id").length;
}

std::int64_t PagedKVCache::num_dropped_tokens(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "num_dropped_tokens", "seq_id").evicted;
}

std::int64_t PagedKVCache::total_sequence_length() const {
  const auto lock = state_->lock();
  std::int64_t total = 0;
  for (const auto& [id, s] : state_->seqs) total += s.length;
  return total;
}

std::vector<SeqId> PagedKVCache::sequence_ids() const {
  const auto lock = state_->lock();
  std::vector<SeqId> ids;
  ids.reserve(state_->seqs.size());
  for (const auto& [id, s] : state_->seqs) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool PagedKVCache::empty() const {
  const auto lock = state_->lock();
  return state_->seqs.empty() && state_->pool.num_free() == state_->pool.num_pages();
}

std::int64_t PagedKVCache::bytes_per_page() const {
  return cache::PageStorage::page_bytes(state_->config);
}
std::int64_t PagedKVCache::storage_bytes() const {
  return state_->storage.total_bytes();
}

PagedKVStorage PagedKVCache::layer_storage(std::int32_t layer) const {
  require(layer >= 0 && layer < state_->config.num_layers,
          "PagedKVCache::layer_storage: layer = ", layer, " is outside [0, ",
          state_->config.num_layers, ")");
  // Without the e4m3 NaN flags: a caller may write these pages with its own
  // kernels and attend over them before mark_layer_appended updates them.
  PagedKVStorage s = state_->storage.layer(layer);
  s.page_may_hold_nan = nullptr;
  return s;
}

std::vector<std::int32_t> PagedKVCache::sequence_pages(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "sequence_pages", "seq_id").pages;
}

std::int32_t PagedKVCache::page_refcount(std::int32_t page) const {
  const auto lock = state_->lock();
  require(page >= 0 && page < state_->pool.num_pages(),
          "PagedKVCache::page_refcount: page = ", page, " is outside [0, ",
          state_->pool.num_pages(), ")");
  return state_->pool.refcount(page);
}

namespace {

// The first broken invariant of one sequence, or "".
std::string check_sequence(const Sequence& s, std::int32_t ps, std::int64_t num_pages,
                           bool in_forward) {
  if (s.length < 0 || s.gap_len < 0)
    return concat("negative length ", s.length, " or gap ", s.gap_len);
  if (std::ssize(s.pages) != cache::pages_for_slots(s.used_slots(), ps))
    return concat("holds ", s.pages.size(), " pages for ", s.used_slots(), " slots");
  for (std::int32_t page : s.pages)
    if (page < 0 || page >= num_pages) return concat("holds page id ", page);
  if (s.tree_size() > s.length || (!s.tree_open && s.tree_size() > 0) ||
      s.tree_depths.size() != s.tree_parents.size())
    return concat("has ", s.tree_size(), " tree nodes (open ", s.tree_open, ") for length ",
                  s.length);
  for (std::int64_t i = 0; i < s.tree_size(); ++i)
    if (s.tree_parents[i] < -1 || s.tree_parents[i] >= i)
      return concat("tree node ", i, " has parent ", s.tree_parents[i]);
  if (!s.windowed()) {
    // Only a child forked from a windowed parent past its sinks has a gap.
    if (s.evicted == 0)
      return s.gap_len != 0 ? concat("has a gap without a window") : std::string();
    if (s.length <= s.sink_len && s.gap_len != 0)
      return concat("keeps a gap after only ", s.length, " tokens");
  } else {
    if (!in_forward && s.length > s.window_size)
      return concat("holds ", s.length, " tokens, window is ", s.window_size);
    if (s.sink_len >= s.window_size) return concat("sink ", s.sink_len, " >= window");
  }
  const std::int64_t whole_gap_pages = (s.sink_len + s.gap_len) / ps - (s.sink_len + ps - 1) / ps;
  if (whole_gap_pages > 0) return concat("keeps ", whole_gap_pages, " pages wholly in the gap");
  return {};
}

}  // namespace

namespace {

// The first broken prefix-caching invariant of one sequence, or "".
std::string check_prefix_links(const Sequence& s, const cache::PagePool& pool,
                               const cache::PrefixIndex& index, std::int32_t ps) {
  if (!s.prefix_trackable() && !s.tokens.empty())
    return concat("tracks ", s.tokens.size(), " token ids with a window or gap");
  if (std::ssize(s.tokens) > s.committed_length())
    return concat("was told ", s.tokens.size(), " token ids for ", s.committed_length(),
                  " committed tokens");
  if (s.chain.size() != s.tokens.size() / std::size_t(ps))
    return concat("has ", s.chain.size(), " chain links for ", s.tokens.size(), " told tokens");
  if (s.swapped) return {};
  for (std::size_t i = 0; i < s.chain.size(); ++i) {
    const std::uint64_t serial = index.entry_at(cache::Tier::kDevice, s.pages[i]);
    if (serial == 0 || serial != s.chain[i].serial) continue;
    const cache::PrefixEntry& e = index.entry(serial);
    if (!std::equal(e.tokens.begin(), e.tokens.end(), s.tokens.begin() + std::ptrdiff_t(i * ps)))
      return concat("holds cached page ", s.pages[i], " whose token ids differ from its own");
    if (!pool.is_cached(s.pages[i])) return concat("links page ", s.pages[i], " not marked cached");
  }
  return {};
}

// Cached marks of a pool agree with the index's page map of its tier.
std::string check_cached_marks(const cache::PagePool& pool, const cache::PrefixIndex& index,
                               cache::Tier tier) {
  for (std::int32_t p = 0; p < pool.num_pages(); ++p)
    if (pool.is_cached(p) != (index.entry_at(tier, p) != 0))
      return concat("page ", p, " of tier ", int(tier), " is marked cached ", pool.is_cached(p),
                    " but the index ", index.entry_at(tier, p) != 0 ? "has" : "lacks", " it");
  return {};
}

}  // namespace

void PagedKVCache::check_invariants() const {
  const auto lock = state_->lock();
  const State& st = *state_;
  auto fail = [](const std::string& problem) {
    if (!problem.empty()) throw InternalError(concat("PagedKVCache invariant broken: ", problem));
  };
  const std::int64_t host_pages = st.host ? st.host->pool.num_pages() : 0;
  std::vector<std::int32_t> references(static_cast<std::size_t>(st.pool.num_pages()), 0);
  std::vector<std::int32_t> host_references(static_cast<std::size_t>(host_pages), 0);
  for (const auto& [id, s] : st.seqs) {
    std::string problem = check_sequence(
        s, st.page_size(), s.swapped ? host_pages : st.pool.num_pages(), st.in_forward);
    if (problem.empty()) problem = check_prefix_links(s, st.pool, st.index, st.page_size());
    if (!problem.empty()) fail(concat("seq_id = ", id, " ", problem));
    for (std::int32_t page : s.pages) ++(s.swapped ? host_references : references)[page];
  }
  for (std::int32_t page : st.step.deferred) ++references[page];
  for (const auto& [id, pinned] : st.outgoing)
    for (std::int32_t page : pinned) ++references[page];
  fail(st.pool.check(references));
  fail(st.index.check());
  fail(check_cached_marks(st.pool, st.index, cache::Tier::kDevice));
  if (!st.host) return;
  fail(st.host->pool.check(host_references));
  fail(check_cached_marks(st.host->pool, st.index, cache::Tier::kHost));
  for (std::int32_t p = 0; p < st.host->pool.num_pages(); ++p)
    if (st.host->pool.is_cached(p) && st.host->pool.refcount(p) != 0)
      fail(concat("host page ", p, " is cached and held by a swapped sequence"));
}

std::uint64_t PagedKVCache::state_digest() const {
  const auto lock = state_->lock();
  return state_->digest();
}

namespace {

// Live slots per page of one tier: the most any holder uses; cached pages
// nobody holds are full (a later prompt may match them).
std::vector<std::int32_t> live_slots_of(const cache::PagePool& pool,
                                        const std::unordered_map<SeqId, Sequence>& seqs,
                                        bool swapped, std::int32_t ps) {
  std::vector<std::int32_t> live(static_cast<std::size_t>(pool.num_pages()), 0);
  for (const auto& [id, s] : seqs) {
    if (s.swapped != swapped) continue;
    for (std::size_t p = 0; p < s.pages.size(); ++p) {
      const auto used = static_cast<std::int32_t>(
          std::min<std::int64_t>(ps, s.used_slots() - static_cast<std::int64_t>(p) * ps));
      live[s.pages[p]] = std::max(live[s.pages[p]], used);
    }
  }
  for (std::int32_t page : pool.evictable_pages()) live[page] = ps;
  return live;
}

void hash_live_slots(const cache::PageStorage& storage, const std::vector<std::int32_t>& live,
                     cache::Hasher& h) {
  for (std::size_t p = 0; p < live.size(); ++p)
    if (live[p] > 0) storage.hash_slots(static_cast<std::int32_t>(p), live[p], h);
}

}  // namespace

// Metadata, then the K/V of every live slot: slots past the end of every
// holder of a page are dead (a cancelled step's rows, popped tokens) and no
// call can read them, so they are not part of the state.
std::uint64_t PagedKVCache::State::digest() const {
  const State& st = *this;
  cache::Hasher h;
  st.pool.hash_into(h);
  st.index.hash_into(h);
  if (st.host) st.host->pool.hash_into(h);
  std::vector<SeqId> ids;
  ids.reserve(st.seqs.size());
  for (const auto& [id, s] : st.seqs) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (SeqId id : ids) {
    const Sequence& s = st.seqs.at(id);
    h.add(id);
    for (std::int64_t v : {s.length, s.gap_len, s.window_size, s.sink_len, s.evicted}) h.add(v);
    h.add_span(std::span<const std::int32_t>(s.pages));
    h.add(s.tree_open);
    h.add_span(std::span<const std::int32_t>(s.tree_parents));
    h.add(s.swapped);
    h.add(s.salt);
    h.add_span(std::span<const std::int32_t>(s.tokens));
    for (const cache::ChainLink& link : s.chain) {
      h.add(link.key);
      h.add(link.serial);
    }
    h.add(s.receiving);
  }
  // Pinned transfers, in pin order.
  std::vector<std::int64_t> pins;
  for (const auto& [pin, pages] : st.outgoing) pins.push_back(pin);
  std::sort(pins.begin(), pins.end());
  for (std::int64_t pin : pins) {
    h.add(pin);
    h.add_span(std::span<const std::int32_t>(st.outgoing.at(pin)));
  }
  h.add(st.next_outgoing_id);
  h.add(st.in_forward);
  if (st.in_forward) {
    h.add_span(std::span<const SeqId>(st.plan.seq_ids));
    h.add_span(std::span<const std::int32_t>(st.step.deferred));
  }
  hash_live_slots(st.storage, live_slots_of(st.pool, st.seqs, false, st.page_size()), h);
  if (st.host)
    hash_live_slots(st.host->storage, live_slots_of(st.host->pool, st.seqs, true, st.page_size()),
                    h);
  return h.value();
}

}  // namespace pagedattn
