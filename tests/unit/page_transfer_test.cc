// Page transfer between two caches (disaggregated prefill/decode) without
// MPI: the sender's pinned runs are copied run to run into the receiver's
// reserved pages, as MPI does with derived datatypes. The receiver must then
// hold bit-identical K/V under its own page ids; every refusal leaves the
// cache unchanged; cancels and releases free every page.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>
#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

// Streams one layer's runs into another's (their total lengths are equal;
// their run boundaries need not be).
void copy_layer(std::span<const std::span<std::byte>> from,
                std::span<const std::span<std::byte>> to) {
  std::size_t fi = 0, fo = 0, ti = 0, to_off = 0;
  while (fi < from.size() && ti < to.size()) {
    const std::size_t n = std::min(from[fi].size() - fo, to[ti].size() - to_off);
    std::memcpy(to[ti].data() + to_off, from[fi].data() + fo, n);
    fo += n;
    to_off += n;
    if (fo == from[fi].size()) ++fi, fo = 0;
    if (to_off == to[ti].size()) ++ti, to_off = 0;
  }
  ASSERT_EQ(fi, from.size());
  ASSERT_EQ(ti, to.size());
}

void copy_runs(const KVPageRuns& from, const KVPageRuns& to) {
  ASSERT_EQ(from.layer_bytes, to.layer_bytes);
  ASSERT_EQ(from.layers.size(), to.layers.size());
  for (std::size_t l = 0; l < from.layers.size(); ++l) copy_layer(from.layers[l], to.layers[l]);
}

std::vector<std::byte> stream_bytes(const KVPageRuns& r) {
  std::vector<std::byte> out;
  for (const auto& layer : r.layers)
    for (std::span<std::byte> run : layer) out.insert(out.end(), run.begin(), run.end());
  return out;
}

// A sequence of `tokens` tokens whose K/V hold distinct values.
void fill_sequence(PagedKVCache& kv, SeqId id, std::int64_t tokens, std::uint64_t first_uid) {
  kv.add_sequence(id);
  const std::array<SeqId, 1> ids{id};
  const std::array<std::int64_t, 1> lens{tokens};
  kv.begin_forward(ids, lens);
  write_kv(kv, id, 0, uid_range(first_uid, tokens));
  kv.end_forward();
}

KVCacheConfig transfer_config(DType dtype, KVLayout layout,
                              AttentionKind kind = AttentionKind::kMHA) {
  KVCacheConfig c = small_config(8, 32);
  c.kv_dtype = dtype;
  c.layout = layout;
  c.attention_kind = kind;
  if (kind == AttentionKind::kMLA) c.num_kv_heads = 1;  // one latent row per token
  return c;
}

class KVTransferRoundTrip
    : public ::testing::TestWithParam<std::tuple<DType, KVLayout, AttentionKind>> {};

TEST_P(KVTransferRoundTrip, ReceiverHoldsTheSendersKVUnderItsOwnPages) {
  const auto [dtype, layout, kind] = GetParam();
  PagedKVCache sender(transfer_config(dtype, layout, kind)),
      receiver(transfer_config(dtype, layout, kind));
  fill_sequence(sender, 1, 5, 100);  // occupies low pages: ids differ between sides
  fill_sequence(sender, 7, 37, 1000);
  fill_sequence(receiver, 3, 19, 5000);  // the receiver's pages are busy elsewhere too
  const OutgoingKV out = sender.outgoing_pages(7);
  const KVPageRuns in = receiver.reserve_incoming(42, 37);
  EXPECT_TRUE(receiver.is_receiving(42));
  EXPECT_NE(in.pages, out.runs.pages);
  EXPECT_EQ(in.pages.size(), 5u);
  copy_runs(out.runs, in);
  receiver.commit_incoming(42);
  sender.release_outgoing(out.id);
  const KVBuffers sent = read_kv(sender, 7, 0, 37), received = read_kv(receiver, 42, 0, 37);
  EXPECT_EQ(sent.k, received.k);  // bitwise: int8 values and their scales moved together
  EXPECT_EQ(sent.v, received.v);
  EXPECT_FALSE(receiver.is_receiving(42));
  EXPECT_EQ(receiver.sequence_length(42), 37);
  receiver.check_invariants();
  sender.check_invariants();
  // The received sequence continues like any other.
  const std::array<SeqId, 1> ids{42};
  const std::array<std::int64_t, 1> one{1};
  receiver.begin_forward(ids, one);
  write_kv(receiver, 42, 37, uid_range(9, 1));
  receiver.end_forward();
  const KVBuffers after = read_kv(receiver, 42, 0, 37);
  EXPECT_EQ(after.k, sent.k);
  EXPECT_EQ(after.v, sent.v);
  receiver.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(
    DTypesLayoutsKinds, KVTransferRoundTrip,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kINT8),
                       ::testing::Values(KVLayout::kHND, KVLayout::kNHD),
                       ::testing::Values(AttentionKind::kMHA, AttentionKind::kMLA)));

