// Randomized test of prefix caching and the host tier against a shadow of
// every sequence's token ids. Each token's K/V is a hash of its whole prefix
// (prefix_support.h), so the content oracle is simple: after every operation
// every sequence must read back the K/V of its own tokens - a page shared
// with the wrong content, written while cached, or lost in a swap shows up
// at once. Besides: check_invariants after every operation, free-page
// accounting from the page lists alone (cached pages count as free, nothing
// leaks), dry runs that agree with the calls (a refused call leaves
// state_digest unchanged), and hits that are prefixes once published.
//
// Key functions: XXH3, one that ignores the parent and salt, and one that
// makes every page collide - sharing must stay exact under all three.
// PAGEDATTN_PREFIX_RANDOM_OPS=<n> overrides the operation count of the long
// leak run (1,000,000; a tenth under the sanitizers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "cache/prefix_index.h"
#include "core/sanitizers.h"
#include "prefix_support.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {
namespace prefix_random_test {  // this file's own names in a unity batch

cache::PageKey tokens_only_key(const cache::PageKey&, std::uint64_t,
                               std::span<const std::int32_t> tokens) {
  return cache::xxh3_page_key({}, 0, tokens);
}
cache::PageKey constant_key(const cache::PageKey&, std::uint64_t, std::span<const std::int32_t>) {
  return {7, 7};
}

struct RandomSetup {
  const char* name;
  std::int32_t page_size;
  std::int64_t pages;
  std::int64_t host_pages;
  DType dtype;
  cache::PageKeyFunction key_function;  // null: XXH3
  AttentionKind kind = AttentionKind::kMHA;
};

void PrintTo(const RandomSetup& s, std::ostream* os) {
  *os << s.name;
}

struct Coverage {
  std::int64_t hit_tokens = 0, host_hits = 0, evictions = 0, demotions = 0, swaps = 0;
  std::int64_t out_of_pages = 0, cancels = 0;
};

struct ShadowSeq {
  std::vector<std::int32_t> tokens;  // every token's id (K/V = prefix_uids)
  std::int64_t told = 0;
  std::uint64_t salt = 0;
  bool swapped = false;
};

class PrefixFuzzer {
 public:
  PrefixFuzzer(const RandomSetup& setup, std::uint64_t seed, bool thorough)
      : rng_(seed), kv_(make(setup)), ps_(setup.page_size), check_kv_(thorough) {
    for (auto& doc : documents_) doc = random_tokens(6 * ps_);
  }

  void run(std::int64_t ops) {
    try {
      for (std::int64_t i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
        random_op();
        if (!::testing::Test::HasFailure()) check();
      }
      if (!::testing::Test::HasFailure()) drain();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception: " << e.what();
    }
    if (::testing::Test::HasFailure()) ADD_FAILURE() << "operation log (last ops):\n" << log_.str();
  }

  Coverage coverage() const {
    Coverage c = coverage_;
    const PrefixCacheStats s = kv_.prefix_cache_stats();
    c.hit_tokens = s.hit_tokens;
    c.host_hits = s.host_hit_tokens;
    c.evictions = s.evictions;
    c.demotions = s.demotions;
    return c;
  }

 private:
  static PagedKVCache make(const RandomSetup& s) {
    cache::set_page_key_function_for_testing(s.key_function);
    PagedKVCache kv(prefix_config(s.page_size, s.pages, s.host_pages, s.dtype, s.kind));
    cache::set_page_key_function_for_testing(nullptr);
    return kv;
  }

  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::vector<std::int32_t> random_tokens(std::int64_t n) {
    std::vector<std::int32_t> t;
    for (std::int64_t i = 0; i < n; ++i) t.push_back(static_cast<std::int32_t>(uniform(0, 2)));
    return t;
  }
  std::vector<SeqId> ids(int swapped = -1) const {  // -1: all
    std::vector<SeqId> out;
    for (const auto& [id, s] : seqs_)
      if (swapped < 0 || s.swapped == (swapped == 1)) out.push_back(id);
    return out;
  }
  SeqId pick(const std::vector<SeqId>& from) {
    return from[static_cast<std::size_t>(uniform(0, std::ssize(from) - 1))];
  }
  SeqId unused_id() {
    for (;;)
      if (const SeqId id = uniform(0, 30); !seqs_.contains(id)) return id;
  }
  void note(const std::string& line) {
    if (++logged_ > 400) {  // keep the tail only
      log_.str("");
      logged_ = 0;
    }
    log_ << line << "\n";
  }

