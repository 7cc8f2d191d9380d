// A sequence: its page list and the mapping from token index to physical
// slot. Tokens [0, sink_len) sit at slots [0, sink_len); later tokens j sit
// at slot j + gap_len. The gap only exists for sliding-window sequences, where
// it holds the tokens that fell out of the window inside pages still needed.
//
// Invariants (checked by PagedKVCache::check_invariants):
//   pages.size() == ceil((length + gap_len) / page_size)
//   gap_len == 0 unless a window is enabled; no page lies wholly in the gap
//   a windowed sequence holds at most window_size tokens between steps
#pragma once

#include <cstdint>
#include <vector>

#include "prefix_index.h"

namespace pagedattn::cache {

// Prefix caching: what the sequence's i-th full told page is in the index.
struct ChainLink {
  PageKey key;                       // key of the page's content
  std::uint64_t serial = kUnlinked;  // the entry with that content, or kUnlinked
};

struct Sequence {
  std::vector<std::int32_t> pages;  // page ids in logical order
  std::int64_t length = 0;          // tokens held
  std::int64_t gap_len = 0;         // dead slots after the sinks
  std::int64_t window_size = 0;     // 0 = no sliding window
  std::int64_t sink_len = 0;        // attention-sink tokens kept at the front
  std::int64_t evicted = 0;         // tokens dropped by the window so far
  // Uncommitted token tree (speculative decoding), open from the first tree
  // forward until commit: its nodes are the last tree_parents.size() tokens,
  // in node order; parent -1 = child of the committed prefix.
  bool tree_open = false;
  std::vector<std::int32_t> tree_parents;
  std::vector<std::int32_t> tree_depths;  // [tree_parents.size()]
  // Prefix caching (set_sequence_tokens): the token ids told so far, and a
  // link per full page among them. Never tracked for windowed sequences or
  // sequences with a gap.
  std::uint64_t salt = 0;
  std::vector<std::int32_t> tokens;
  std::vector<ChainLink> chain;  // [tokens.size() / page_size]
  // Swapped out: `pages` are host-tier page ids.
  bool swapped = false;
  // Reserved by reserve_incoming, its K/V still in flight (page transfer):
  // only commit_incoming / cancel_incoming may touch it.
  bool receiving = false;

  bool windowed() const { return window_size > 0; }
  std::int64_t tree_size() const { return std::ssize(tree_parents); }
  std::int64_t committed_length() const { return length - tree_size(); }
  std::int64_t used_slots() const { return length + gap_len; }
  std::int64_t slot_of(std::int64_t token) const {
    return token < sink_len ? token : token + gap_len;
  }
  // Tokens a pop_n may remove: sinks cannot come back once tokens were evicted.
  std::int64_t poppable() const { return evicted > 0 ? length - sink_len : length; }
  // Prefix caching follows token ids only while page i holds tokens
  // [i * page_size, (i + 1) * page_size).
  bool prefix_trackable() const { return !windowed() && evicted == 0 && gap_len == 0; }
  // Forgets told tokens past `n` (and the links of pages no longer full).
  void truncate_tokens(std::int64_t n, std::int32_t page_size) {
    if (std::ssize(tokens) > n) tokens.resize(static_cast<std::size_t>(n));
    chain.resize(tokens.size() / static_cast<std::size_t>(page_size));
  }
};

// Number of pages needed to hold `slots` physical slots.
inline std::int64_t pages_for_slots(std::int64_t slots, std::int32_t page_size) {
  return (slots + page_size - 1) / page_size;
}

// What sliding a window drops: tokens to evict and the page-list range
// [first_page, first_page + num_pages) that then lies wholly in the gap.
struct WindowTrim {
  std::int64_t evict = 0;
  std::int64_t first_page = 0;
  std::int64_t num_pages = 0;
};

inline WindowTrim plan_window_trim(const Sequence& seq, std::int32_t page_size) {
  WindowTrim t;
  if (!seq.windowed() || seq.length <= seq.window_size) return t;
  t.evict = seq.length - seq.window_size;
  const std::int64_t gap_begin = seq.sink_len;
  const std::int64_t gap_end = seq.sink_len + seq.gap_len + t.evict;
  t.first_page = (gap_begin + page_size - 1) / page_size;
  t.num_pages = gap_end / page_size - t.first_page;
  if (t.num_pages < 0) t.num_pages = 0;
  return t;
}

}  // namespace pagedattn::cache
