// PagedKVCache queries, invariant checker, state digest and debug K/V access.
#include <algorithm>

#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;
using detail::concat;

std::int64_t PagedKVCache::num_pages() const { return state_->pool.num_pages(); }
std::int64_t PagedKVCache::num_free_pages() const { return state_->pool.num_free(); }
std::int64_t PagedKVCache::num_sequences() const { return std::ssize(state_->seqs); }
bool PagedKVCache::has_sequence(SeqId seq_id) const { return state_->seqs.contains(seq_id); }

std::int64_t PagedKVCache::sequence_length(SeqId seq_id) const {
  return state_->find(seq_id, "sequence_length", "seq_id").length;
}

std::int64_t PagedKVCache::total_sequence_length() const {
  std::int64_t total = 0;
  for (const auto& [id, s] : state_->seqs) total += s.length;
  return total;
}

std::vector<SeqId> PagedKVCache::sequence_ids() const {
  std::vector<SeqId> ids;
  ids.reserve(state_->seqs.size());
  for (const auto& [id, s] : state_->seqs) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool PagedKVCache::empty() const {
  return state_->seqs.empty() && state_->pool.num_free() == state_->pool.num_pages();
}

std::int64_t PagedKVCache::bytes_per_page() const {
  return cache::PageStorage::page_bytes(state_->config);
}
std::int64_t PagedKVCache::storage_bytes() const { return state_->storage.total_bytes(); }

PagedKVStorage PagedKVCache::layer_storage(std::int32_t layer) const {
  require(layer >= 0 && layer < state_->config.num_layers, "PagedKVCache::layer_storage: layer = ",
          layer, " is outside [0, ", state_->config.num_layers, ")");
  return state_->storage.layer(layer);
}

std::vector<std::int32_t> PagedKVCache::sequence_pages(SeqId seq_id) const {
  return state_->find(seq_id, "sequence_pages", "seq_id").pages;
}

std::int32_t PagedKVCache::page_refcount(std::int32_t page) const {
  require(page >= 0 && page < state_->pool.num_pages(), "PagedKVCache::page_refcount: page = ",
          page, " is outside [0, ", state_->pool.num_pages(), ")");
  return state_->pool.refcount(page);
}

namespace {

// The first broken invariant of one sequence, or "".
std::string check_sequence(const Sequence& s, std::int32_t ps, std::int64_t num_pages,
                           bool in_forward) {
  if (s.length < 0 || s.gap_len < 0) return concat("negative length ", s.length, " or gap ", s.gap_len);
  if (std::ssize(s.pages) != cache::pages_for_slots(s.used_slots(), ps))
    return concat("holds ", s.pages.size(), " pages for ", s.used_slots(), " slots");
  for (std::int32_t page : s.pages)
    if (page < 0 || page >= num_pages) return concat("holds page id ", page);
  if (!s.windowed()) {
    if (s.gap_len != 0 || s.evicted != 0) return concat("has a gap without a window");
    return {};
  }
  if (!in_forward && s.length > s.window_size)
    return concat("holds ", s.length, " tokens, window is ", s.window_size);
  if (s.sink_len >= s.window_size) return concat("sink ", s.sink_len, " >= window");
  const std::int64_t whole_gap_pages =
      (s.sink_len + s.gap_len) / ps - (s.sink_len + ps - 1) / ps;
  if (whole_gap_pages > 0) return concat("keeps ", whole_gap_pages, " pages wholly in the gap");
  return {};
}

}  // namespace

void PagedKVCache::check_invariants() const {
  const State& st = *state_;
  std::vector<std::int32_t> references(static_cast<std::size_t>(st.pool.num_pages()), 0);
  for (const auto& [id, s] : st.seqs) {
    const std::string problem = check_sequence(s, st.page_size(), st.pool.num_pages(), st.in_forward);
    if (!problem.empty())
      throw InternalError(concat("PagedKVCache invariant broken: seq_id = ", id, " ", problem));
    for (std::int32_t page : s.pages) ++references[page];
  }
  const std::string problem = st.pool.check(references);
  if (!problem.empty()) throw InternalError(concat("PagedKVCache invariant broken: ", problem));
}

std::uint64_t PagedKVCache::state_digest() const {
  const State& st = *state_;
  cache::Hasher h;
  st.pool.hash_into(h);
  for (SeqId id : sequence_ids()) {
    const Sequence& s = st.seqs.at(id);
    h.add(id);
    for (std::int64_t v : {s.length, s.gap_len, s.window_size, s.sink_len, s.evicted}) h.add(v);
    h.add_span(std::span<const std::int32_t>(s.pages));
  }
  h.add(st.in_forward);
  if (st.in_forward) h.add_span(std::span<const SeqId>(st.plan.seq_ids));
  for (std::int64_t p = 0; p < st.pool.num_pages(); ++p)
    if (st.pool.refcount(static_cast<std::int32_t>(p)) > 0)
      st.storage.hash_page(static_cast<std::int32_t>(p), h);
  return h.value();
}

// --- debug K/V access ----------------------------------------------------------

namespace {

// Validates a debug_get_kv / debug_set_kv range and buffer sizes.
void validate_kv_range(const KVCacheConfig& c, const Sequence& s, SeqId id, std::int64_t start,
                       std::int64_t end, std::size_t k_size, std::size_t v_size, const char* call) {
  require(start >= 0 && start <= end && end <= s.length, "PagedKVCache::", call, ": range [",
          start, ", ", end, ") is not inside [0, ", s.length, "] of seq_id = ", id);
  const std::int64_t rows = std::int64_t{c.num_layers} * (end - start) * c.num_kv_heads;
  require(std::int64_t(k_size) == rows * c.head_dim, "PagedKVCache::", call, ": k buffer has ",
          k_size, " floats, expected num_layers x tokens x num_kv_heads x head_dim = ",
          rows * c.head_dim);
  require(std::int64_t(v_size) == rows * c.v_head_dim, "PagedKVCache::", call, ": v buffer has ",
          v_size, " floats, expected num_layers x tokens x num_kv_heads x v_head_dim = ",
          rows * c.v_head_dim);
}

// Calls fn(layer_storage, page, slot, row) for every (layer, token, head) of
// [start, end) in the debug buffers' order; `row` indexes heads of tokens.
template <typename Fn>
void for_each_kv_row(const cache::PageStorage& storage, const KVCacheConfig& c, const Sequence& s,
                     std::int64_t start, std::int64_t end, Fn&& fn) {
  std::int64_t row = 0;
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    const PagedKVStorage ls = storage.layer(layer);
    for (std::int64_t t = start; t < end; ++t) {
      const std::int64_t slot = s.slot_of(t);
      const std::int32_t page = s.pages[slot / c.page_size];
      for (std::int32_t head = 0; head < c.num_kv_heads; ++head, ++row)
        fn(ls, page, head, static_cast<std::int32_t>(slot % c.page_size), row);
    }
  }
}

}  // namespace

