// Automatic prefix caching: hits, misses, salts, partial pages, LRU eviction,
// referenced pages, collisions, and the transactional failures.
#include <gtest/gtest.h>

#include <vector>

#include "cache/prefix_index.h"
#include "prefix_support.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

TEST(PrefixCache, FinishedSequenceLeavesItsFullPagesCached) {
  PagedKVCache kv(prefix_config(4, 8));
  const std::vector<std::int32_t> prompt = token_run(100, 10);  // 2 full pages + 2 tokens
  EXPECT_EQ(prefill(kv, 1, prompt), 0);
  const std::vector<std::int32_t> pages = kv.sequence_pages(1);
  kv.remove_sequence(1);
  expect_ok(kv);
  EXPECT_EQ(kv.num_cached_pages(), 2);  // the partial third page is not cached
  EXPECT_EQ(kv.num_free_pages(), kv.num_pages());
  EXPECT_TRUE(kv.empty());

  std::vector<std::int32_t> longer = prompt;
  longer.push_back(7);
  const PrefixMatch m = kv.match_prefix(longer);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.device_pages, 2);
  EXPECT_EQ(m.host_pages, 0);
  EXPECT_EQ(m.pages_taken, 2);
  const std::int64_t free_before = kv.num_free_pages();
  EXPECT_EQ(prefill(kv, 2, longer), 8);
  const std::vector<std::int32_t> shared = kv.sequence_pages(2);
  EXPECT_EQ(shared[0], pages[0]);  // the same pages, no copy
  EXPECT_EQ(shared[1], pages[1]);
  EXPECT_EQ(kv.num_cached_pages(), 0);
  EXPECT_EQ(free_before - kv.num_free_pages(), 3);  // 2 hits + 1 new page
  EXPECT_EQ(check_prefix_kv(kv, 2, longer), "");
  const PrefixCacheStats s = kv.prefix_cache_stats();
  EXPECT_EQ(s.queries, 2);
  EXPECT_EQ(s.query_tokens, 21);
  EXPECT_EQ(s.hit_tokens, 8);
  EXPECT_EQ(s.device_hit_tokens, 8);
  expect_ok(kv);
}

TEST(PrefixCache, LiveSequencesShareAtOnceAndAtLeastOneTokenIsLeft) {
  PagedKVCache kv(prefix_config(4, 8));
  const std::vector<std::int32_t> prompt = token_run(5, 8);
  prefill(kv, 1, prompt);
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 4);  // never all of the prompt
  const PrefixMatch m = kv.match_prefix(token_run(5, 9));
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.pages_taken, 0);  // both pages are held by seq 1
  EXPECT_EQ(prefill(kv, 2, token_run(5, 9)), 8);
  EXPECT_EQ(kv.page_refcount(kv.sequence_pages(1)[0]), 2);
  EXPECT_EQ(check_prefix_kv(kv, 2, token_run(5, 9)), "");
  EXPECT_EQ(kv.match_prefix(token_run(5, 3)).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix({}).num_tokens, 0);
  expect_ok(kv);
}

TEST(PrefixCache, MissesOnDifferentTokensOrSalt) {
  PagedKVCache kv(prefix_config(4, 16));
  const std::vector<std::int32_t> prompt = token_run(1, 9);
  prefill(kv, 1, prompt, /*salt=*/11);
  EXPECT_EQ(kv.match_prefix(prompt, 11).num_tokens, 8);
  EXPECT_EQ(kv.match_prefix(prompt, 12).num_tokens, 0);  // another tenant
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 0);
  std::vector<std::int32_t> second_page_differs = prompt;
  second_page_differs[5] = 99;
  EXPECT_EQ(kv.match_prefix(second_page_differs, 11).num_tokens, 4);
  std::vector<std::int32_t> first_differs = prompt;
  first_differs[0] = 99;
  EXPECT_EQ(kv.match_prefix(first_differs, 11).num_tokens, 0);  // later pages need their parent
  EXPECT_EQ(prefill(kv, 2, prompt, 12), 0);
  EXPECT_EQ(check_prefix_kv(kv, 2, prompt, 12), "");
  EXPECT_EQ(prefill(kv, 3, second_page_differs, 11), 4);
  EXPECT_EQ(check_prefix_kv(kv, 3, second_page_differs, 11), "");
  expect_ok(kv);
}