TEST(KVTransfer, NeighbouringPagesMergeIntoOneRunPerComponent) {
  PagedKVCache kv(transfer_config(DType::kINT8, KVLayout::kHND));
  const KVPageRuns in = kv.reserve_incoming(1, 40);  // pages 0..4 of a fresh pool
  ASSERT_EQ(in.layers.size(), 2u);
  EXPECT_EQ(in.layers[0].size(), 2u);  // K pages (with their K and V scales), V pages
  std::int64_t bytes = 0;
  for (std::span<std::byte> run : in.layers[1]) bytes += std::ssize(run);
  EXPECT_EQ(bytes, in.layer_bytes);
  EXPECT_EQ(in.total_bytes(), kv.bytes_per_page() * 5);
  kv.cancel_incoming(1);
}

TEST(KVTransfer, MlaPagesAreOneRunOfRowsWithTheirScales) {
  PagedKVCache kv(transfer_config(DType::kINT8, KVLayout::kHND, AttentionKind::kMLA));
  const KVPageRuns in = kv.reserve_incoming(1, 40);
  ASSERT_EQ(in.layers[0].size(), 1u);  // rows and scales side by side: no V anywhere
  EXPECT_EQ(in.total_bytes(), kv.bytes_per_page() * 5);
  kv.cancel_incoming(1);
}

// An int8 page keeps its token scales inside its K page: a fragmented
// sequence (no two pages neighbours) is two runs per page and layer, K and
// V, as with f16 (it was four: K, V, K scales, V scales), one under MLA;
// and it still arrives bit-identical in a receiver whose pages are in order.
TEST(KVTransfer, FragmentedInt8PagesAreTwoRunsEachAsF16) {
  for (const auto kind : {AttentionKind::kMHA, AttentionKind::kMLA})
    for (const DType dtype : {DType::kF16, DType::kINT8}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dtype) << (kind == AttentionKind::kMLA ? " MLA" : " MHA"));
      const KVCacheConfig c = transfer_config(dtype, KVLayout::kNHD, kind);
      PagedKVCache sender(c), receiver(c);
      for (SeqId id = 1; id <= 32; ++id) fill_sequence(sender, id, 8, 100 * id);  // a page each
      for (SeqId id = 2; id <= 32; id += 2) sender.remove_sequence(id);  // every other page free
      fill_sequence(sender, 99, 8 * 15 + 3, 7);  // 16 pages, none a neighbour of another
      const OutgoingKV out = sender.outgoing_pages(99);
      ASSERT_EQ(out.runs.pages.size(), 16u);
      const std::size_t per_page = kind == AttentionKind::kMLA ? 1 : 2;
      for (const auto& layer : out.runs.layers) EXPECT_EQ(layer.size(), per_page * 16);
      const KVPageRuns in = receiver.reserve_incoming(5, 8 * 15 + 3);  // pages 0..15: merged
      for (const auto& layer : in.layers) EXPECT_EQ(layer.size(), per_page);
      EXPECT_EQ(in.total_bytes(), receiver.bytes_per_page() * 16);
      copy_runs(out.runs, in);
      receiver.commit_incoming(5);
      sender.release_outgoing(out.id);
      const KVBuffers sent = read_kv(sender, 99, 0, 8 * 15 + 3);
      const KVBuffers received = read_kv(receiver, 5, 0, 8 * 15 + 3);
      EXPECT_EQ(sent.k, received.k);
      EXPECT_EQ(sent.v, received.v);
      receiver.check_invariants();
    }
}

