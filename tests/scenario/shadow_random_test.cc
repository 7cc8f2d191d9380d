// Randomized differential test: thousands of random operation sequences run
// against PagedKVCache and the trivially correct ShadowModel, compared after
// every step (see support/model_checks.h for what is compared). Invalid
// operations are attempted at random and must throw the right error type
// without changing state_digest().
//
// Seeds are fixed; a failure prints the config, the seed and the episode's
// operation log. PAGEDATTN_SHADOW_EPISODES=<n> overrides the episode count per
// config (e.g. for a longer soak run); PAGEDATTN_SHADOW_SEED=<seed> replays
// the one episode of that seed (combine with --gtest_filter for its config).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <random>
#include <sstream>

#include "support/expect_error.h"
#include "support/kv_values.h"
#include "support/model_checks.h"
#include "support/shadow_model.h"

namespace pagedattn::test {
namespace {

struct FuzzSetup {
  const char* name;
  KVCacheConfig config;
  int episodes;
  int ops_per_episode;
  std::int64_t max_append;
};

KVCacheConfig make_config(std::int32_t layers, std::int32_t qo_heads, std::int32_t kv_heads,
                          std::int32_t head_dim, std::int32_t v_head_dim, std::int32_t page_size,
                          std::int64_t pages, DType dtype, KVLayout layout, bool window) {
  KVCacheConfig c;
  c.num_layers = layers;
  c.num_qo_heads = qo_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.v_head_dim = v_head_dim;
  c.page_size = page_size;
  c.num_pages = pages;
  c.kv_dtype = dtype;
  c.layout = layout;
  c.support_sliding_window = window;
  return c;
}

KVCacheConfig with_prefix_caching(KVCacheConfig c) {
  c.enable_prefix_caching = true;
  c.host_num_pages = 8;
  return c;
}

// Multi-head latent attention: one row per token, V = its head.
KVCacheConfig with_mla(KVCacheConfig c) {
  c.attention_kind = AttentionKind::kMLA;
  return c;
}

void PrintTo(const FuzzSetup& setup, std::ostream* os) {
  *os << setup.name;
}

constexpr SeqId kMinId = -2, kMaxId = 14;  // a small id space makes collisions likely
constexpr std::int64_t kMaxSequences = 8;

// What the episodes of one config exercised, summed.
struct Coverage {
  ShadowModel::Counters model;
  std::int64_t out_of_pages = 0;
  std::int64_t rejected_shared_writes = 0;
  std::int64_t steps = 0;

  void add(const ShadowModel::Counters& c) {
    model.fork_copies += c.fork_copies;
    model.copies_on_write += c.copies_on_write;
    model.evicted_tokens += c.evicted_tokens;
    model.pops_after_eviction += c.pops_after_eviction;
    model.gap_forks += c.gap_forks;
  }
};

class Fuzzer {
 public:
  Fuzzer(const FuzzSetup& setup, std::uint64_t seed, Coverage& coverage)
      : coverage_(coverage),
        rng_(seed),
        kv_(setup.config),
        model_(setup.config.page_size),
        ps_(setup.config.page_size),
        max_append_(setup.max_append) {}

  // Runs `ops` random operations then removes every sequence; stops at the
  // first failure and prints the operation log.
  void run(int ops) {
    try {
      for (int i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
        random_op();
        if (!::testing::Test::HasFailure()) expect_cache_matches(kv_, model_);
      }
      if (!::testing::Test::HasFailure()) remove_all();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception: " << e.what();
    }
    if (::testing::Test::HasFailure()) ADD_FAILURE() << "operation log:\n" << log_.str();
    coverage_.add(model_.counters());
  }

