// PagedKVCache is internally synchronized: threads calling anything in any
// order (steps, attention, removals, queries) get results or typed errors,
// never a crash or a corrupted cache. Run under ASan / TSan in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "support/cache_driver.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Ids = std::vector<SeqId>;
using Lens = std::vector<std::int64_t>;

constexpr std::int32_t kMaxStepTokens = 12;  // 3 sequences x at most 4 tokens

// One thread's q/k/v/out rows for up to kMaxStepTokens tokens.
// Rows for up to kMaxStepTokens tokens and their HeadTensor views.
struct Rows {
  explicit Rows(const KVCacheConfig& c)
      : q_rows(std::size_t(kMaxStepTokens) * c.num_qo_heads * c.head_dim, 0.25f),
        k_rows(std::size_t(kMaxStepTokens) * c.num_kv_heads * c.head_dim, 0.5f),
        v_rows(std::size_t(kMaxStepTokens) * c.num_kv_heads * c.v_head_dim, 1.0f),
        out_rows(std::size_t(kMaxStepTokens) * c.num_qo_heads * c.v_head_dim),
        q{q_rows.data(), DType::kF32, std::int64_t{c.num_qo_heads} * c.head_dim, c.head_dim},
        k{k_rows.data(), DType::kF32, std::int64_t{c.num_kv_heads} * c.head_dim, c.head_dim},
        v{v_rows.data(), DType::kF32, std::int64_t{c.num_kv_heads} * c.v_head_dim, c.v_head_dim},
        out{out_rows.data(), DType::kF32, std::int64_t{c.num_qo_heads} * c.v_head_dim,
            c.v_head_dim} {}
  std::vector<float> q_rows, k_rows, v_rows, out_rows;
  HeadTensor q, k, v, out;
};

// Random calls from one thread. Every pagedattn::Error is an expected
// refusal (another thread's step is open, a sequence is gone, ...). The step
// size comes from the caller's own arguments through `step_tokens`, never
// from plan(): its reference is only safe for the thread driving the step.
void hammer(PagedKVCache& kv, std::uint32_t seed, std::atomic<std::int64_t>& step_tokens,
            std::atomic<std::int64_t>& attention_calls) {
  const KVCacheConfig& c = kv.config();
  Rows rows(c);
  const HeadTensor &q = rows.q, &k = rows.k, &v = rows.v, &out = rows.out;
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint32_t>(n)); };
  std::vector<float> kbuf, vbuf;
  for (int i = 0; i < 400; ++i) {
    try {
      switch (pick(10)) {
        case 0:
          kv.add_sequence(pick(6));
          break;
        case 1:
          kv.remove_sequence(pick(6));
          break;
        case 2: {
          Ids ids;
          Lens lens;
          for (SeqId id = pick(3), n = 0; n < 3; ++n, id = (id + 1) % 6) {
            ids.push_back(id);
            lens.push_back(pick(5));
          }
          std::int64_t total = 0;
          for (std::int64_t len : lens) total += len;
          kv.begin_forward(ids, lens);
          step_tokens = total;
          break;
        }
        case 3:
        case 4:
          kv.attention(pick(c.num_layers), q, k, v, out, {}, nullptr, step_tokens.load());
          ++attention_calls;
          break;
        case 5:
          kv.end_forward();
          break;
        case 6:
          kv.cancel_forward();
          break;
        case 7:
          kv.pop_n(pick(6), 1);
          break;
        case 8: {
          const SeqId id = pick(6);
          const std::int64_t len = kv.sequence_length(id);
          const KVShape shape = KVShape::of(c);
          kbuf.resize(shape.k_floats(len));
          vbuf.resize(shape.v_floats(len));
          kv.debug_get_kv(id, 0, len, kbuf, vbuf);  // may fail if len changed meanwhile
          break;
        }
        default:
          (void)kv.state_digest();
          kv.check_invariants();
          (void)kv.num_free_pages();
          (void)kv.sequence_ids();
          break;
      }
    } catch (const InternalError&) {
      throw;  // a broken invariant is a real failure
    } catch (const Error&) {
    }
  }
}

TEST(Threads, ConcurrentCallsOnOneCacheNeverCorruptIt) {
  PagedKVCache kv(small_config(4, 24, false));
  std::atomic<std::int64_t> step_tokens{0}, attention_calls{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        hammer(kv, 1234 + t, step_tokens, attention_calls);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++failures;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(attention_calls, 0);
  kv.check_invariants();
  // Still fully usable: finish or drop whatever step is open, then a clean one.
  if (kv.in_forward()) kv.cancel_forward();
  for (SeqId id : kv.sequence_ids()) kv.remove_sequence(id);
  EXPECT_TRUE(kv.empty());
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{3});
  write_kv(kv, 1, 0, uid_range(1, 3));
  kv.end_forward();
  EXPECT_EQ(read_kv(kv, 1, 0, 3).k, make_kv(KVShape::of(kv.config()), uid_range(1, 3)).k);
}

// The crash: end_forward / remove_sequence / begin_forward from
// other threads while one thread runs attention. They now wait for the
// layer, then are refused or succeed as if called in some order.
TEST(Threads, StructuralCallsDuringAttentionWaitForIt) {
  PagedKVCache kv(small_config(4, 64, false));
  for (SeqId id = 0; id < 4; ++id) kv.add_sequence(id);
  const KVCacheConfig& c = kv.config();
  Rows rows(c);
  const HeadTensor &q = rows.q, &k = rows.k, &v = rows.v, &out = rows.out;
  std::atomic<bool> stop{false};
  std::thread meddler([&] {
    for (int i = 0; !stop; ++i) {
      try {
        switch (i % 3) {
          case 0:
            kv.end_forward();
            break;
          case 1:
            kv.remove_sequence(i % 4);
            break;
          default:
            kv.begin_forward(Ids{i % 4}, Lens{1});
            break;
        }
      } catch (const Error&) {
      }
    }
  });
  for (int step = 0; step < 200; ++step) {
    try {
      kv.begin_forward(Ids{0, 1, 2}, Lens{1, 1, 1});
    } catch (const Error&) {
      continue;
    }
    for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
      try {
        kv.attention(layer, q, k, v, out, {}, nullptr, 3);
      } catch (const Error&) {
      }
    }
    try {
      kv.end_forward();
    } catch (const Error&) {
    }
  }
  stop = true;
  meddler.join();
  kv.check_invariants();
}

}  // namespace
}  // namespace pagedattn::test