// PagedKVCache's int8 storage: each page's K and V token scales lie in its
// K page, right after the K block, whatever v_head_dim.
TEST(KVTransfer, Int8TokenScalesLieInTheKPages) {
  for (const auto kind : {AttentionKind::kMHA, AttentionKind::kMLA}) {
    PagedKVCache kv(transfer_config(DType::kINT8, KVLayout::kHND, kind));
    const PagedKVStorage s = kv.layer_storage(1);
    EXPECT_TRUE(s.token_scales_in_k_pages());
    const std::int64_t scales = std::int64_t{s.num_kv_heads} * s.page_size;
    EXPECT_EQ(s.token_scale_page_stride * 4, s.k_page_stride);
    const auto* k = static_cast<const std::byte*>(s.k_data);
    const std::int64_t k_block = std::int64_t{s.num_kv_heads} * s.page_size * s.head_dim;
    EXPECT_EQ(reinterpret_cast<const std::byte*>(s.k_token_scales), k + k_block);
    EXPECT_EQ(s.v_token_scales,
              kind == AttentionKind::kMLA ? s.k_token_scales : s.k_token_scales + scales);
    EXPECT_EQ(s.k_page_stride % 64, 0);
    EXPECT_EQ(kv.bytes_per_page(),
              kv.config().num_layers * (s.k_page_stride + (s.v_in_k ? 0 : s.v_page_stride)));
  }
  PagedKVCache f16(transfer_config(DType::kF16, KVLayout::kHND));
  EXPECT_FALSE(f16.layer_storage(0).token_scales_in_k_pages());
  EXPECT_EQ(f16.layer_storage(0).token_scale_page_stride, 0);
}

TEST(KVTransfer, CancelFreesEveryPageAndRestoresTheDigest) {
  PagedKVCache kv(transfer_config(DType::kF16, KVLayout::kHND));
  fill_sequence(kv, 1, 11, 7);
  const std::uint64_t before = kv.state_digest();
  kv.reserve_incoming(2, 60);
  EXPECT_EQ(kv.num_free_pages(), 32 - 2 - 8);
  kv.cancel_incoming(2);
  EXPECT_EQ(kv.state_digest(), before);
  kv.remove_sequence(1);
  EXPECT_TRUE(kv.empty());
  kv.check_invariants();
}

TEST(KVTransfer, ReservationsThatDoNotFitOrAreMalformedChangeNothing) {
  PagedKVCache kv(transfer_config(DType::kF16, KVLayout::kHND));
  fill_sequence(kv, 1, 11, 7);
  expect_rejected<OutOfPages>(kv, [&] { kv.reserve_incoming(2, 8 * 31); },
                              {"reserve_incoming", "31"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.reserve_incoming(1, 4); },
                                   {"seq_id = 1", "exists"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.reserve_incoming(2, 0); }, {"num_tokens = 0"});
  expect_rejected<InvalidState>(kv, [&] { kv.commit_incoming(1); }, {"not receiving"});
  expect_rejected<InvalidState>(kv, [&] { kv.cancel_incoming(1); }, {"not receiving"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.commit_incoming(9); }, {"seq_id = 9"});
  const std::array<SeqId, 1> ids{1};
  const std::array<std::int64_t, 1> one{1};
  kv.begin_forward(ids, one);
  expect_rejected<InvalidState>(kv, [&] { kv.reserve_incoming(2, 4); }, {"forward"});
  expect_rejected<InvalidState>(kv, [&] { kv.outgoing_pages(1); }, {"forward"});
  kv.cancel_forward();
  kv.check_invariants();
}