TEST(PrefixCache, DecodedTokensArePublishedAsPagesFill) {
  PagedKVCache kv(prefix_config(4, 16));
  std::vector<std::int32_t> tokens = token_run(1, 3);
  prefill(kv, 1, tokens);
  EXPECT_EQ(kv.match_prefix(token_run(1, 9)).num_tokens, 0);
  for (std::int32_t t = 4; t <= 8; ++t) decode(kv, 1, tokens, std::vector<std::int32_t>{t});
  EXPECT_EQ(kv.match_prefix(token_run(1, 9)).num_tokens, 8);
  // Told tokens must not change.
  std::vector<std::int32_t> changed = tokens;
  changed[2] = -5;
  expect_rejected<InvalidArgument>(kv, [&] { kv.set_sequence_tokens(1, changed); },
                                   {"token_ids[2]", "differs"});
  std::vector<std::int32_t> too_long = token_run(1, 9);
  expect_rejected<InvalidArgument>(kv, [&] { kv.set_sequence_tokens(1, too_long); }, {"committed"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.set_sequence_tokens(77, tokens); }, {"77"});
  kv.set_sequence_tokens(1, token_run(1, 2));  // a shorter prefix is fine
  expect_ok(kv);
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedFirstAndLastPagesFirst) {
  PagedKVCache kv(prefix_config(2, 8));
  const std::vector<std::int32_t> a = token_run(100, 5), b = token_run(200, 5);
  prefill(kv, 1, a);  // 2 full pages + a partial one
  prefill(kv, 2, b);
  kv.remove_sequence(1);
  kv.remove_sequence(2);
  EXPECT_EQ(kv.num_cached_pages(), 4);
  // 5 pages: 4 unused + the oldest cached page, a's second (last) page.
  prefill(kv, 3, token_run(300, 10));
  EXPECT_EQ(kv.prefix_cache_stats().evictions, 1);
  EXPECT_EQ(kv.match_prefix(a).num_tokens, 2);
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 4);
  // LRU now: a1, b2, b1, then seq 3's pages last first; nothing unused.
  kv.remove_sequence(3);
  EXPECT_EQ(kv.num_cached_pages(), 8);
  prefill(kv, 4, token_run(400, 3));  // 2 pages: a1 and b2 go
  EXPECT_EQ(kv.match_prefix(a).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 2);
  EXPECT_EQ(kv.match_prefix(token_run(300, 10)).num_tokens, 8);
  EXPECT_EQ(kv.prefix_cache_stats().evictions, 3);
  expect_ok(kv);
}

TEST(PrefixCache, ReferencedPagesAreNeverEvicted) {
  PagedKVCache kv(prefix_config(4, 6));
  const std::vector<std::int32_t> a = token_run(1, 12);
  prefill(kv, 1, a);  // holds 3 published pages
  prefill(kv, 2, token_run(50, 9));
  kv.remove_sequence(2);  // 2 cached pages + 1 unused
  EXPECT_EQ(kv.num_free_pages(), 3);
  const std::vector<SeqId> ids = {3};
  kv.add_sequence(3);
  const std::vector<std::int64_t> too_many = {4 * 4};
  expect_rejected<OutOfPages>(kv, [&] { kv.begin_forward(ids, too_many); }, {"free pages"});
  const std::vector<std::int64_t> fits = {3 * 4};
  kv.begin_forward(ids, fits);
  end_metadata_step(kv);
  EXPECT_EQ(kv.num_free_pages(), 0);
  EXPECT_EQ(kv.num_cached_pages(), 0);
  EXPECT_EQ(check_prefix_kv(kv, 1, a), "");
  EXPECT_EQ(kv.match_prefix(token_run(1, 13)).num_tokens, 12);  // still shared by seq 1
  expect_ok(kv);
}

TEST(PrefixCache, AppendingIntoACachedPageCopiesItFirst) {
  PagedKVCache kv(prefix_config(4, 8));
  std::vector<std::int32_t> a = token_run(1, 8);
  prefill(kv, 1, a);
  const std::int32_t cached = kv.sequence_pages(1)[1];
  kv.pop_n(1, 2);  // page 1 is now partial for seq 1, but cached
  a.resize(6);
  const std::uint64_t before = kv.state_digest();
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> one = {1};
  EXPECT_EQ(kv.pages_needed(ids, one), 1);
  kv.begin_forward(ids, one);
  EXPECT_NE(kv.sequence_pages(1)[1], cached);
  kv.cancel_forward();
  EXPECT_EQ(kv.state_digest(), before);
  decode(kv, 1, a, std::vector<std::int32_t>{42, 43});
  EXPECT_NE(kv.sequence_pages(1)[1], cached);
  EXPECT_EQ(check_prefix_kv(kv, 1, a), "");
  // The old page still holds the original tokens 1..8 for later prompts.
  EXPECT_EQ(prefill(kv, 2, token_run(1, 9)), 8);
  EXPECT_EQ(kv.sequence_pages(2)[1], cached);
  EXPECT_EQ(check_prefix_kv(kv, 2, token_run(1, 9)), "");
  const std::vector<std::uint64_t> uid = {5};
  expect_rejected<InvalidArgument>(kv, [&] { write_kv(kv, 2, 5, uid); }, {"prefix cache"});
  expect_ok(kv);
}