void PagedKVCache::debug_get_kv(SeqId seq_id, std::int64_t start, std::int64_t end,
                                std::span<float> k_out, std::span<float> v_out) const {
  const State& st = *state_;
  const KVCacheConfig& c = st.config;
  const Sequence& s = st.find(seq_id, "debug_get_kv", "seq_id");
  validate_kv_range(c, s, seq_id, start, end, k_out.size(), v_out.size(), "debug_get_kv");
  for_each_kv_row(st.storage, c, s, start, end,
                  [&](const PagedKVStorage& ls, std::int32_t page, std::int32_t head,
                      std::int32_t slot, std::int64_t row) {
                    const std::int64_t k0 = ls.k_offset(page, head, slot);
                    const std::int64_t v0 = ls.v_offset(page, head, slot);
                    for (std::int32_t d = 0; d < c.head_dim; ++d)
                      k_out[row * c.head_dim + d] = load_as_float(ls.k_data, ls.dtype, k0 + d);
                    for (std::int32_t d = 0; d < c.v_head_dim; ++d)
                      v_out[row * c.v_head_dim + d] = load_as_float(ls.v_data, ls.dtype, v0 + d);
                  });
}

void PagedKVCache::debug_set_kv(SeqId seq_id, std::int64_t start, std::int64_t end,
                                std::span<const float> k_in, std::span<const float> v_in) {
  State& st = *state_;
  const KVCacheConfig& c = st.config;
  const Sequence& s = st.find(seq_id, "debug_set_kv", "seq_id");
  validate_kv_range(c, s, seq_id, start, end, k_in.size(), v_in.size(), "debug_set_kv");
  for (std::int64_t t = start; t < end; ++t) {
    const std::int32_t page = s.pages[s.slot_of(t) / c.page_size];
    require(!st.pool.is_shared(page), "PagedKVCache::debug_set_kv: token ", t, " of seq_id = ",
            seq_id, " is in page ", page, ", shared by ", st.pool.refcount(page),
            " sequences; writing it would change them all");
  }
  for_each_kv_row(st.storage, c, s, start, end,
                  [&](const PagedKVStorage& ls, std::int32_t page, std::int32_t head,
                      std::int32_t slot, std::int64_t row) {
                    const std::int64_t k0 = ls.k_offset(page, head, slot);
                    const std::int64_t v0 = ls.v_offset(page, head, slot);
                    for (std::int32_t d = 0; d < c.head_dim; ++d)
                      store_from_float(ls.k_data, ls.dtype, k0 + d, k_in[row * c.head_dim + d]);
                    for (std::int32_t d = 0; d < c.v_head_dim; ++d)
                      store_from_float(ls.v_data, ls.dtype, v0 + d, v_in[row * c.v_head_dim + d]);
                  });
}

}  // namespace pagedattn