 private:
  // --- random choices ------------------------------------------------------------
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  std::vector<SeqId> existing() const {
    std::vector<SeqId> ids;
    for (const auto& [id, s] : model_.seqs()) ids.push_back(id);
    return ids;
  }
  SeqId pick_existing() {
    const std::vector<SeqId> ids = existing();
    return ids[static_cast<std::size_t>(uniform(0, std::ssize(ids) - 1))];
  }
  SeqId pick_unused() {
    for (;;) {
      const SeqId id = chance(0.05) ? uniform(1000, 1000000) : uniform(kMinId, kMaxId);
      if (!model_.has(id)) return id;
    }
  }
  // Token counts that land on page boundaries +-1 as well as random ones.
  std::int64_t pick_length_near_boundary(std::int64_t lo, std::int64_t hi) {
    std::vector<std::int64_t> c = {lo, hi};
    for (std::int64_t k = lo / ps_; k <= hi / ps_ + 1; ++k)
      for (std::int64_t d : {-1, 0, 1})
        if (k * ps_ + d >= lo && k * ps_ + d <= hi) c.push_back(k * ps_ + d);
    if (chance(0.3)) return uniform(lo, hi);
    return c[static_cast<std::size_t>(uniform(0, std::ssize(c) - 1))];
  }
  std::int64_t pick_append_len(std::int64_t current_len) {
    const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (r < 0.1) return 0;
    if (r < 0.45) return 1;
    if (r < 0.75) return uniform(2, max_append_);
    return pick_length_near_boundary(current_len, current_len + max_append_) - current_len;
  }
  std::vector<std::uint64_t> new_uids(std::int64_t n) {
    std::vector<std::uint64_t> u = uid_range(next_uid_, n);
    next_uid_ += static_cast<std::uint64_t>(n);
    return u;
  }

  // --- operations ---------------------------------------------------------------
  void random_op() {
    const std::int64_t r = uniform(0, 99);
    if (model_.seqs().empty() || r < 8) return op_add();
    if (r < 40) return op_step();
    if (r < 49) return op_fork();
    if (r < 52) return op_fork_and_roll_back();
    if (r < 62) return op_pop();
    if (r < 68) return op_remove();
    if (r < 74) return op_enable_window();
    if (r < 80) return op_overwrite();
    return op_invalid();
  }

  void op_add() {
    if (std::ssize(model_.seqs()) >= kMaxSequences) return op_remove();
    const SeqId id = pick_unused();
    log_ << "add " << id << "\n";
    kv_.add_sequence(id);
    model_.add(id);
  }

  void op_remove() {
    const SeqId id = pick_existing();
    log_ << "remove " << id << "\n";
    kv_.remove_sequence(id);
    model_.remove(id);
  }

  void op_fork() {
    std::vector<SeqId> parents;  // windowed ones too: the child has no window
    for (const auto& [id, s] : model_.seqs()) parents.push_back(id);
    if (parents.empty() || std::ssize(model_.seqs()) >= kMaxSequences) return op_remove();
    const SeqId parent = parents[static_cast<std::size_t>(uniform(0, std::ssize(parents) - 1))];
    const SeqId child = pick_unused();
    const std::int64_t len = model_.seq(parent).length();
    const std::int64_t pos = chance(0.2) ? -1 : pick_length_near_boundary(0, len);
    const std::int64_t resolved = pos == -1 ? len : pos;
    log_ << "fork " << parent << " -> " << child << " at " << pos << " (len " << len << ")\n";
    // The fork point's physical slot decides whether a partial page is copied
    // (a windowed parent's gap shifts it off the token index).
    const auto& tokens = model_.seq(parent).tokens;
    const std::int64_t end_slot =
        resolved == 0 ? 0 : tokens[static_cast<std::size_t>(resolved - 1)].abs_slot + 1;
    if (end_slot % ps_ != 0 && kv_.num_free_pages() == 0) {
      expect_rejected<OutOfPages>(kv_, [&] { kv_.fork_sequence(parent, child, pos); });
      return;
    }
    kv_.fork_sequence(parent, child, pos);
    model_.fork(parent, child, resolved);
  }

  // Beam-search / speculative pattern: fork at a page boundary, roll both
  // back into the shared pages, then append to both in one step (both may
  // copy the same shared page: only the first needs a copy).
  void op_fork_and_roll_back() {
    std::vector<SeqId> parents;
    for (const auto& [id, s] : model_.seqs())
      if (s.window == 0 && !s.evicted && s.length() >= ps_) parents.push_back(id);  // no gap
    if (parents.empty() || std::ssize(model_.seqs()) >= kMaxSequences) return op_step();
    const SeqId parent = parents[static_cast<std::size_t>(uniform(0, std::ssize(parents) - 1))];
    const SeqId child = pick_unused();
    const std::int64_t pos = model_.seq(parent).length() / ps_ * ps_;
    log_ << "fork " << parent << " -> " << child << " at " << pos << " then roll back both\n";
    kv_.fork_sequence(parent, child, pos);
    model_.fork(parent, child, pos);
    for (SeqId id : {parent, child}) {
      const std::int64_t n = uniform(0, std::min<std::int64_t>(ps_ - 1, model_.seq(id).poppable()));
      log_ << "pop_n " << id << " " << n << "\n";
      kv_.pop_n(id, n);
      model_.pop(id, n);
    }
    step({parent, child}, {uniform(0, 2), uniform(1, 2)});
  }