  // A refused call: the error type always; an unchanged state_digest when
  // checking thoroughly (hashing every page is most of a long run's time).
  template <typename E, typename Call>
  void rejected(Call&& call, std::initializer_list<std::string_view> substrings = {}) {
    if (check_kv_)
      expect_rejected<E>(kv_, std::forward<Call>(call), substrings);
    else
      expect_throws<E>(std::forward<Call>(call), substrings);
  }

  // --- operations -------------------------------------------------------------
  void random_op() {
    const std::int64_t r = uniform(0, 99);
    if (seqs_.empty() || r < 18) return op_add();
    if (r < 45) return op_decode();
    if (r < 53) return op_fork();
    if (r < 61) return op_pop();
    if (r < 72) return op_remove();
    if (r < 78) return op_swap_out();
    if (r < 85) return op_swap_in();
    if (r < 88) return op_cancelled_step();
    if (r < 90) return op_reset();
    return op_invalid();
  }

  // A prompt that often starts like an earlier document (shared prefixes).
  std::vector<std::int32_t> random_prompt() {
    const auto& doc = documents_[static_cast<std::size_t>(uniform(0, 2))];
    std::vector<std::int32_t> p(doc.begin(), doc.begin() + uniform(0, std::ssize(doc)));
    if (!p.empty() && chance(0.2)) p[static_cast<std::size_t>(uniform(0, std::ssize(p) - 1))] ^= 1;
    const std::vector<std::int32_t> tail = random_tokens(uniform(chance(0.5) ? 1 : 0, 2 * ps_));
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  }

  void op_add() {
    if (seqs_.size() >= 8) return op_remove();
    const SeqId id = unused_id();
    const std::vector<std::int32_t> prompt = random_prompt();
    const std::uint64_t salt = static_cast<std::uint64_t>(uniform(0, 1));
    const PrefixMatch m = kv_.match_prefix(prompt, salt);
    note("add " + std::to_string(id) + " prompt " + std::to_string(prompt.size()) + " salt " +
         std::to_string(salt) + " match " + std::to_string(m.num_tokens));
    EXPECT_EQ(m.num_tokens % ps_, 0);
    EXPECT_LE(m.num_tokens, prompt.empty() ? 0 : (std::ssize(prompt) - 1) / ps_ * ps_);
    EXPECT_EQ(m.device_pages + m.host_pages, m.num_tokens / ps_);
    if (m.num_tokens > 0) {  // a hit is a prefix some sequence published
      EXPECT_TRUE(published_.contains({salt, {prompt.begin(), prompt.begin() + m.num_tokens}}));
    }
    if (m.pages_taken > kv_.num_free_pages()) {
      rejected<OutOfPages>([&] { kv_.add_sequence_with_prefix(id, prompt, salt); });
      ++coverage_.out_of_pages;
      return;
    }
    const std::int64_t free_before = kv_.num_free_pages();
    EXPECT_EQ(kv_.add_sequence_with_prefix(id, prompt, salt), m.num_tokens);
    EXPECT_EQ(free_before - kv_.num_free_pages(), m.pages_taken);
    ShadowSeq& s = seqs_[id];
    s.salt = salt;
    s.tokens.assign(prompt.begin(), prompt.begin() + m.num_tokens);
    s.told = m.num_tokens;
    // The rest of the prompt in one step, if it fits.
    if (chance(0.8))
      step({id}, {std::vector<std::int32_t>(prompt.begin() + m.num_tokens, prompt.end())});
  }

  void op_decode() {
    std::vector<SeqId> batch = ids(0);
    if (batch.empty()) return op_swap_in();
    std::shuffle(batch.begin(), batch.end(), rng_);
    batch.resize(
        static_cast<std::size_t>(uniform(1, std::min<std::int64_t>(3, std::ssize(batch)))));
    std::vector<std::vector<std::int32_t>> news;
    for (std::size_t i = 0; i < batch.size(); ++i)
      news.push_back(random_tokens(uniform(0, ps_ + 1)));
    step(batch, news);
  }

