#include "prefix_index.h"

#include <algorithm>
#include <atomic>

#define XXH_INLINE_ALL  // header-only use of Debian's libxxhash-dev: nothing to link
#include <xxhash.h>

#include "pagedattn/errors.h"

namespace pagedattn::cache {
namespace {

std::atomic<PageKeyFunction> g_key_function{nullptr};

bool same_tokens(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

}  // namespace

PageKey xxh3_page_key(const PageKey& parent, std::uint64_t salt,
                      std::span<const std::int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent, sizeof(parent));
  XXH3_128bits_update(&state, &salt, sizeof(salt));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

void set_page_key_function_for_testing(PageKeyFunction f) {
  g_key_function.store(f);
}

PrefixIndex::PrefixIndex(std::int64_t num_device_pages, std::int64_t num_host_pages)
    : key_function_(g_key_function.load() != nullptr ? g_key_function.load() : &xxh3_page_key),
      device_(static_cast<std::size_t>(num_device_pages), 0),
      host_(static_cast<std::size_t>(num_host_pages), 0) {}

std::uint64_t PrefixIndex::find(const PageKey& key, std::uint64_t parent, std::uint64_t salt,
                                std::span<const std::int32_t> tokens) const {
  const auto [first, last] = by_key_.equal_range(key);
  for (auto it = first; it != last; ++it) {
    const PrefixEntry& e = entries_.at(it->second);
    if (e.parent == parent && e.salt == salt && same_tokens(e.tokens, tokens)) return it->second;
  }
  return 0;
}

std::vector<std::uint64_t> PrefixIndex::longest_match(std::span<const std::int32_t> tokens,
                                                      std::uint64_t salt, std::int32_t page_size,
                                                      std::int64_t max_pages) const {
  std::vector<std::uint64_t> hits;
  if (entries_.empty()) return hits;
  PageKey key;
  std::uint64_t parent = kRootSerial;
  for (std::int64_t i = 0; i < max_pages; ++i) {
    const auto page_tokens = tokens.subspan(static_cast<std::size_t>(i * page_size),
                                            static_cast<std::size_t>(page_size));
    key = key_of(key, salt, page_tokens);
    parent = find(key, parent, salt, page_tokens);
    if (parent == 0) break;
    hits.push_back(parent);
  }
  return hits;
}

std::uint64_t PrefixIndex::publish(PrefixEntry entry) {
  const std::uint64_t serial = next_serial_++;
  pages(entry.tier)[static_cast<std::size_t>(entry.page)] = serial;
  by_key_.emplace(entry.key, serial);
  entries_.emplace(serial, std::move(entry));
  return serial;
}

void PrefixIndex::move(std::uint64_t serial, Tier tier, std::int32_t page) {
  PrefixEntry& e = entries_.at(serial);
  pages(e.tier)[static_cast<std::size_t>(e.page)] = 0;
  e.tier = tier;
  e.page = page;
  pages(tier)[static_cast<std::size_t>(page)] = serial;
}

void PrefixIndex::erase(std::uint64_t serial) {
  const PrefixEntry& e = entries_.at(serial);
  pages(e.tier)[static_cast<std::size_t>(e.page)] = 0;
  const auto [first, last] = by_key_.equal_range(e.key);
  for (auto it = first; it != last; ++it)
    if (it->second == serial) {
      by_key_.erase(it);
      break;
    }
  entries_.erase(serial);
}

std::string PrefixIndex::check() const {
  if (by_key_.size() != entries_.size())
    return detail::concat("the key table has ", by_key_.size(), " rows for ", entries_.size(),
                          " entries");
  for (const auto& [serial, e] : entries_) {
    const auto& map = pages(e.tier);
    if (e.page < 0 || e.page >= std::ssize(map) || map[static_cast<std::size_t>(e.page)] != serial)
      return detail::concat("entry ", serial, " claims page ", e.page, " of tier ", int(e.tier),
                            " but the page map disagrees");
    if (serial >= next_serial_ || e.parent >= next_serial_)
      return detail::concat("entry ", serial, " has parent ", e.parent, " from the future");
    if (key_of(e.parent_key, e.salt, e.tokens) != e.key)
      return detail::concat("entry ", serial, "'s key is not the key of its content");
    const std::uint64_t id = serial;  // (a lambda cannot capture a structured binding in C++20)
    const auto [first, last] = by_key_.equal_range(e.key);
    if (std::none_of(first, last, [id](const auto& row) { return row.second == id; }))
      return detail::concat("entry ", id, " is missing from the key table");
  }
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    const auto& map = pages(t);
    for (std::size_t p = 0; p < map.size(); ++p)
      if (map[p] != 0 && !entries_.contains(map[p]))
        return detail::concat("page ", p, " of tier ", int(t), " maps to a missing entry");
  }
  return {};
}

void PrefixIndex::hash_into(Hasher& h) const {
  std::vector<std::uint64_t> serials;
  serials.reserve(entries_.size());
  for (const auto& [serial, e] : entries_) serials.push_back(serial);
  std::sort(serials.begin(), serials.end());
  h.add(next_serial_);
  for (std::uint64_t serial : serials) {
    const PrefixEntry& e = entries_.at(serial);
    h.add(serial);
    h.add(e.key);
    h.add(e.parent_key);
    h.add(e.parent);
    h.add(e.salt);
    h.add_span(std::span<const std::int32_t>(e.tokens));
    h.add(e.tier);
    h.add(e.page);
  }
}

}  // namespace pagedattn::cache
