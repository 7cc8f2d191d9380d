// A step must write every layer's K/V of its new tokens before it ends:
// pages are reused without clearing, so a skipped layer would otherwise
// expose the previous owner's K/V. And a step that cannot finish is
// cancelled back to exactly the state before it began.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Ids = std::vector<SeqId>;
using Lens = std::vector<std::int64_t>;

// Rows of `tokens` tokens for cache attention with small_config's shapes,
// every K element `key`.
struct StepTensors {
  StepTensors(const KVCacheConfig& c, std::int32_t tokens, float key)
      : q(std::size_t(tokens) * c.num_qo_heads * c.head_dim, 0.5f),
        k(std::size_t(tokens) * c.num_kv_heads * c.head_dim, key),
        v(std::size_t(tokens) * c.num_kv_heads * c.v_head_dim, key + 1.0f),
        out(std::size_t(tokens) * c.num_qo_heads * c.v_head_dim),
        tq{q.data(), DType::kF32, std::int64_t{c.num_qo_heads} * c.head_dim, c.head_dim},
        tk{k.data(), DType::kF32, std::int64_t{c.num_kv_heads} * c.head_dim, c.head_dim},
        tv{v.data(), DType::kF32, std::int64_t{c.num_kv_heads} * c.v_head_dim, c.v_head_dim},
        to{out.data(), DType::kF32, std::int64_t{c.num_qo_heads} * c.v_head_dim, c.v_head_dim} {}
  void attend(PagedKVCache& kv, std::int32_t layer) { kv.attention(layer, tq, tk, tv, to); }

  std::vector<float> q, k, v, out;
  HeadTensor tq, tk, tv, to;
};

// Two layers, page size 4, 8 pages.
KVCacheConfig two_layers() {
  return small_config(4, 8, false);
}

TEST(StepCompleteness, EndForwardRefusesAStepWithASkippedLayer) {
  PagedKVCache kv(two_layers());
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{3});
  StepTensors t(kv.config(), 3, 2.0f);
  t.attend(kv, 0);
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(); },
                                {"end_forward", "layer 1", "not appended", "cancel_forward"});
  EXPECT_TRUE(kv.in_forward());  // still open: the caller can finish it
  t.attend(kv, 1);
  kv.end_forward();
  EXPECT_EQ(kv.sequence_length(1), 3);
  kv.check_invariants();
}

TEST(StepCompleteness, MessageCountsEveryMissingLayer) {
  KVCacheConfig c = two_layers();
  c.num_layers = 4;
  PagedKVCache kv(c);
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{2});
  StepTensors t(kv.config(), 2, 2.0f);
  t.attend(kv, 1);
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(); }, {"layer 0 (and 2 more layers)"});
}

TEST(StepCompleteness, StepsWithoutNewTokensNeedNoAppend) {
  PagedKVCache kv(two_layers());
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{0});
  kv.end_forward();
  kv.begin_forward(Ids{}, Lens{});
  kv.end_forward();
}

// The scenario: a removed sequence's pages go to a new owner whose
// step appends layer 0 only. Its layer 1 must never show the old keys.
TEST(StepCompleteness, ANewOwnerNeverSeesTheRemovedSequencesKeys) {
  PagedKVCache kv(two_layers());
  const KVCacheConfig& c = kv.config();
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{4});
  StepTensors old_owner(c, 4, 7.0f);
  old_owner.attend(kv, 0);
  old_owner.attend(kv, 1);
  kv.end_forward();
  const std::vector<std::int32_t> old_pages = kv.sequence_pages(1);
  kv.remove_sequence(1);

  kv.add_sequence(2);
  kv.begin_forward(Ids{2}, Lens{4});
  ASSERT_EQ(kv.sequence_pages(2), old_pages);  // the same page, reused
  StepTensors new_owner(c, 4, 1.0f);
  new_owner.attend(kv, 0);
  const KVShape shape = KVShape::of(c);
  std::vector<float> k(shape.k_floats(4)), v(shape.v_floats(4));
  kv.debug_get_kv(2, 0, 4, k, v);
  const std::size_t layer_floats = k.size() / 2;
  for (std::size_t i = 0; i < layer_floats; ++i) ASSERT_EQ(k[i], 1.0f) << i;
  for (std::size_t i = layer_floats; i < k.size(); ++i)
    ASSERT_EQ(k[i], 0.0f) << "layer 1 element " << i - layer_floats << " shows stale K";
  for (std::size_t i = v.size() / 2; i < v.size(); ++i) ASSERT_EQ(v[i], 0.0f) << i;
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(); }, {"layer 1"});
  kv.cancel_forward();
  EXPECT_EQ(kv.sequence_length(2), 0);
  kv.check_invariants();
}

