// One sequence's pages over MPI (distributed/kv_transfer.h) between caches whose
// page ids differ: rank 1 receives into pages it reserved, scattered among
// used ones, and after commit_incoming reads exactly the K/V rank 0 holds
// (debug_get_kv, bitwise), int8 scales included. A cancelled receive frees
// the reservation.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "distributed/kv_transfer.h"
#include "support/kv_values.h"

namespace pagedattn::dist {
namespace {
namespace kv_transfer_test {  // this file's own names in a unity batch

constexpr int kTagKV = 21, kTagReference = 22;

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

class MpiKVTransfer : public ::testing::TestWithParam<DType> {};

TEST_P(MpiKVTransfer, ReceivedPagesHoldTheSendersKVBitForBit) {
  const MpiComm world = MpiComm::world();
  PagedKVCache kv(config(GetParam()));
  constexpr std::int64_t kTokens = 45;  // 12 pages, the last one partial
  if (world.rank() == 0) {
    add_filled(kv, 1, 9, 500);  // the sender's pages start elsewhere
    add_filled(kv, 2, kTokens, 7000);
    const test::KVBuffers ref = test::read_kv(kv, 2, 0, kTokens);
    const OutgoingKV out = kv.outgoing_pages(2);
    kv.remove_sequence(2);  // the pin alone keeps the pages
    std::vector<MpiRequest> sends = post_kv_sends(world, out.runs, 1, kTagKV);
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
    std::vector<MpiRequest> receives = post_kv_receives(world, in, 0, kTagKV);
    wait_all(receives);
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
  PagedKVCache kv(config(GetParam()));
  const KVPageRuns in = kv.reserve_incoming(5, 30);
  std::vector<MpiRequest> receives = post_kv_receives(world, in, 0, kTagKV + 1);
  cancel_all(receives);
  kv.cancel_incoming(5);
  EXPECT_TRUE(kv.empty());
}

INSTANTIATE_TEST_SUITE_P(KVDTypes, MpiKVTransfer,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kINT8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace kv_transfer_test
}  // namespace
}  // namespace pagedattn::dist