  // One step appending `news[i]` to batch[i]; then tells token ids (all, or
  // all but a few).
  void step(const std::vector<SeqId>& batch, const std::vector<std::vector<std::int32_t>>& news) {
    std::vector<std::int64_t> lens;
    std::ostringstream line;
    line << "step";
    for (std::size_t i = 0; i < batch.size(); ++i) {
      lens.push_back(std::ssize(news[i]));
      line << " " << batch[i] << ":+" << news[i].size();
    }
    note(line.str());
    if (!kv_.can_append(batch, lens)) {
      EXPECT_GT(kv_.pages_needed(batch, lens), kv_.num_free_pages());
      rejected<OutOfPages>([&] { kv_.begin_forward(batch, lens); }, {"free pages"});
      ++coverage_.out_of_pages;
      return;
    }
    const std::int64_t needed = kv_.pages_needed(batch, lens), free_before = kv_.num_free_pages();
    kv_.begin_forward(batch, lens);
    EXPECT_LE(free_before - kv_.num_free_pages(), needed);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      ShadowSeq& s = seqs_.at(batch[i]);
      const std::int64_t from = std::ssize(s.tokens);
      s.tokens.insert(s.tokens.end(), news[i].begin(), news[i].end());
      if (!check_kv_) continue;
      const std::vector<std::uint64_t> uids = prefix_uids(s.tokens, s.salt);
      write_kv(kv_, batch[i], from,
               std::span<const std::uint64_t>(uids).subspan(std::size_t(from)));
    }
    end_metadata_step(kv_);  // marks the layers a light run did not write
    for (SeqId id : batch) tell(id, chance(0.8) ? 0 : uniform(0, ps_));
  }

  void tell(SeqId id, std::int64_t hold_back) {
    ShadowSeq& s = seqs_.at(id);
    const std::int64_t n = std::max(s.told, std::ssize(s.tokens) - hold_back);
    kv_.set_sequence_tokens(id, std::span<const std::int32_t>(s.tokens).first(std::size_t(n)));
    s.told = n;
    for (std::int64_t k = ps_; k <= n; k += ps_)
      published_.insert({s.salt, {s.tokens.begin(), s.tokens.begin() + k}});
  }

  void op_fork() {
    const std::vector<SeqId> live = ids(0);
    if (live.empty() || seqs_.size() >= 8) return op_remove();
    const SeqId parent = pick(live), child = unused_id();
    const ShadowSeq& p = seqs_.at(parent);
    const std::int64_t pos = uniform(0, std::ssize(p.tokens));
    note("fork " + std::to_string(parent) + " -> " + std::to_string(child) + " at " +
         std::to_string(pos));
    if (pos % ps_ != 0 && kv_.num_free_pages() == 0) {
      rejected<OutOfPages>([&] { kv_.fork_sequence(parent, child, pos); });
      return;
    }
    kv_.fork_sequence(parent, child, pos);
    ShadowSeq c;
    c.tokens.assign(p.tokens.begin(), p.tokens.begin() + pos);
    c.told = std::min(p.told, pos);
    c.salt = p.salt;
    seqs_[child] = c;
  }

  void op_pop() {
    const std::vector<SeqId> live = ids(0);
    if (live.empty()) return op_add();
    const SeqId id = pick(live);
    ShadowSeq& s = seqs_.at(id);
    const std::int64_t n = uniform(0, std::ssize(s.tokens));
    note("pop " + std::to_string(id) + " " + std::to_string(n));
    kv_.pop_n(id, n);
    s.tokens.resize(s.tokens.size() - std::size_t(n));
    s.told = std::min(s.told, std::ssize(s.tokens));
  }

  void op_remove() {
    const SeqId id = pick(ids());
    note("remove " + std::to_string(id));
    kv_.remove_sequence(id);
    seqs_.erase(id);
  }

  std::vector<SeqId> random_subset(std::vector<SeqId> from) {
    std::shuffle(from.begin(), from.end(), rng_);
    from.resize(static_cast<std::size_t>(uniform(1, std::ssize(from))));
    return from;
  }

  void op_swap_out() {
    const std::vector<SeqId> live = ids(0);
    if (live.empty() || kv_.num_host_pages() == 0) return op_decode();
    const std::vector<SeqId> out = random_subset(live);
    std::set<std::int32_t> distinct;
    for (SeqId id : out)
      for (std::int32_t p : kv_.sequence_pages(id)) distinct.insert(p);
    note("swap_out " + std::to_string(out.size()) + " seqs, " + std::to_string(distinct.size()) +
         " pages");
    if (std::ssize(distinct) > kv_.num_free_host_pages()) {
      rejected<OutOfPages>([&] { kv_.swap_out(out); }, {"host pages"});
      ++coverage_.out_of_pages;
      return;
    }
    kv_.swap_out(out);
    for (SeqId id : out) seqs_.at(id).swapped = true;
    ++coverage_.swaps;
  }