TEST(StepCompleteness, DebugSetOfEveryNewTokenCountsAsWritten) {
  PagedKVCache kv(two_layers());
  kv.add_sequence(1);
  kv.add_sequence(2);
  kv.begin_forward(Ids{1, 2}, Lens{2, 3});
  write_kv(kv, 1, 0, uid_range(10, 2));
  write_kv(kv, 2, 1, uid_range(20, 2));  // token 0 of sequence 2 is still unwritten
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(); }, {"layer 0 (and 1 more layers)"});
  const KVBuffers partial = read_kv(kv, 2, 0, 1);
  for (float x : partial.k) ASSERT_EQ(x, 0.0f);
  write_kv(kv, 2, 0, uid_range(30, 1));
  kv.end_forward();
  EXPECT_EQ(read_kv(kv, 2, 0, 3).k,
            make_kv(KVShape::of(kv.config()), std::vector<std::uint64_t>{30, 20, 21}).k);
}

TEST(StepCompleteness, MarkLayerAppendedValidates) {
  PagedKVCache kv(two_layers());
  kv.add_sequence(1);
  expect_rejected<InvalidState>(kv, [&] { kv.mark_layer_appended(0); },
                                {"mark_layer_appended", "no forward"});
  kv.begin_forward(Ids{1}, Lens{1});
  expect_rejected<InvalidArgument>(kv, [&] { kv.mark_layer_appended(2); },
                                   {"mark_layer_appended", "layer = 2", "[0, 2)"});
  kv.mark_layer_appended(0);
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(); }, {"layer 1"});
  kv.mark_layer_appended(1);
  kv.end_forward();
}

TEST(StepCompleteness, AttentionRefusesTensorsSizedForAnotherStep) {
  PagedKVCache kv(two_layers());
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{3});
  StepTensors t(kv.config(), 2, 1.0f);
  expect_rejected<InvalidState>(kv,
                                [&] { kv.attention(0, t.tq, t.tk, t.tv, t.to, {}, nullptr, 2); },
                                {"num_tokens = 2", "has 3 tokens"});
}

// The issue: one thread's step is ended and replaced by another thread's
// step of the same token count. The count cannot tell the two apart; the
// step id the first begin_forward returned does: every per-step call made
// with it is refused and the second step's K/V stay untouched.
TEST(StepCompleteness, CallsForAReplacedStepAreRefusedEvenWithTheSameTokenCount) {
  KVCacheConfig c = two_layers();
  c.v_head_dim = c.head_dim;  // attention_with_fused_qkv needs it
  PagedKVCache kv(c);
  kv.add_sequence(1);
  kv.add_sequence(2);
  const StepId first = kv.begin_forward(Ids{1}, Lens{2}).step_id;
  kv.cancel_forward();  // "another thread" drops the step...
  const StepId second = kv.begin_forward(Ids{2}, Lens{2}).step_id;  // ...and begins its own
  EXPECT_NE(first, kAnyStep);
  EXPECT_NE(second, first);
  EXPECT_EQ(kv.step_id(), second);
  EXPECT_EQ(kv.plan().step_id, second);

  StepTensors stale(kv.config(), 2, 7.0f);
  const std::string ids = "step = " + std::to_string(first);
  const std::string open = "step_id " + std::to_string(second);
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer)
    expect_rejected<InvalidState>(
        kv,
        [&] { kv.attention(layer, stale.tq, stale.tk, stale.tv, stale.to, {}, nullptr, 2, first); },
        {"PagedKVCache::attention", ids, open, "another thread"});
  const std::int32_t width = c.num_qo_heads + 2 * c.num_kv_heads;
  std::vector<float> qkv(std::size_t{2} * width * c.head_dim, 7.0f);
  const HeadTensor fused{qkv.data(), DType::kF32, std::int64_t{width} * c.head_dim, c.head_dim};
  expect_rejected<InvalidState>(
      kv, [&] { kv.attention_with_fused_qkv(0, fused, stale.to, {}, nullptr, 2, first); },
      {"attention", ids, open});
  expect_rejected<InvalidState>(kv, [&] { kv.mark_layer_appended(0, first); },
                                {"mark_layer_appended", ids, open});
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(first); }, {"end_forward", ids, open});
  expect_rejected<InvalidState>(kv, [&] { kv.cancel_forward(first); },
                                {"cancel_forward", ids, open});
  // Nothing of the stale calls landed: no layer counts as written (no row of
  // sequence 2 holds the 7s), and the step is still the second one.
  expect_rejected<InvalidState>(kv, [&] { kv.end_forward(second); }, {"layer 0", "2 new tokens"});
  EXPECT_EQ(kv.step_id(), second);
  for (float x : read_kv(kv, 2, 0, 2).k) ASSERT_EQ(x, 0.0f);

  // The owner of the open step goes on with its id (and kAnyStep still works).
  StepTensors mine(kv.config(), 2, 3.0f);
  kv.attention(0, mine.tq, mine.tk, mine.tv, mine.to, {}, nullptr, 2, second);
  kv.attention(1, mine.tq, mine.tk, mine.tv, mine.to);
  kv.end_forward(second);
  for (float x : read_kv(kv, 2, 0, 2).k) ASSERT_EQ(x, 3.0f);
  expect_rejected<InvalidState>(
      kv, [&] { kv.end_forward(second); },
      {"no forward is in progress", "step = " + std::to_string(second), "has ended"});
  // The copy begin_forward_copy returns names its own step.
  const BatchPlan copy = kv.begin_forward_copy(Ids{1}, Lens{2});
  EXPECT_EQ(copy.step_id, second + 1);
  EXPECT_EQ(kv.step_id(), copy.step_id);
  kv.cancel_forward(copy.step_id);
  kv.check_invariants();
}