TEST(KVTransfer, AReceivingSequenceIsRefusedByEveryOtherCall) {
  KVCacheConfig c = transfer_config(DType::kF16, KVLayout::kHND);
  c.support_sliding_window = true;
  PagedKVCache kv(c);
  kv.reserve_incoming(5, 20);
  const std::array<SeqId, 1> ids{5};
  const std::array<std::int64_t, 1> one{1};
  const std::array<std::int64_t, 1> root{-1};
  KVShape shape = KVShape::of(kv.config());
  std::vector<float> k(shape.k_floats(1)), v(shape.v_floats(1));
  const std::initializer_list<std::string_view> why = {"seq_id = 5", "still receiving"};
  expect_rejected<InvalidState>(
      kv, [&] { kv.begin_forward(ids, one); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.begin_forward(ids, one, root); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.pages_needed(ids, one); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.fork_sequence(5, 6); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.pop_n(5, 1); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.remove_sequence(5); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.enable_sliding_window(5, 8, 1); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.debug_get_kv(5, 0, 1, k, v); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.debug_set_kv(5, 0, 1, k, v); }, why);
  expect_rejected<InvalidState>(
      kv, [&] { kv.outgoing_pages(5); }, why);
  kv.check_invariants();
  kv.cancel_incoming(5);
  EXPECT_TRUE(kv.empty());
}

TEST(KVTransfer, PinnedPagesOutliveTheirSequenceAndAreNeverWritten) {
  PagedKVCache kv(transfer_config(DType::kF32, KVLayout::kHND));
  fill_sequence(kv, 1, 13, 300);  // a partial last page
  const OutgoingKV out = kv.outgoing_pages(1);
  const std::vector<std::byte> pinned = stream_bytes(out.runs);
  for (std::int32_t page : out.runs.pages) EXPECT_EQ(kv.page_refcount(page), 2);
  // Appending copies the shared partial page first; the pinned bytes stay.
  const std::array<SeqId, 1> ids{1};
  const std::array<std::int64_t, 1> two{2};
  kv.begin_forward(ids, two);
  write_kv(kv, 1, 13, uid_range(77, 2));
  kv.end_forward();
  EXPECT_EQ(stream_bytes(out.runs), pinned);
  EXPECT_NE(kv.sequence_pages(1).back(), out.runs.pages.back());
  kv.remove_sequence(1);
  EXPECT_FALSE(kv.empty());  // still pinned
  EXPECT_EQ(kv.num_outgoing(), 1);
  kv.check_invariants();
  kv.release_outgoing(out.id);
  EXPECT_TRUE(kv.empty());
  EXPECT_EQ(kv.num_outgoing(), 0);
  expect_rejected<InvalidArgument>(kv, [&] { kv.release_outgoing(out.id); }, {"not pinned"});
}

TEST(KVTransfer, OutgoingRefusesSequencesItCannotDescribe) {
  KVCacheConfig c = transfer_config(DType::kF16, KVLayout::kHND);
  c.support_sliding_window = true;
  PagedKVCache kv(c);
  kv.add_sequence(1);
  expect_rejected<InvalidArgument>(kv, [&] { kv.outgoing_pages(1); }, {"empty"});
  fill_sequence(kv, 2, 30, 1);
  kv.enable_sliding_window(2, 12, 2);  // drops tokens: a gap
  expect_rejected<InvalidArgument>(kv, [&] { kv.outgoing_pages(2); }, {"gap"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.outgoing_pages(3); }, {"seq_id = 3"});
}

}  // namespace
}  // namespace pagedattn::test
