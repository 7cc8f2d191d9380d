// One sequence's pages over MPI (distributed/kv_transfer.h) between caches whose
// page ids differ: rank 1 receives into pages it reserved, scattered among
// used ones, and after commit_incoming reads exactly the K/V rank 0 holds
// (debug_get_kv, bitwise), int8 scales included, whichever runs go through
// the staging buffer (none, the short ones, all). A raw byte stream cut into
// thousands of short runs, differently on each side and staged differently,
// arrives equal to its contiguous reference. A cancelled
// receive frees the reservation.
#include <gtest/gtest.h>

#include <array>
#include <tuple>
#include <vector>

#include "distributed/kv_transfer.h"
#include "support/kv_values.h"

namespace pagedattn::dist {
namespace {
namespace kv_transfer_test {  // this file's own names in a unity batch

constexpr int kTagKV = 21, kTagReference = 22, kTagRaw = 24;

KVCacheConfig config(DType dtype) {
  KVCacheConfig c;
  c.num_layers = 3;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.page_size = 4;
  c.num_pages = 64;
  c.kv_dtype = dtype;
  return c;
}

void add_filled(PagedKVCache& kv, SeqId id, std::int64_t tokens, std::uint64_t first_uid) {
  kv.add_sequence(id);
  const std::array<SeqId, 1> ids{id};
  const std::array<std::int64_t, 1> lens{tokens};
  kv.begin_forward(ids, lens);
  test::write_kv(kv, id, 0, test::uid_range(first_uid, tokens));
  kv.end_forward();
}

// (KV dtype, stage_below): 0 stages nothing (a pure datatype message); 160
// bytes stages the lone int8 V pages of scattered pages (128 bytes here) but
// no int8 K page (192 bytes: its K block, then the page's K and V token
// scales) and no float page (256 bytes and more); 2^30 stages every run (one
// block).
constexpr std::int64_t kStageSome = 160;
constexpr std::int64_t kStageAll = std::int64_t{1} << 30;

// The int8 V blocks of `in`'s pages, every layer.
std::int64_t v_page_bytes(const PagedKVCache& kv, const KVPageRuns& in) {
  const KVCacheConfig& c = kv.config();
  return std::int64_t{c.num_layers} * std::ssize(in.pages) * c.num_kv_heads * c.page_size *
         c.v_head_dim;
}

class MpiKVTransfer : public ::testing::TestWithParam<std::tuple<DType, std::int64_t>> {};

TEST_P(MpiKVTransfer, ReceivedPagesHoldTheSendersKVBitForBit) {
  const MpiComm world = MpiComm::world();
  const auto [dtype, stage_below] = GetParam();
  PagedKVCache kv(config(dtype));
  constexpr std::int64_t kTokens = 45;  // 12 pages, the last one partial
  if (world.rank() == 0) {
    add_filled(kv, 1, 9, 500);  // the sender's pages start elsewhere
    add_filled(kv, 2, kTokens, 7000);
    const test::KVBuffers ref = test::read_kv(kv, 2, 0, kTokens);
    const OutgoingKV out = kv.outgoing_pages(2);
    kv.remove_sequence(2);  // the pin alone keeps the pages
    KVTransfer sends = post_kv_sends(world, out.runs, 1, kTagKV, stage_below);
    wait_all(sends);
    kv.release_outgoing(out.id);
    world.send(std::as_bytes(std::span(ref.k)), 1, kTagReference);
    world.send(std::as_bytes(std::span(ref.v)), 1, kTagReference);
    kv.remove_sequence(1);
    EXPECT_TRUE(kv.empty());
  } else if (world.rank() == 1) {
    for (SeqId id = 10; id < 20; ++id) add_filled(kv, id, 4, 100 * id);
    for (SeqId id = 10; id < 20; id += 2) kv.remove_sequence(id);  // free pages scattered
    const KVPageRuns in = kv.reserve_incoming(5, kTokens);
    EXPECT_GT(in.layers[0].size(), 4u);  // more than one run per component
    KVTransfer receives = post_kv_receives(world, in, 0, kTagKV, stage_below);
    wait_all(receives);
    EXPECT_EQ(receives.num_messages(), 1);
    if (stage_below == 0) {
      EXPECT_EQ(receives.num_staged_bytes(), 0);
    } else if (stage_below == kStageAll) {
      EXPECT_EQ(receives.num_staged_bytes(), in.total_bytes());
      EXPECT_EQ(receives.num_blocks(), 1);
    }
    if (stage_below == kStageSome && dtype == DType::kINT8) {  // some V pages, no K page
      EXPECT_GT(receives.num_staged_bytes(), 0);
      EXPECT_LE(receives.num_staged_bytes(), v_page_bytes(kv, in));
    } else if (stage_below == kStageSome) {
      EXPECT_EQ(receives.num_staged_bytes(), 0);
    }
    kv.commit_incoming(5);
    const test::KVShape shape = test::KVShape::of(kv.config());
    test::KVBuffers ref{std::vector<float>(shape.k_floats(kTokens)),
                        std::vector<float>(shape.v_floats(kTokens))};
    const test::KVBuffers got = test::read_kv(kv, 5, 0, kTokens);
    world.recv(std::as_writable_bytes(std::span(ref.k)), 0, kTagReference);
    world.recv(std::as_writable_bytes(std::span(ref.v)), 0, kTagReference);
    EXPECT_EQ(got.k, ref.k);
    EXPECT_EQ(got.v, ref.v);
    kv.check_invariants();
  }
}

TEST_P(MpiKVTransfer, ACancelledReceiveFreesTheReservation) {
  const MpiComm world = MpiComm::world();
  if (world.rank() != 1) return;  // nobody sends
  const auto [dtype, stage_below] = GetParam();
  PagedKVCache kv(config(dtype));
  const KVPageRuns in = kv.reserve_incoming(5, 30);
  KVTransfer receives = post_kv_receives(world, in, 0, kTagKV + 1, stage_below);
  cancel_all(receives);
  kv.cancel_incoming(5);
  EXPECT_TRUE(kv.empty());
}

INSTANTIATE_TEST_SUITE_P(
    KVDTypes, MpiKVTransfer,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kINT8),
                       ::testing::Values(std::int64_t{0}, kStageSome, kStageAll)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_stage_below" +
             std::to_string(std::get<1>(info.param));
    });

// `bytes` cut into runs whose lengths cycle through `lengths`, as one layer.
KVPageRuns runs_over(std::vector<std::byte>& bytes, std::span<const std::int64_t> lengths) {
  KVPageRuns runs;
  runs.layers.emplace_back();
  std::int64_t at = 0;
  for (std::size_t i = 0; at < std::ssize(bytes); ++i) {
    const std::int64_t n = std::min(lengths[i % lengths.size()], std::ssize(bytes) - at);
    runs.layers[0].emplace_back(bytes.data() + at, static_cast<std::size_t>(n));
    at += n;
  }
  runs.layer_bytes = at;
  return runs;
}

// Thousands of runs of a few bytes to a few hundred, cut differently on the
// two sides; the sender stages its short runs (stretches between 256-byte
// blocks), the receiver stages all: the receiver's bytes equal the sender's
// stream, compared as one contiguous buffer.
TEST(MpiKVTransferRaw, ManySmallRunsCutDifferentlyArriveInOrder) {
  const MpiComm world = MpiComm::world();
  constexpr std::int64_t kBytes = 200'003;
  std::vector<std::byte> stream(kBytes);
  for (std::int64_t i = 0; i < kBytes; ++i)
    stream[static_cast<std::size_t>(i)] = static_cast<std::byte>((i * 131 + i / 256) & 0xff);
  if (world.rank() == 0) {
    const std::array<std::int64_t, 4> lengths{1, 37, 256, 5};
    const KVPageRuns runs = runs_over(stream, lengths);
    EXPECT_GT(runs.layers[0].size(), 2000u);
    KVTransfer sends = post_kv_sends(world, runs, 1, kTagRaw, 40);  // 1 and 37 staged
    // 668 whole cycles of 299 bytes stage 1 + 37 + 5 each; the last 271
    // bytes are 1, 37 and a cut 233-byte run.
    EXPECT_EQ(sends.num_staged_bytes(), 668 * 43 + 38);
    wait_all(sends);
  } else if (world.rank() == 1) {
    std::vector<std::byte> got(kBytes, std::byte{0});
    const std::array<std::int64_t, 3> lengths{300, 2, 4'099};
    const KVPageRuns runs = runs_over(got, lengths);
    KVTransfer receives = post_kv_receives(world, runs, 0, kTagRaw, kStageAll);
    wait_all(receives);
    EXPECT_EQ(receives.num_blocks(), 1);
    EXPECT_EQ(got, stream);
  }
}

TEST(MpiKVTransferRaw, RejectsABadThresholdOrPeer) {
  const MpiComm world = MpiComm::world();
  KVPageRuns runs;
  EXPECT_THROW(post_kv_sends(world, runs, 0, kTagRaw, -1), InvalidArgument);
  EXPECT_THROW(post_kv_receives(world, runs, world.size(), kTagRaw), InvalidArgument);
}

}  // namespace kv_transfer_test
}  // namespace
}  // namespace pagedattn::dist
