// PrefixIndex: the content-addressed table of cached full pages (automatic
// prefix caching). An entry stands for one full page of K/V: its 128-bit key
// hashes (parent page's key, cache salt, the page's token ids) with XXH3-128;
// beside the key it keeps what the key summarises - the parent entry's
// serial number, the salt and the token ids - and a lookup compares those,
// so keys that collide can never make different content match. Serial
// numbers are never reused: a child entry whose parent was dropped cannot be
// reached again (it ages out of the LRU like any other page).
//
// An entry lives in one page of one tier (device or host). The index does
// not own pages or decide eviction (PagePool's LRU does); it maps both ways.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "hasher.h"

namespace pagedattn::cache {

struct PageKey {
  std::uint64_t lo = 0, hi = 0;
  friend bool operator==(const PageKey&, const PageKey&) = default;
};

// The key of a page given its parent's key (zero for a sequence's first page).
using PageKeyFunction = PageKey (*)(const PageKey& parent, std::uint64_t salt,
                                    std::span<const std::int32_t> tokens);
PageKey xxh3_page_key(const PageKey& parent, std::uint64_t salt,
                      std::span<const std::int32_t> tokens);
// Tests only: indexes constructed afterwards use `f` (nullptr: XXH3 again),
// e.g. a function that returns one key for everything.
void set_page_key_function_for_testing(PageKeyFunction f);

enum class Tier : std::uint8_t { kDevice = 0, kHost = 1 };

// Serial 0 is the parent of a sequence's first page; kUnlinked marks a
// position in a sequence's chain that has no entry (children cannot link).
inline constexpr std::uint64_t kRootSerial = 0;
inline constexpr std::uint64_t kUnlinked = ~std::uint64_t{0};

struct PrefixEntry {
  PageKey key;
  PageKey parent_key;
  std::uint64_t parent = kRootSerial;  // parent entry's serial
  std::uint64_t salt = 0;
  std::vector<std::int32_t> tokens;  // page_size token ids
  Tier tier = Tier::kDevice;
  std::int32_t page = -1;
};

class PrefixIndex {
 public:
  PrefixIndex(std::int64_t num_device_pages, std::int64_t num_host_pages);

  PageKey key_of(const PageKey& parent_key, std::uint64_t salt,
                 std::span<const std::int32_t> tokens) const {
    return key_function_(parent_key, salt, tokens);
  }
  // The entry with exactly this content, or 0.
  std::uint64_t find(const PageKey& key, std::uint64_t parent, std::uint64_t salt,
                     std::span<const std::int32_t> tokens) const;
  // Serials of the longest run of cached pages that `tokens` starts with,
  // at most `max_pages` pages of `page_size` tokens.
  std::vector<std::uint64_t> longest_match(std::span<const std::int32_t> tokens, std::uint64_t salt,
                                           std::int32_t page_size, std::int64_t max_pages) const;
  const PrefixEntry& entry(std::uint64_t serial) const { return entries_.at(serial); }
  // The entry held in `page` of `tier`, or 0.
  std::uint64_t entry_at(Tier tier, std::int32_t page) const {
    return pages(tier)[static_cast<std::size_t>(page)];
  }
  std::int64_t size() const { return static_cast<std::int64_t>(entries_.size()); }

  // A new entry for content not in the index; returns its serial.
  std::uint64_t publish(PrefixEntry entry);
  // The entry's K/V now lives in `page` of `tier` (demotion, promotion).
  void move(std::uint64_t serial, Tier tier, std::int32_t page);
  void erase(std::uint64_t serial);

  // Every entry sits where the page maps say, its key is the key of its
  // content, the key table lists exactly the entries. "" when consistent.
  std::string check() const;
  void hash_into(Hasher& h) const;

 private:
  struct KeyHash {
    std::size_t operator()(const PageKey& k) const { return static_cast<std::size_t>(k.lo); }
  };
  std::vector<std::uint64_t>& pages(Tier t) { return t == Tier::kDevice ? device_ : host_; }
  const std::vector<std::uint64_t>& pages(Tier t) const {
    return t == Tier::kDevice ? device_ : host_;
  }

  PageKeyFunction key_function_;
  std::unordered_map<std::uint64_t, PrefixEntry> entries_;  // by serial
  std::unordered_multimap<PageKey, std::uint64_t, KeyHash> by_key_;
  std::vector<std::uint64_t> device_, host_;  // [pages] entry serial or 0
  std::uint64_t next_serial_ = 1;
};

}  // namespace pagedattn::cache
