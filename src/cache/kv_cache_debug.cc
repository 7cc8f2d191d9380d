// PagedKVCache debug K/V access: read and write a sequence's tokens in
// logical order as floats (dequantised / quantised like the kernels do).
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>

#include "kv_cache_state.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn {

using cache::Sequence;

namespace {

enum class KVAccess { kRead, kWrite };

// Validates a debug_get_kv / debug_set_kv range and buffer sizes. MLA writes
// take no V (it is the head of each K row); reads give it.
void validate_kv_range(const KVCacheConfig& c, const Sequence& s, SeqId id, std::int64_t start,
                       std::int64_t end, std::size_t k_size, std::size_t v_size, KVAccess access) {
  const char* call = access == KVAccess::kWrite ? "debug_set_kv" : "debug_get_kv";
  const bool no_v = c.attention_kind == AttentionKind::kMLA && access == KVAccess::kWrite;
  require(start >= 0 && start <= end && end <= s.length, "PagedKVCache::", call, ": range [", start,
          ", ", end, ") is not inside [0, ", s.length, "] of seq_id = ", id);
  const std::int64_t rows = std::int64_t{c.num_layers} * (end - start) * c.num_kv_heads;
  require(std::int64_t(k_size) == rows * c.head_dim, "PagedKVCache::", call, ": k buffer has ",
          k_size,
          " floats, expected num_layers x tokens x num_kv_heads x head_dim = ", rows * c.head_dim);
  if (no_v) {
    require(v_size == 0, "PagedKVCache::", call, ": v buffer has ", v_size,
            " floats; an MLA cache stores no V (give an empty one)");
    return;
  }
  require(std::int64_t(v_size) == rows * c.v_head_dim, "PagedKVCache::", call, ": v buffer has ",
          v_size, " floats, expected num_layers x tokens x num_kv_heads x v_head_dim = ",
          rows * c.v_head_dim);
}

// Slot (page * page_size + offset) of each token of [start, end).
std::vector<std::int64_t> slots_of(const Sequence& s, std::int32_t ps, std::int64_t start,
                                   std::int64_t end) {
  std::vector<std::int64_t> slots;
  for (std::int64_t t = start; t < end; ++t) {
    const std::int64_t slot = s.slot_of(t);
    slots.push_back(std::int64_t{s.pages[slot / ps]} * ps + slot % ps);
  }
  return slots;
}

// Host copies of some pages of a device cache (every layer), for the debug
// calls: `slots` renumbered onto `storage`, whose page i holds device page
// device_to_host[i].first.
struct StagedPages {
  std::vector<std::pair<std::int64_t, std::int64_t>> device_to_host;  // (device page, i)
  std::vector<std::int64_t> slots;
  std::unique_ptr<cache::PageStorage> storage;
};

StagedPages stage_pages(const cache::PageStorage& device, const KVCacheConfig& c,
                        const std::vector<std::int64_t>& slots) {
  StagedPages staged;
  std::unordered_map<std::int64_t, std::int64_t> index;  // device page -> host page
  for (std::int64_t slot : slots) {
    const std::int64_t page = slot / c.page_size;
    const auto [it, added] = index.emplace(page, std::ssize(staged.device_to_host));
    if (added) staged.device_to_host.emplace_back(page, it->second);
    staged.slots.push_back(it->second * c.page_size + slot % c.page_size);
  }
  KVCacheConfig host = c;
  host.num_pages = std::max<std::int64_t>(1, std::ssize(staged.device_to_host));
  host.memory_budget_bytes = 0;
  host.host_num_pages = 0;
  staged.storage = std::make_unique<cache::PageStorage>(host, cache::StorageKind::kHostStaging);
  cache::copy_pages_between(device, *staged.storage, staged.device_to_host);
  device.backend()->synchronize();
  return staged;
}

// Tokens [first, end) of `s` that the current step appends to it (plan row
// `b`), as [begin, end) token indices and the step row of `begin`.
struct StepTokens {
  std::int64_t begin = 0, end = 0, first_row = 0;
};
StepTokens step_tokens_in(const BatchPlan& plan, std::int32_t b, const Sequence& s,
                          std::int64_t start, std::int64_t end) {
  const std::int64_t n = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
  const std::int64_t first_new = s.length - n;
  StepTokens t;
  t.begin = std::max(start, first_new);
  t.end = std::max(t.begin, end);
  t.first_row = plan.qo_indptr[b] + (t.begin - first_new);
  return t;
}

}  // namespace