  void op_pop() {
    const SeqId id = pick_existing();
    const std::int64_t len = model_.seq(id).length(), poppable = model_.seq(id).poppable();
    const std::int64_t n = len - pick_length_near_boundary(len - poppable, len);
    log_ << "pop_n " << id << " " << n << " (len " << len << ")\n";
    kv_.pop_n(id, n);
    model_.pop(id, n);
  }

  void op_enable_window() {
    const SeqId id = pick_existing();
    if (!kv_.config().support_sliding_window) {
      log_ << "enable_sliding_window (unsupported) " << id << "\n";
      expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, 8, 2); },
                                       {"support_sliding_window"});
      return;
    }
    if (model_.seq(id).window != 0) return op_step();
    if (model_.seq(id).evicted) {  // a child that kept a windowed parent's gap
      log_ << "enable_sliding_window (gap child) " << id << "\n";
      expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, 8, 2); },
                                       {"forked from a windowed"});
      return;
    }
    const std::int64_t window = uniform(1, 4 * ps_ + 4);
    const std::int64_t sink =
        chance(0.3) ? 0 : uniform(0, std::min<std::int64_t>(window - 1, 2 * ps_ + 1));
    log_ << "enable_sliding_window " << id << " window " << window << " sink " << sink << " (len "
         << model_.seq(id).length() << ")\n";
    kv_.enable_sliding_window(id, window, sink);
    model_.enable_window(id, window, sink);
  }

  // debug_set_kv over a random range: refused when a token is in a shared page.
  void op_overwrite() {
    const SeqId id = pick_existing();
    const std::int64_t len = model_.seq(id).length();
    if (len == 0) return op_step();
    const std::int64_t start = uniform(0, len - 1), end = uniform(start, std::min(len, start + 8));
    bool shared = false;
    for (std::int64_t t = start; t < end; ++t) shared |= model_.token_in_shared_page(id, t);
    const std::vector<std::uint64_t> uids = new_uids(end - start);
    log_ << "debug_set_kv " << id << " [" << start << ", " << end << ")"
         << (shared ? " shared" : "") << "\n";
    if (shared) {
      expect_rejected<InvalidArgument>(kv_, [&] { write_kv(kv_, id, start, uids); }, {"shared"});
      ++coverage_.rejected_shared_writes;
      return;
    }
    write_kv(kv_, id, start, uids);
    model_.overwrite(id, start, uids);
  }

  // One begin_forward / end_forward step over a random batch.
  void op_step() {
    std::vector<SeqId> ids = existing();
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids.resize(static_cast<std::size_t>(uniform(1, std::min<std::int64_t>(4, std::ssize(ids)))));
    std::vector<std::int64_t> lens;
    for (SeqId id : ids) lens.push_back(pick_append_len(model_.seq(id).length()));
    step(ids, lens);
  }

  void step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens) {
    log_ << "step";
    for (std::size_t i = 0; i < ids.size(); ++i) log_ << " " << ids[i] << ":+" << lens[i];
    log_ << "\n";

    const std::int64_t cost = model_.append_cost(ids, lens);
    EXPECT_EQ(kv_.pages_needed(ids, lens), cost);
    EXPECT_EQ(kv_.can_append(ids, lens), cost <= kv_.num_free_pages());
    if (cost > kv_.num_free_pages()) {
      expect_rejected<OutOfPages>(kv_, [&] { kv_.begin_forward(ids, lens); }, {"free pages"});
      ++coverage_.out_of_pages;
      return;
    }
    ++coverage_.steps;
    const std::int64_t free_before = kv_.num_free_pages();
    const BatchPlan& plan = kv_.begin_forward(ids, lens);
    EXPECT_EQ(free_before - kv_.num_free_pages(), cost);
    EXPECT_TRUE(kv_.in_forward());
    EXPECT_EQ(&kv_.plan(), &plan);
    for (std::size_t i = 0; i < ids.size(); ++i) model_.append(ids[i], new_uids(lens[i]));
    expect_plan_matches(kv_, plan, model_, ids, lens);
    write_step_values(plan, ids, lens);
    if (chance(0.3)) try_structural_call_in_forward();
    end_metadata_step(kv_);
    EXPECT_FALSE(kv_.in_forward());
    for (SeqId id : ids) model_.slide(id);
  }

  // Writes the new tokens' values through the slot mapping, debug_set_kv, or
  // half of each, so both paths are checked against logical order.
  void write_step_values(const BatchPlan& plan, std::span<const SeqId> ids,
                         std::span<const std::int64_t> lens) {
    for (std::int32_t b = 0; b < std::ssize(ids); ++b) {
      const std::int64_t len = model_.seq(ids[b]).length(), n = lens[b];
      const std::vector<std::uint64_t> uids = model_.uids(ids[b], len - n, len);
      switch (uniform(0, 2)) {
        case 0:
          write_kv_through_slots(kv_, plan, b, uids);
          break;
        case 1:
          write_kv(kv_, ids[b], len - n, uids);
          break;
        default:  // garbage through the slots, then the true values via debug_set_kv
          write_kv_through_slots(kv_, plan, b, new_uids(n));
          write_kv(kv_, ids[b], len - n, uids);
          break;
      }
    }
  }

  void try_structural_call_in_forward() {
    const SeqId id = pick_existing();
    const std::vector<SeqId> one = {id};
    const std::vector<std::int64_t> len = {1};
    log_ << "  structural call during forward\n";
    switch (uniform(0, 5)) {
      case 0:
        expect_rejected<InvalidState>(kv_, [&] { kv_.add_sequence(pick_unused()); }, {"forward"});
        break;
      case 1:
        expect_rejected<InvalidState>(kv_, [&] { kv_.remove_sequence(id); }, {"forward"});
        break;
      case 2:
        expect_rejected<InvalidState>(kv_, [&] { kv_.fork_sequence(id, pick_unused()); },
                                      {"forward"});
        break;
      case 3:
        expect_rejected<InvalidState>(kv_, [&] { kv_.pop_n(id, 0); }, {"forward"});
        break;
      case 4:
        expect_rejected<InvalidState>(kv_, [&] { kv_.enable_sliding_window(id, 4, 1); },
                                      {"forward"});
        break;
      default:
        expect_rejected<InvalidState>(kv_, [&] { kv_.begin_forward(one, len); }, {"forward"});
        break;
    }
  }

  void op_invalid() {
    const SeqId id = pick_existing(), unused = pick_unused();
    const ShadowModel::Seq& s = model_.seq(id);
    log_ << "invalid op on " << id << "\n";
    switch (uniform(0, 13)) {
      case 0:
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.add_sequence(id); });
        break;
      case 1:
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.remove_sequence(unused); });
        break;
      case 2:
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.fork_sequence(unused, pick_unused()); });
        break;
      case 3:
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.fork_sequence(pick_existing(), id); });
        break;
      case 4: {
        const std::int64_t pos = chance(0.5) ? -2 - uniform(0, 5) : s.length() + 1 + uniform(0, 5);
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.fork_sequence(id, unused, pos); });
        break;
      }
      case 5: {
        const std::int64_t n = chance(0.5) ? -1 - uniform(0, 3) : s.poppable() + 1 + uniform(0, 3);
        expect_rejected<InvalidArgument>(kv_, [&] { kv_.pop_n(id, n); });
        break;
      }
      case 6:
        invalid_batch();
        break;
      case 7:
        out_of_pages_batch();
        break;
      case 8:
        expect_rejected<InvalidState>(kv_, [&] { kv_.end_forward(); });
        expect_rejected<InvalidState>(kv_, [&] { (void)kv_.plan(); });
        break;
      case 9:
        invalid_window(id);
        break;
      case 10:
        invalid_debug_access(id);
        break;
      case 11:
        write_into_shared_page();
        break;
      case 12:
        expect_rejected<InvalidArgument>(kv_, [&] { (void)kv_.sequence_length(unused); });
        expect_rejected<InvalidArgument>(kv_, [&] { (void)kv_.sequence_pages(unused); });
        break;
      default:
        expect_rejected<InvalidArgument>(kv_,
                                         [&] { (void)kv_.layer_storage(kv_.config().num_layers); });
        expect_rejected<InvalidArgument>(kv_, [&] { (void)kv_.page_refcount(-1); });
        break;
    }
  }

  void invalid_batch() {
    std::vector<SeqId> ids = existing();
    std::vector<std::int64_t> lens(ids.size(), 1);
    switch (uniform(0, 3)) {
      case 0:
        ids.push_back(pick_unused());
        lens.push_back(1);
        break;
      case 1:
        ids.push_back(ids[static_cast<std::size_t>(uniform(0, std::ssize(ids) - 1))]);
        lens.push_back(0);
        break;
      case 2:
        lens[static_cast<std::size_t>(uniform(0, std::ssize(lens) - 1))] = -uniform(1, 3);
        break;
      default:
        lens.push_back(1);
        break;
    }
    expect_rejected<InvalidArgument>(kv_, [&] { (void)kv_.pages_needed(ids, lens); });
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.begin_forward(ids, lens); });
  }

  // A batch whose first entries would fit but whose total does not.
  void out_of_pages_batch() {
    std::vector<SeqId> ids = existing();
    std::vector<std::int64_t> lens(ids.size(), 1);
    lens.back() = (kv_.num_free_pages() + 1) * ps_;
    EXPECT_FALSE(kv_.can_append(ids, lens));
    expect_rejected<OutOfPages>(kv_, [&] { kv_.begin_forward(ids, lens); }, {"free pages"});
  }

  void invalid_window(SeqId id) {
    if (!kv_.config().support_sliding_window) {
      expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, 4, 0); });
      return;
    }
    const ShadowModel::Seq& s = model_.seq(id);
    if (s.window != 0) {
      expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, 8, 1); },
                                       {"already"});
      return;
    }
    if (s.evicted) {
      expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, 8, 1); },
                                       {"forked from a windowed"});
      return;
    }
    const std::int64_t window = uniform(-2, 0), sink_window = uniform(1, 6);
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, window, 0); },
                                     {"window_size"});
    expect_rejected<InvalidArgument>(
        kv_, [&] { kv_.enable_sliding_window(id, sink_window, sink_window + uniform(0, 2)); },
        {"attn_sink_size"});
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.enable_sliding_window(id, sink_window, -1); },
                                     {"attn_sink_size"});
  }

  void invalid_debug_access(SeqId id) {
    const std::int64_t len = model_.seq(id).length();
    const KVShape shape = KVShape::of(kv_.config());
    std::vector<float> k(shape.k_floats(1)), v(shape.v_floats(1));
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.debug_get_kv(id, len, len + 1, k, v); },
                                     {"range"});
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.debug_set_kv(id, -1, 0, k, v); }, {"range"});
    if (len == 0) return;
    std::vector<float> short_k(shape.k_floats(1) - 1);
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.debug_get_kv(id, 0, 1, short_k, v); },
                                     {"k buffer"});
    std::vector<float> long_v(shape.v_floats(1) + 1);
    expect_rejected<InvalidArgument>(kv_, [&] { kv_.debug_set_kv(id, 0, 1, k, long_v); },
                                     {"v buffer"});
  }

  void write_into_shared_page() {
    for (const auto& [id, s] : model_.seqs())
      for (std::int64_t t = 0; t < s.length(); ++t)
        if (model_.token_in_shared_page(id, t)) {
          const std::vector<std::uint64_t> uid = {next_uid_++};
          const SeqId sid = id;
          expect_rejected<InvalidArgument>(kv_, [&] { write_kv(kv_, sid, t, uid); }, {"shared"});
          return;
        }
  }

  void remove_all() {
    std::vector<SeqId> ids = existing();
    std::shuffle(ids.begin(), ids.end(), rng_);
    for (SeqId id : ids) {
      kv_.remove_sequence(id);
      model_.remove(id);
    }
    expect_cache_matches(kv_, model_);
    EXPECT_TRUE(kv_.empty());
    EXPECT_EQ(kv_.num_free_pages(), kv_.num_pages());
  }

  Coverage& coverage_;
  std::mt19937_64 rng_;
  PagedKVCache kv_;
  ShadowModel model_;
  std::int64_t ps_;
  std::int64_t max_append_;
  std::uint64_t next_uid_ = 1;
  std::ostringstream log_;
};

