// PagedKVCache page transfer (disaggregated prefill/decode): the receiver's
// reserve / commit / cancel of a sequence whose K/V arrives from elsewhere,
// and the sender's pinned byte views of a sequence's pages. Both sides
// describe a sequence's bytes the same way (KVPageRuns), so any transport
// (MPI, memcpy) moves them storage to storage with no staging copy.
#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;

namespace {

// Appends [data, data + bytes) to `runs`, merging with the previous run when
// it ends where this one starts (neighbouring page ids).
void append_run(std::vector<std::span<std::byte>>& runs, std::byte* data, std::int64_t bytes) {
  if (!runs.empty() && runs.back().data() + runs.back().size() == data) {
    runs.back() = {runs.back().data(), runs.back().size() + static_cast<std::size_t>(bytes)};
    return;
  }
  runs.emplace_back(data, static_cast<std::size_t>(bytes));
}

// The canonical byte order of `pages` in one layer: K pages, then V pages,
// each in logical order. An int8 K page holds the page's K and V token
// scales after its K block (PageStorage::layer), so they travel with it: a
// page is two runs whatever its dtype. MLA storage (V inside K) has no V
// pages.
std::vector<std::span<std::byte>> layer_runs(const PagedKVStorage& s,
                                             const std::vector<std::int32_t>& pages) {
  const auto elem = static_cast<std::int64_t>(dtype_size(s.dtype));
  std::vector<std::span<std::byte>> runs;
  auto* k = static_cast<std::byte*>(s.k_data);
  auto* v = static_cast<std::byte*>(s.v_data);
  for (std::int32_t p : pages)
    append_run(runs, k + s.k_offset(p, 0, 0) * elem, s.k_page_stride * elem);
  for (std::int32_t p : pages)
    if (!s.v_in_k) append_run(runs, v + s.v_offset(p, 0, 0) * elem, s.v_page_stride * elem);
  return runs;
}

KVPageRuns runs_of(const KVCacheConfig& config, const cache::PageStorage& storage, SeqId id,
                   const Sequence& s) {
  KVPageRuns r;
  r.seq_id = id;
  r.num_tokens = s.length;
  r.pages = s.pages;
  r.layer_bytes = cache::PageStorage::layer_page_bytes(config) * std::ssize(s.pages);
  r.layers.reserve(static_cast<std::size_t>(config.num_layers));
  for (std::int32_t layer = 0; layer < config.num_layers; ++layer)
    r.layers.push_back(layer_runs(storage.layer(layer), s.pages));
  return r;
}

// Why a device cache refuses page transfer.
constexpr const char* kDeviceTransfer =
    "page transfer hands out byte views of the pages, device memory here, which needs "
    "CUDA-aware MPI; not served";

void require_receiving(const Sequence& s, SeqId id, const char* call) {
  require<InvalidState>(s.receiving, "PagedKVCache::", call, ": seq_id = ", id,
                        " is not receiving (reserve_incoming it first)");
}

}  // namespace

KVPageRuns PagedKVCache::reserve_incoming(SeqId seq_id, std::int64_t num_tokens) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_host_storage("reserve_incoming", kDeviceTransfer);
  st.require_no_forward("reserve_incoming");
  st.require_unobserved("reserve_incoming");
  require(!st.seqs.contains(seq_id), "PagedKVCache::reserve_incoming: seq_id = ", seq_id,
          " already exists");
  require(num_tokens >= 1 && num_tokens <= kMaxInt32,
          "PagedKVCache::reserve_incoming: num_tokens = ", num_tokens, " must be in [1, 2^31)");
  const std::int64_t pages = cache::pages_for_slots(num_tokens, st.page_size());
  st.require_free_pages(pages, "reserve_incoming");
  Sequence s;
  s.length = num_tokens;
  s.receiving = true;
  s.pages.reserve(static_cast<std::size_t>(pages));
  st.seqs.reserve(st.seqs.size() + 1);
  // With prefix caching this may evict cached pages (as begin_forward does).
  for (std::int64_t p = 0; p < pages; ++p) s.pages.push_back(st.take_page());
  KVPageRuns runs = runs_of(st.config, st.storage, seq_id, s);
  st.seqs.emplace(seq_id, std::move(s));
  return runs;
}

void PagedKVCache::commit_incoming(SeqId seq_id) {
  State& st = *state_;
  const auto lock = st.lock();
  Sequence& s = st.find(seq_id, "commit_incoming", "seq_id");
  require_receiving(s, seq_id, "commit_incoming");
  for (std::int32_t page : s.pages) st.storage.flag_nan_pages(page);  // bytes written by the caller
  s.receiving = false;
}

void PagedKVCache::cancel_incoming(SeqId seq_id) {
  State& st = *state_;
  const auto lock = st.lock();
  Sequence& s = st.find(seq_id, "cancel_incoming", "seq_id");
  require_receiving(s, seq_id, "cancel_incoming");
  // Freed newest first, so the free stack returns to its order before the
  // reservation.
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) st.pool.release(*it);
  st.seqs.erase(seq_id);
}

bool PagedKVCache::is_receiving(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "is_receiving", "seq_id").receiving;
}

OutgoingKV PagedKVCache::outgoing_pages(SeqId seq_id) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_host_storage("outgoing_pages", kDeviceTransfer);
  st.require_no_forward("outgoing_pages");
  st.require_unobserved("outgoing_pages");
  const Sequence& s = st.find(seq_id, "outgoing_pages", "seq_id");
  st.require_not_receiving(s, seq_id, "outgoing_pages");
  st.require_not_swapped(s, seq_id, "outgoing_pages");
  st.require_no_open_tree(s, seq_id, "outgoing_pages");
  require(s.gap_len == 0, "PagedKVCache::outgoing_pages: seq_id = ", seq_id,
          " has a sliding-window gap of ", s.gap_len, " slots; only gap-free sequences transfer");
  require(s.length >= 1, "PagedKVCache::outgoing_pages: seq_id = ", seq_id, " is empty");
  OutgoingKV out;
  out.runs = runs_of(st.config, st.storage, seq_id, s);
  st.outgoing.reserve(st.outgoing.size() + 1);
  out.id = st.next_outgoing_id++;
  for (std::int32_t page : s.pages) st.pool.retain(page);
  st.outgoing.emplace(out.id, s.pages);
  return out;
}

void PagedKVCache::release_outgoing(std::int64_t outgoing_id) {
  State& st = *state_;
  const auto lock = st.lock();
  const auto it = st.outgoing.find(outgoing_id);
  require(it != st.outgoing.end(), "PagedKVCache::release_outgoing: outgoing_id = ", outgoing_id,
          " is not pinned (released already, or never returned by outgoing_pages)");
  for (std::int32_t page : it->second) st.pool.release(page);
  st.outgoing.erase(it);
}

std::int64_t PagedKVCache::num_outgoing() const {
  const auto lock = state_->lock();
  return std::ssize(state_->outgoing);
}

}  // namespace pagedattn