// Copy-on-write of a shared partial page, fresh pages, a written layer:
// cancel_forward undoes all of it, and the free stack order too (the same
// begin_forward then hands out the same pages).
TEST(StepCompleteness, CancelForwardRestoresTheExactState) {
  CacheDriver d(two_layers());
  d.add(1);
  d.step({1}, {8});
  d.fork(1, 2);
  d.pop(2, 2);  // 2's last page is partial and shared with 1
  d.add(3);
  PagedKVCache& kv = d.kv();
  const std::uint64_t before = kv.state_digest();
  const std::int64_t free_before = kv.num_free_pages();
  const BatchPlan first = kv.begin_forward(Ids{2, 3}, Lens{3, 5});
  EXPECT_NE(kv.state_digest(), before);
  StepTensors t(kv.config(), 8, 3.0f);
  t.attend(kv, 0);
  kv.cancel_forward();
  EXPECT_FALSE(kv.in_forward());
  EXPECT_EQ(kv.state_digest(), before);
  EXPECT_EQ(kv.num_free_pages(), free_before);
  kv.check_invariants();
  d.expect_matches();
  const BatchPlan again = kv.begin_forward(Ids{2, 3}, Lens{3, 5});
  EXPECT_EQ(again.kv_indices, first.kv_indices);
  EXPECT_EQ(again.slot_mapping, first.slot_mapping);
  kv.cancel_forward();
  EXPECT_EQ(kv.state_digest(), before);
  expect_rejected<InvalidState>(kv, [&] { kv.cancel_forward(); },
                                {"cancel_forward", "no forward is in progress"});
}

TEST(StepCompleteness, CancelForwardOfATreeForwardClosesOnlyItsNodes) {
  KVCacheConfig c = two_layers();
  c.num_pages = 16;
  PagedKVCache kv(c);
  kv.add_sequence(1);
  kv.begin_forward(Ids{1}, Lens{5});
  end_metadata_step(kv);
  const std::uint64_t plain = kv.state_digest();
  kv.begin_forward(Ids{1}, Lens{3}, Lens{-1, 0, 0});
  kv.cancel_forward();
  EXPECT_EQ(kv.state_digest(), plain);
  EXPECT_FALSE(kv.has_open_token_tree(1));
  // A second forward of an open tree cancels back to the first one's nodes.
  kv.begin_forward(Ids{1}, Lens{2}, Lens{-1, 0});
  end_metadata_step(kv);
  const std::uint64_t open_tree = kv.state_digest();
  kv.begin_forward(Ids{1}, Lens{2}, Lens{1, 2});
  kv.cancel_forward();
  EXPECT_EQ(kv.state_digest(), open_tree);
  EXPECT_EQ(kv.token_tree_size(1), 2);
  kv.commit_accepted_token_tree_nodes(Ids{1}, Lens{1});
  EXPECT_EQ(kv.sequence_length(1), 7);
  kv.check_invariants();
}

}  // namespace
}  // namespace pagedattn::test