int episodes_for(const FuzzSetup& setup) {
  if (const char* env = std::getenv("PAGEDATTN_SHADOW_EPISODES")) return std::atoi(env);
  return setup.episodes;
}

constexpr std::uint64_t kFirstSeed = 0x5eed0000;

class ShadowRandomTest : public ::testing::TestWithParam<FuzzSetup> {};

TEST_P(ShadowRandomTest, MatchesShadowModelAfterEveryStep) {
  const FuzzSetup& setup = GetParam();
  if (const char* env = std::getenv("PAGEDATTN_SHADOW_SEED")) {  // replay one episode
    const std::uint64_t seed = std::strtoull(env, nullptr, 0);
    SCOPED_TRACE(::testing::Message() << "config " << setup.name << ", seed " << seed);
    Coverage ignored;
    Fuzzer(setup, seed, ignored).run(setup.ops_per_episode);
    return;
  }
  const int episodes = episodes_for(setup);
  Coverage coverage;
  for (int e = 0; e < episodes && !HasFailure(); ++e) {
    const std::uint64_t seed = kFirstSeed + static_cast<std::uint64_t>(e);
    SCOPED_TRACE(::testing::Message() << "config " << setup.name << ", seed " << seed
                                      << " (replay: PAGEDATTN_SHADOW_SEED=" << seed << ")");
    Fuzzer(setup, seed, coverage).run(setup.ops_per_episode);
  }
  if (HasFailure()) return;
  // The random operations must actually reach the interesting paths.
  const ShadowModel::Counters& m = coverage.model;
  std::cout << "[ coverage ] " << setup.name << ": " << coverage.steps << " steps, "
            << coverage.out_of_pages << " out-of-pages, " << m.fork_copies << " fork copies, "
            << m.copies_on_write << " copies-on-write, " << coverage.rejected_shared_writes
            << " refused shared writes, " << m.evicted_tokens << " evicted tokens, "
            << m.pops_after_eviction << " pops after eviction, " << m.gap_forks << " gap forks\n";
  EXPECT_GT(coverage.steps, episodes);
  EXPECT_GT(coverage.out_of_pages, 0);
  EXPECT_GT(coverage.rejected_shared_writes, 0);
  if (setup.config.page_size > 1) {  // with one token per page nothing is ever partial
    EXPECT_GT(m.fork_copies, 0);
    EXPECT_GT(m.copies_on_write, 0);
  }
  if (setup.config.support_sliding_window) {
    EXPECT_GT(m.evicted_tokens, 0);
    EXPECT_GT(m.pops_after_eviction, 0);
    EXPECT_GT(m.gap_forks, 0);
  }
}