void PagedKVCache::debug_get_kv(SeqId seq_id, std::int64_t start, std::int64_t end,
                                std::span<float> k_out, std::span<float> v_out) const {
  const auto lock = state_->lock();
  const State& st = *state_;
  const KVCacheConfig& c = st.config;
  const Sequence& s = st.find(seq_id, "debug_get_kv", "seq_id");
  st.require_not_swapped(s, seq_id, "debug_get_kv");
  st.require_not_receiving(s, seq_id, "debug_get_kv");
  validate_kv_range(c, s, seq_id, start, end, k_out.size(), v_out.size(), KVAccess::kRead);
  std::vector<std::int64_t> slots = slots_of(s, c.page_size, start, end);
  // A device cache's pages are read from host copies of them.
  StagedPages staged;
  if (st.storage.on_device()) {
    staged = stage_pages(st.storage, c, slots);
    slots = staged.slots;
  }
  const cache::PageStorage& storage = staged.storage ? *staged.storage : st.storage;
  // Tokens this step appends whose layer has not been written yet read as
  // zeros: their slots may still hold a previous owner's K/V.
  StepTokens unwritten;
  if (const std::int32_t b = st.plan_index(seq_id); b >= 0)
    unwritten = step_tokens_in(st.plan, b, s, start, end);
  std::size_t k_at = 0, v_at = 0;
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    const PagedKVStorage ls = storage.layer(layer);
    for (std::int64_t t = start; t < end; ++t)
      for (std::int32_t head = 0; head < c.num_kv_heads; ++head) {
        const std::int64_t slot = slots[std::size_t(t - start)];
        if (t >= unwritten.begin && t < unwritten.end &&
            !st.step.layer_appended[std::size_t(layer)] &&
            !st.step.token_written[std::size_t(unwritten.first_row + t - unwritten.begin)]) {
          std::fill_n(k_out.begin() + std::ptrdiff_t(k_at), c.head_dim, 0.0f);
          std::fill_n(v_out.begin() + std::ptrdiff_t(v_at), c.v_head_dim, 0.0f);
          k_at += std::size_t(c.head_dim);
          v_at += std::size_t(c.v_head_dim);
          continue;
        }
        const std::int64_t page = slot / c.page_size, off = slot % c.page_size;
        const float ks = ls.k_dequant(page, head, off), vs = ls.v_dequant(page, head, off);
        const std::int64_t k0 = ls.k_offset(page, head, off), v0 = ls.v_offset(page, head, off);
        for (std::int32_t d = 0; d < c.head_dim; ++d)
          k_out[k_at++] = load_as_float(ls.k_data, ls.dtype, std::size_t(k0 + d)) * ks;
        for (std::int32_t d = 0; d < c.v_head_dim; ++d)
          v_out[v_at++] = load_as_float(ls.v_data, ls.dtype, std::size_t(v0 + d)) * vs;
      }
  }
}

void PagedKVCache::debug_set_kv(SeqId seq_id, std::int64_t start, std::int64_t end,
                                std::span<const float> k_in, std::span<const float> v_in) {
  const auto lock = state_->lock();
  State& st = *state_;
  const KVCacheConfig& c = st.config;
  const Sequence& s = st.find(seq_id, "debug_set_kv", "seq_id");
  st.require_not_swapped(s, seq_id, "debug_set_kv");
  st.require_not_receiving(s, seq_id, "debug_set_kv");
  validate_kv_range(c, s, seq_id, start, end, k_in.size(), v_in.size(), KVAccess::kWrite);
  for (std::int64_t t = start; t < end; ++t) {
    const std::int32_t page = s.pages[s.slot_of(t) / c.page_size];
    require(!st.pool.is_shared(page), "PagedKVCache::debug_set_kv: token ", t,
            " of seq_id = ", seq_id, " is in page ", page, ", shared by ", st.pool.refcount(page),
            " sequences; writing it would change them all");
    require(!st.pool.is_cached(page), "PagedKVCache::debug_set_kv: token ", t,
            " of seq_id = ", seq_id, " is in page ", page,
            ", shared with the prefix cache; writing it would "
            "change what later prompts match");
  }
  // The append kernel writes (and quantises) exactly as a forward step does;
  // on a device cache into host copies of the pages, copied back whole.
  std::vector<std::int64_t> slots = slots_of(s, c.page_size, start, end);
  StagedPages staged;
  if (st.storage.on_device()) {
    staged = stage_pages(st.storage, c, slots);
    slots = staged.slots;
  }
  const cache::PageStorage& storage = staged.storage ? *staged.storage : st.storage;
  const auto tokens = static_cast<std::int32_t>(end - start);
  const std::int64_t k_layer = std::int64_t{tokens} * c.num_kv_heads * c.head_dim;
  const std::int64_t v_layer = std::int64_t{tokens} * c.num_kv_heads * c.v_head_dim;
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    AppendParams p;
    p.k = {const_cast<float*>(k_in.data()) + layer * k_layer, DType::kF32,
           std::int64_t{c.num_kv_heads} * c.head_dim, c.head_dim};
    if (c.attention_kind != AttentionKind::kMLA)
      p.v = {const_cast<float*>(v_in.data()) + layer * v_layer, DType::kF32,
             std::int64_t{c.num_kv_heads} * c.v_head_dim, c.v_head_dim};
    p.slot_mapping = slots.data();
    p.num_tokens = tokens;
    p.kv = storage.layer(layer);
    append_paged_kv(p);
  }
  if (staged.storage) {
    std::vector<std::pair<std::int64_t, std::int64_t>> host_to_device;
    for (const auto& [page, host_page] : staged.device_to_host)
      host_to_device.emplace_back(host_page, page);
    cache::copy_pages_between(*staged.storage, st.storage, host_to_device);
    st.storage.backend()->synchronize();  // before the host copies go
  }
  // Every layer of these tokens now holds the caller's K/V.
  if (const std::int32_t b = st.plan_index(seq_id); b >= 0) {
    const StepTokens t = step_tokens_in(st.plan, b, s, start, end);
    for (std::int64_t row = t.first_row; row < t.first_row + (t.end - t.begin); ++row) {
      char& written = st.step.token_written[std::size_t(row)];
      st.step.tokens_written += written ? 0 : 1;
      written = 1;
    }
  }
}

}  // namespace pagedattn