TEST(PrefixCache, ForksInheritToldTokens) {
  PagedKVCache kv(prefix_config(4, 16));
  std::vector<std::int32_t> a = token_run(1, 6);
  prefill(kv, 1, a);
  kv.fork_sequence(1, 2, 5);
  std::vector<std::int32_t> b(a.begin(), a.begin() + 5);
  decode(kv, 2, b, token_run(70, 4));  // fills b's second page
  b.push_back(0);
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 8);
  b.pop_back();
  EXPECT_EQ(check_prefix_kv(kv, 2, b), "");
  expect_ok(kv);
}

TEST(PrefixCache, ResetDropsOnlyUnreferencedPages) {
  PagedKVCache kv(prefix_config(4, 8));
  prefill(kv, 1, token_run(1, 9));
  prefill(kv, 2, token_run(50, 9));
  kv.remove_sequence(2);
  kv.reset_prefix_cache();
  EXPECT_EQ(kv.num_cached_pages(), 0);
  EXPECT_EQ(kv.match_prefix(token_run(50, 9)).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(token_run(1, 9)).num_tokens, 8);
  expect_ok(kv);
}

TEST(PrefixCache, OffMeansPlainSequences) {
  KVCacheConfig c = prefix_config(4, 8);
  c.enable_prefix_caching = false;
  PagedKVCache kv(c);
  const std::vector<std::int32_t> prompt = token_run(1, 9);
  EXPECT_EQ(prefill(kv, 1, prompt), 0);
  EXPECT_EQ(prefill(kv, 2, prompt), 0);
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 0);
  kv.remove_sequence(1);
  EXPECT_EQ(kv.num_cached_pages(), 0);
  expect_ok(kv);
}

// A key function that makes every page collide: only the stored content
// (parent entry, salt, token ids) can tell pages apart.
cache::PageKey constant_key(const cache::PageKey&, std::uint64_t, std::span<const std::int32_t>) {
  return {42, 42};
}

TEST(PrefixCache, CollidingKeysNeverShareDifferentTokens) {
  cache::set_page_key_function_for_testing(&constant_key);
  PagedKVCache kv(prefix_config(2, 32));
  cache::set_page_key_function_for_testing(nullptr);
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5};
  const std::vector<std::int32_t> b = {1, 2, 9, 4, 5};  // second page differs
  const std::vector<std::int32_t> c = {7, 7, 3, 4, 5};  // same second page, other parent
  const std::vector<std::int32_t> d = {3, 4, 1, 2, 5};  // a's pages swapped
  prefill(kv, 1, a);
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 2);
  EXPECT_EQ(kv.match_prefix(c).num_tokens, 0);
  EXPECT_EQ(kv.match_prefix(d).num_tokens, 0);
  EXPECT_EQ(prefill(kv, 2, b), 2);
  EXPECT_EQ(prefill(kv, 3, c), 0);
  EXPECT_EQ(prefill(kv, 4, d), 0);
  EXPECT_EQ(prefill(kv, 5, a), 4);  // true hits still work
  for (const auto& [id, t] : {std::pair{1, a}, {2, b}, {3, c}, {4, d}, {5, a}})
    EXPECT_EQ(check_prefix_kv(kv, id, t), "") << "seq " << id;
  EXPECT_NE(kv.sequence_pages(3)[1], kv.sequence_pages(1)[1]);
  for (SeqId id = 1; id <= 5; ++id) kv.remove_sequence(id);
  EXPECT_EQ(kv.match_prefix(std::vector<std::int32_t>{3, 4, 1, 2, 6}).num_tokens,
            4);  // d's own pages
  expect_ok(kv);
}

TEST(PrefixCache, XxhKeysDependOnParentSaltAndTokens) {
  const std::vector<std::int32_t> t = {1, 2, 3};
  const cache::PageKey root = cache::xxh3_page_key({}, 0, t);
  EXPECT_NE(root, cache::xxh3_page_key({}, 1, t));
  EXPECT_NE(root, cache::xxh3_page_key({1, 0}, 0, t));
  EXPECT_NE(root, cache::xxh3_page_key({}, 0, std::vector<std::int32_t>{1, 2, 4}));
  EXPECT_EQ(root, cache::xxh3_page_key({}, 0, t));
}

TEST(PrefixCache, AddWithPrefixValidatesFirst) {
  PagedKVCache kv(prefix_config(4, 4));
  prefill(kv, 1, token_run(1, 9));
  expect_rejected<InvalidArgument>(kv, [&] { kv.add_sequence_with_prefix(1, token_run(1, 9)); },
                                   {"already exists"});
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {0};
  kv.begin_forward(ids, lens);
  expect_rejected<InvalidState>(kv, [&] { kv.add_sequence_with_prefix(2, token_run(1, 9)); },
                                {"forward"});
  expect_rejected<InvalidState>(kv, [&] { kv.set_sequence_tokens(1, token_run(1, 9)); },
                                {"forward"});
  expect_rejected<InvalidState>(kv, [&] { kv.reset_prefix_cache(); }, {"forward"});
  kv.end_forward();
}

}  // namespace
}  // namespace pagedattn::test
