// 64-bit addressing: a cache whose storage is far beyond 4 GiB must address
// its highest pages correctly. The storage is an anonymous MAP_NORESERVE
// mapping, so the untouched pages cost nothing; this test touches about 1 MiB.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

constexpr std::int64_t k4GiB = std::int64_t{1} << 32;

// 2 layers x 8 KV heads x head_dim 128, f32, page size 16: each K page of a
// layer is 64 KiB, so one layer's K pages pass 4 GiB after 65536 pages.
KVCacheConfig huge_config() {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 8;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  c.num_pages = 65536 + 64;
  c.kv_dtype = DType::kF32;
  c.layout = KVLayout::kHND;
  return c;
}

const BatchPlan& append(PagedKVCache& kv, SeqId id, std::int64_t n) {
  const std::vector<SeqId> ids = {id};
  const std::vector<std::int64_t> lens = {n};
  return kv.begin_forward(ids, lens);
}

float raw_k(const PagedKVStorage& s, std::int64_t page, std::int32_t head, std::int64_t slot,
            std::int32_t dim) {
  float value;
  const auto* base = static_cast<const std::byte*>(s.k_data);
  std::memcpy(&value, base + (s.k_offset(page, head, slot) + dim) * std::int64_t{sizeof(float)},
              sizeof value);
  return value;
}

TEST(Addressing64Bit, HighestPagesOfAStorageBeyond4GiB) {
  std::unique_ptr<PagedKVCache> owned;
  try {
    owned = std::make_unique<PagedKVCache>(huge_config());
  } catch (const OutOfPages& e) {
    GTEST_SKIP() << "this machine cannot map the storage: " << e.what();
  }
  PagedKVCache& kv = *owned;
  const std::int64_t pages = kv.num_pages();
  ASSERT_GT(kv.storage_bytes(), 4 * k4GiB);
  ASSERT_EQ(kv.storage_bytes(), pages * 2 * 2 * 65536);

  // A filler takes every page but the last two (metadata only, no writes).
  kv.add_sequence(1);
  append(kv, 1, (pages - 2) * 16);
  end_metadata_step(kv);
  kv.add_sequence(2);
  const BatchPlan& plan = append(kv, 2, 32);
  EXPECT_EQ(plan.kv_indices, (std::vector<std::int32_t>{static_cast<std::int32_t>(pages - 2),
                                                        static_cast<std::int32_t>(pages - 1)}));
  EXPECT_EQ(plan.slot_mapping.back(), pages * 16 - 1);
  const std::vector<std::uint64_t> uids = uid_range(1000, 32);
  write_kv_through_slots(kv, plan, 0, uids);
  end_metadata_step(kv);
  EXPECT_EQ(kv.num_free_pages(), 0);
  EXPECT_TRUE(check_tokens(kv, 2, 0, uids).empty()) << check_tokens(kv, 2, 0, uids);

  // The last slot of the last page lies beyond 4 GiB within each layer's K
  // pages, and its bytes are where the 64-bit offset says.
  const std::int64_t last_page = pages - 1;
  for (std::int32_t layer = 0; layer < 2; ++layer) {
    const PagedKVStorage s = kv.layer_storage(layer);
    EXPECT_GT(s.k_offset(last_page, 7, 15) * std::int64_t{sizeof(float)}, k4GiB);
    for (std::int32_t d : {0, 1, 127})
      EXPECT_EQ(raw_k(s, last_page, 7, 15, d), token_value(uids.back(), layer, 7, d, false));
  }
  const auto* k0 = static_cast<const std::byte*>(kv.layer_storage(0).k_data);
  const auto* k1 = static_cast<const std::byte*>(kv.layer_storage(1).k_data);
  EXPECT_GT(k1 - k0, 2 * k4GiB);

  // The other direction: debug_set_kv writes, the raw bytes show it.
  const std::vector<std::uint64_t> again = uid_range(5000, 2);
  write_kv(kv, 2, 30, again);
  EXPECT_EQ(raw_k(kv.layer_storage(1), last_page, 3, 14, 5), token_value(again[0], 1, 3, 5, false));
  EXPECT_EQ(raw_k(kv.layer_storage(1), last_page, 3, 15, 5), token_value(again[1], 1, 3, 5, false));

  // Pop and re-append into the last page, then fork across the boundary.
  kv.pop_n(2, 1);
  const std::vector<std::uint64_t> last_uid = {7777};
  write_kv_through_slots(kv, append(kv, 2, 1), 0, last_uid);
  end_metadata_step(kv);
  EXPECT_TRUE(check_tokens(kv, 2, 31, last_uid).empty());
  kv.remove_sequence(1);
  kv.fork_sequence(2, 3, 20);  // shares page pages-2, copies 4 slots of the last page
  EXPECT_TRUE(
      check_tokens(kv, 3, 0, std::vector<std::uint64_t>(uids.begin(), uids.begin() + 20)).empty());
  EXPECT_NO_THROW(kv.check_invariants());
  kv.remove_sequence(2);
  kv.remove_sequence(3);
  EXPECT_TRUE(kv.empty());
}

// Each layer's K and V regions lie inside storage_bytes() and do not overlap.
TEST(Addressing64Bit, LayerRegionsAreDisjointAndInsideTheStorage) {
  KVCacheConfig c;
  c.num_layers = 3;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.v_head_dim = 4;
  c.page_size = 4;
  c.num_pages = 5;
  c.kv_dtype = DType::kBF16;
  PagedKVCache kv(c);
  struct Region {
    const std::byte* begin;
    const std::byte* end;
  };
  std::vector<Region> regions;
  for (std::int32_t l = 0; l < 3; ++l) {
    const PagedKVStorage s = kv.layer_storage(l);
    const auto* k = static_cast<const std::byte*>(s.k_data);
    const auto* v = static_cast<const std::byte*>(s.v_data);
    regions.push_back({k, k + s.num_pages * s.k_page_stride * 2});
    regions.push_back({v, v + s.num_pages * s.v_page_stride * 2});
  }
  const std::byte* lo = regions[0].begin;
  for (const Region& r : regions) lo = std::min(lo, r.begin);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    total += regions[i].end - regions[i].begin;
    EXPECT_LE(regions[i].end - lo, kv.storage_bytes());
    for (std::size_t j = 0; j < i; ++j)
      EXPECT_TRUE(regions[i].end <= regions[j].begin || regions[j].end <= regions[i].begin)
          << i << " overlaps " << j;
  }
  EXPECT_EQ(total, kv.storage_bytes());
}

}  // namespace
}  // namespace pagedattn::test