using enum DType;
using enum KVLayout;

INSTANTIATE_TEST_SUITE_P(
    Configs, ShadowRandomTest,
    ::testing::Values(
        //        name                  config: layers qo kv hd vhd ps pages dtype layout window ep
        //        ops max_append
        FuzzSetup{"ps1_f32_hnd", make_config(1, 1, 1, 4, 0, 1, 64, kF32, kHND, false), 300, 40, 6},
        FuzzSetup{"ps1_bf16_nhd_window", make_config(2, 2, 1, 2, 3, 1, 48, kBF16, kNHD, true), 300,
                  40, 6},
        FuzzSetup{"ps3_f16_nhd_gqa_window", make_config(2, 8, 2, 4, 6, 3, 40, kF16, kNHD, true),
                  300, 40, 10},
        FuzzSetup{"ps3_bf16_hnd", make_config(1, 4, 4, 8, 2, 3, 30, kBF16, kHND, false), 300, 40,
                  10},
        FuzzSetup{"ps4_f32_hnd_window", make_config(2, 2, 1, 4, 4, 4, 32, kF32, kHND, true), 300,
                  40, 12},
        FuzzSetup{"ps16_bf16_hnd_gqa_window", make_config(2, 4, 2, 8, 4, 16, 16, kBF16, kHND, true),
                  300, 40, 40},
        FuzzSetup{"ps16_f32_nhd_gqa", make_config(1, 6, 3, 4, 8, 16, 12, kF32, kNHD, false), 300,
                  40, 40},
        FuzzSetup{"ps16_f16_nhd_window", make_config(1, 2, 2, 4, 0, 16, 20, kF16, kNHD, true), 300,
                  40, 40},
        // Prefix caching on (no token ids told): everything behaves as without.
        FuzzSetup{"ps3_f32_hnd_window_prefix_caching",
                  with_prefix_caching(make_config(2, 4, 2, 4, 4, 3, 30, kF32, kHND, true)), 300, 40,
                  10},
        // MLA rows (V inside K) through every operation, windows and prefix caching included.
        FuzzSetup{"ps3_f16_nhd_mla_window",
                  with_mla(make_config(2, 8, 1, 6, 4, 3, 40, kF16, kNHD, true)), 300, 40, 10},
        FuzzSetup{"ps16_bf16_hnd_mla",
                  with_mla(make_config(1, 4, 1, 8, 6, 16, 16, kBF16, kHND, false)), 300, 40, 40},
        FuzzSetup{
            "ps3_f32_hnd_window_prefix_caching_mla",
            with_mla(with_prefix_caching(make_config(2, 4, 1, 6, 4, 3, 30, kF32, kHND, true))), 300,
            40, 10}),
    [](const ::testing::TestParamInfo<FuzzSetup>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pagedattn::test