  void op_swap_in() {
    const std::vector<SeqId> swapped = ids(1);
    if (swapped.empty()) return op_add();
    const std::vector<SeqId> in = random_subset(swapped);
    const std::int64_t needed = kv_.swap_in_pages_needed(in);
    note("swap_in " + std::to_string(in.size()) + " seqs, " + std::to_string(needed) + " pages");
    if (needed > kv_.num_free_pages()) {
      rejected<OutOfPages>([&] { kv_.swap_in(in); }, {"free pages"});
      ++coverage_.out_of_pages;
      return;
    }
    kv_.swap_in(in);
    for (SeqId id : in) seqs_.at(id).swapped = false;
  }

  // begin_forward then cancel_forward: back to the state before (unless the
  // step evicted cached pages, which stay evicted).
  void op_cancelled_step() {
    const std::vector<SeqId> live = ids(0);
    if (live.empty()) return op_add();
    const std::vector<SeqId> batch = {pick(live)};
    const std::vector<std::int64_t> lens = {uniform(1, 2 * ps_)};
    if (!kv_.can_append(batch, lens)) return;
    note("cancelled step " + std::to_string(batch[0]) + ":+" + std::to_string(lens[0]));
    const std::uint64_t before = check_kv_ ? kv_.state_digest() : 0;
    const std::int64_t evictions = kv_.prefix_cache_stats().evictions;
    kv_.begin_forward(batch, lens);
    if (check_kv_)
      write_kv(kv_, batch[0], kv_.sequence_length(batch[0]) - lens[0],
               uid_range(0xdead0000, lens[0]));  // garbage that must not survive
    kv_.cancel_forward();
    if (check_kv_ && kv_.prefix_cache_stats().evictions == evictions) {
      EXPECT_EQ(kv_.state_digest(), before);
    }
    ++coverage_.cancels;
  }

  void op_reset() {
    note("reset_prefix_cache");
    kv_.reset_prefix_cache();
    EXPECT_EQ(kv_.num_cached_pages(), 0);
  }

  void op_invalid() {
    const SeqId id = pick(ids());
    ShadowSeq& s = seqs_.at(id);
    note("invalid op on " + std::to_string(id));
    if (s.swapped) {
      const std::vector<SeqId> one = {id};
      const std::vector<std::int64_t> len = {1};
      rejected<InvalidState>([&] { kv_.begin_forward(one, len); }, {"swapped"});
      rejected<InvalidState>([&] { kv_.set_sequence_tokens(id, s.tokens); }, {"swapped"});
      return;
    }
    if (s.told > 0) {
      std::vector<std::int32_t> changed(s.tokens.begin(), s.tokens.begin() + s.told);
      changed[static_cast<std::size_t>(uniform(0, s.told - 1))] += 5;
      rejected<InvalidArgument>([&] { kv_.set_sequence_tokens(id, changed); }, {"differs"});
    }
    std::vector<std::int32_t> longer = s.tokens;
    longer.push_back(0);
    rejected<InvalidArgument>([&] { kv_.set_sequence_tokens(id, longer); }, {"committed"});
    rejected<InvalidArgument>([&] { kv_.add_sequence_with_prefix(id, longer); }, {"exists"});
  }

  // --- checks -------------------------------------------------------------------
  void check() {
    try {
      kv_.check_invariants();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "check_invariants: " << e.what();
      return;
    }
    std::set<std::int32_t> device, host;
    for (const auto& [id, s] : seqs_) {
      ASSERT_EQ(kv_.sequence_length(id), std::ssize(s.tokens)) << "seq " << id;
      ASSERT_EQ(kv_.is_swapped(id), s.swapped) << "seq " << id;
      for (std::int32_t p : kv_.sequence_pages(id)) (s.swapped ? host : device).insert(p);
      if (check_kv_ && !s.swapped) {
        const std::string d = check_prefix_kv(kv_, id, s.tokens, s.salt);
        ASSERT_EQ(d, "") << "seq " << id;
      }
    }
    ASSERT_EQ(kv_.num_sequences(), std::ssize(seqs_));
    // Cached pages count as free; nothing else is missing.
    ASSERT_EQ(kv_.num_free_pages(), kv_.num_pages() - std::ssize(device));
    ASSERT_LE(kv_.num_cached_pages(), kv_.num_free_pages());
    ASSERT_EQ(kv_.num_free_host_pages(), kv_.num_host_pages() - std::ssize(host));
  }

