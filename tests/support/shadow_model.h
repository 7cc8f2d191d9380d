// ShadowModel: a trivially correct model of PagedKVCache, the oracle of the
// randomized and scenario tests.
//
// Each sequence is a plain vector of tokens in retained order. A token keeps
// the uid of its K/V values and its "absolute slot": the slot it would occupy
// if no page were ever dropped (sinks at 0..sink-1, every later token at the
// index it was appended at, counting evicted tokens). Page k of a sequence in
// this absolute space holds absolute slots [k*page_size, (k+1)*page_size); a
// sequence holds exactly the pages that contain a retained token. Pages carry
// model ids: forks share ids, a copy (partial page at a fork point, or a
// copy-on-write before an append into a shared page) gets a new id. The real
// cache must match this page structure one-to-one.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::test {

class ShadowModel {
 public:
  struct Token {
    std::uint64_t uid = 0;
    std::int64_t abs_slot = 0;
  };
  struct Page {
    std::int64_t abs_page = 0;
    std::int64_t id = 0;  // model page id
  };
  struct Seq {
    std::vector<Token> tokens;
    std::vector<Page> pages;  // ascending abs_page
    std::int64_t window = 0;  // 0 = no sliding window
    std::int64_t sink = 0;
    bool evicted = false;

    std::int64_t length() const { return static_cast<std::int64_t>(tokens.size()); }
    std::int64_t poppable() const { return evicted ? length() - sink : length(); }
    std::int64_t next_abs_slot() const { return tokens.empty() ? 0 : tokens.back().abs_slot + 1; }
  };

  // How often the interesting paths were taken (for coverage assertions).
  struct Counters {
    std::int64_t fork_copies = 0;      // partial pages copied by forks
    std::int64_t copies_on_write = 0;  // shared partial pages copied before an append
    std::int64_t evicted_tokens = 0;   // tokens dropped by sliding windows
    std::int64_t pops_after_eviction = 0;
    std::int64_t gap_forks = 0;  // children that kept a windowed parent's gap
  };

  explicit ShadowModel(std::int32_t page_size) : page_size_(page_size) {}
  const Counters& counters() const { return counters_; }

  std::int32_t page_size() const { return page_size_; }
  bool has(SeqId id) const { return seqs_.contains(id); }
  const Seq& seq(SeqId id) const { return seqs_.at(id); }
  const std::map<SeqId, Seq>& seqs() const { return seqs_; }
  std::int64_t total_length() const;
  // Distinct pages held by all sequences (= pages not free in the cache).
  std::int64_t pages_in_use() const { return static_cast<std::int64_t>(refs_.size()); }
  std::int32_t refcount(std::int64_t page_id) const;

  // --- the operations (arguments must be valid) ------------------------------
  void add(SeqId id);
  void remove(SeqId id);
  void fork(SeqId parent, SeqId child, std::int64_t fork_pos);  // fork_pos resolved, not -1
  void pop(SeqId id, std::int64_t n);
  void append(SeqId id, std::span<const std::uint64_t> uids);
  void slide(SeqId id);  // what end_forward does to each sequence of the step
  void enable_window(SeqId id, std::int64_t window, std::int64_t sink);
  void overwrite(SeqId id, std::int64_t start, std::span<const std::uint64_t> uids);

  // --- derived expectations ----------------------------------------------------
  // Pages a begin_forward appending lens[i] tokens to ids[i] takes (in order).
  std::int64_t append_cost(std::span<const SeqId> ids, std::span<const std::int64_t> lens) const;
  // Physical slot of retained token j within the sequence's page list.
  std::int64_t physical_slot(SeqId id, std::int64_t token) const;
  // The gap (PagedKVTable::kv_gap_lens) and sink length the cache reports.
  std::int64_t gap(SeqId id) const;
  std::int64_t sink(SeqId id) const { return seq(id).sink; }
  // Whether token j sits in a page another sequence also holds.
  bool token_in_shared_page(SeqId id, std::int64_t token) const;
  std::vector<std::uint64_t> uids(SeqId id, std::int64_t start, std::int64_t end) const;
  std::vector<std::uint64_t> uids(SeqId id) const { return uids(id, 0, seq(id).length()); }

 private:
  std::int64_t new_page();
  void release(std::int64_t page_id);
  void drop_empty_pages(Seq& s);
  std::int64_t page_index(const Seq& s, std::int64_t abs_page) const;

  std::int32_t page_size_;
  std::map<SeqId, Seq> seqs_;
  std::map<std::int64_t, std::int32_t> refs_;  // model page id -> holders
  std::int64_t next_page_id_ = 0;
  Counters counters_;
};

}  // namespace pagedattn::test