  void drain() {
    for (SeqId id : ids()) {
      if (seqs_.at(id).swapped && check_kv_) {
        const std::vector<SeqId> one = {id};
        if (kv_.swap_in_pages_needed(one) <= kv_.num_free_pages()) {
          kv_.swap_in(one);
          EXPECT_EQ(check_prefix_kv(kv_, id, seqs_.at(id).tokens, seqs_.at(id).salt), "");
        }
      }
      kv_.remove_sequence(id);
    }
    seqs_.clear();
    check();
    kv_.reset_prefix_cache();
    EXPECT_TRUE(kv_.empty());
    EXPECT_EQ(kv_.num_free_pages(), kv_.num_pages());
    EXPECT_EQ(kv_.num_cached_pages(), 0);
    EXPECT_EQ(kv_.num_free_host_pages(), kv_.num_host_pages());
    EXPECT_NO_THROW(kv_.check_invariants());
  }

  std::mt19937_64 rng_;
  PagedKVCache kv_;
  std::int32_t ps_;
  bool check_kv_;
  std::map<SeqId, ShadowSeq> seqs_;
  std::vector<std::int32_t> documents_[3];
  std::set<std::pair<std::uint64_t, std::vector<std::int32_t>>> published_;
  Coverage coverage_;
  std::ostringstream log_;
  int logged_ = 0;
};

class PrefixRandomTest : public ::testing::TestWithParam<RandomSetup> {};

TEST_P(PrefixRandomTest, ContentAndAccountingHoldAfterEveryOperation) {
  const RandomSetup& setup = GetParam();
  Coverage total;
  for (std::uint64_t e = 0; e < 40 && !HasFailure(); ++e) {
    SCOPED_TRACE(::testing::Message() << setup.name << ", seed " << e);
    PrefixFuzzer f(setup, 0xcafe0000 + e, /*thorough=*/true);
    f.run(300);
    const Coverage c = f.coverage();
    total.hit_tokens += c.hit_tokens;
    total.host_hits += c.host_hits;
    total.evictions += c.evictions;
    total.demotions += c.demotions;
    total.swaps += c.swaps;
    total.out_of_pages += c.out_of_pages;
    total.cancels += c.cancels;
  }
  if (HasFailure()) return;
  std::cout << "[ coverage ] " << setup.name << ": " << total.hit_tokens << " hit tokens ("
            << total.host_hits << " from the host), " << total.evictions << " evictions, "
            << total.demotions << " demotions, " << total.swaps << " swap-outs, "
            << total.out_of_pages << " out-of-pages, " << total.cancels << " cancels\n";
  EXPECT_GT(total.hit_tokens, 0);
  EXPECT_GT(total.evictions, 0);
  EXPECT_GT(total.out_of_pages, 0);
  if (setup.host_pages > 0) {
    EXPECT_GT(total.host_hits, 0);
    EXPECT_GT(total.demotions, 0);
    EXPECT_GT(total.swaps, 0);
  }
}

std::int64_t leak_run_ops() {
  if (const char* env = std::getenv("PAGEDATTN_PREFIX_RANDOM_OPS")) return std::atoll(env);
  return core::kAddressSanitizer ? 100'000 : 1'000'000;
}

// A million operations in episodes of 2,000, each drained to an empty cache
// at the end; invariants and accounting after every operation (K/V contents
// and digests are left to the test above, to keep this one a few seconds).
TEST(PrefixRandomLeaks, MillionOperationsLeakNothing) {
  const RandomSetup setup{"ps2_host", 2, 12, 6, DType::kF32, nullptr};
  const std::int64_t ops = leak_run_ops(), per_episode = 2000;
  for (std::int64_t e = 0; e * per_episode < ops && !HasFailure(); ++e) {
    SCOPED_TRACE(::testing::Message() << "episode " << e);
    PrefixFuzzer(setup, 0x1eaf0000 + static_cast<std::uint64_t>(e), /*thorough=*/false)
        .run(std::min(per_episode, ops - e * per_episode));
  }
}

using enum DType;
INSTANTIATE_TEST_SUITE_P(
    Configs, PrefixRandomTest,
    ::testing::Values(RandomSetup{"ps1_xxh3", 1, 16, 0, kF32, nullptr},
                      RandomSetup{"ps2_xxh3_host", 2, 12, 6, kBF16, nullptr},
                      RandomSetup{"ps3_tokens_only_key_host", 3, 10, 4, kF32, &tokens_only_key},
                      RandomSetup{"ps4_colliding_key_host", 4, 10, 5, kF32, &constant_key},
                      RandomSetup{"ps2_colliding_key", 2, 14, 0, kF16, &constant_key},
                      RandomSetup{"ps3_xxh3_host_mla", 3, 10, 5, kBF16, nullptr,
                                  AttentionKind::kMLA}),
    [](const ::testing::TestParamInfo<RandomSetup>& info) { return std::string(info.param.name); });

}  // namespace prefix_random_test
}  // namespace
}  // namespace pagedattn::test
