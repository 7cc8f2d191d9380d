// PagedKVStorage::dense strides and offsets (HND, NHD, 64-bit), int8
// token-scale indexing with a page stride, and the PagedKVTable key -> slot
// mapping with and without sink/gap arrays.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "pagedattn/paged_kv.h"

namespace pagedattn {
namespace {

TEST(PagedKVStorage, DenseHNDStrides) {
  const PagedKVStorage s =
      PagedKVStorage::dense(nullptr, nullptr, DType::kF16, KVLayout::kHND, 16, 8, 128, 64, 10);
  EXPECT_EQ(s.k_page_stride, 16 * 8 * 128);
  EXPECT_EQ(s.k_head_stride, 16 * 128);
  EXPECT_EQ(s.k_token_stride, 128);
  EXPECT_EQ(s.v_page_stride, 16 * 8 * 64);
  EXPECT_EQ(s.v_head_stride, 16 * 64);
  EXPECT_EQ(s.v_token_stride, 64);
  EXPECT_EQ(s.k_offset(3, 5, 7), 3 * 16384 + 5 * 2048 + 7 * 128);
  EXPECT_EQ(s.v_offset(3, 5, 7), 3 * 8192 + 5 * 1024 + 7 * 64);
  EXPECT_EQ(s.num_pages, 10);
  EXPECT_EQ(s.page_size, 16);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.v_head_dim, 64);
  EXPECT_EQ(s.dtype, DType::kF16);
  EXPECT_EQ(s.layout, KVLayout::kHND);
}

TEST(PagedKVStorage, DenseNHDStrides) {
  const PagedKVStorage s =
      PagedKVStorage::dense(nullptr, nullptr, DType::kBF16, KVLayout::kNHD, 16, 8, 128, 64, 10);
  EXPECT_EQ(s.k_page_stride, 16 * 8 * 128);
  EXPECT_EQ(s.k_head_stride, 128);
  EXPECT_EQ(s.k_token_stride, 8 * 128);
  EXPECT_EQ(s.v_page_stride, 16 * 8 * 64);
  EXPECT_EQ(s.v_head_stride, 64);
  EXPECT_EQ(s.v_token_stride, 8 * 64);
  EXPECT_EQ(s.k_offset(3, 5, 7), 3 * 16384 + 5 * 128 + 7 * 1024);
  EXPECT_EQ(s.v_offset(3, 5, 7), 3 * 8192 + 5 * 64 + 7 * 512);
  EXPECT_EQ(s.layout, KVLayout::kNHD);
}

// dense() is usable at compile time.
static_assert(PagedKVStorage::dense(nullptr, nullptr, DType::kF32, KVLayout::kHND, 4, 2, 8, 8, 1)
                  .k_offset(0, 1, 2) == 1 * 32 + 2 * 8);
static_assert(PagedKVStorage::dense(nullptr, nullptr, DType::kF32, KVLayout::kNHD, 4, 2, 8, 8, 1)
                  .k_offset(0, 1, 2) == 1 * 8 + 2 * 16);

// int8 token scales: page p's [num_kv_heads][page_size] block starts
// token_scale_page_stride floats after page p - 1's (0: dense arrays).
TEST(PagedKVStorage, TokenScaleIndexHonoursThePageStride) {
  PagedKVStorage s =
      PagedKVStorage::dense(nullptr, nullptr, DType::kINT8, KVLayout::kHND, 16, 4, 64, 64, 10);
  EXPECT_EQ(s.token_scale_page_stride, 0);
  EXPECT_EQ(s.token_scale_page_step(), 4 * 16);
  EXPECT_EQ(s.token_scale_index(3, 2, 5), 3 * 64 + 2 * 16 + 5);
  s.token_scale_page_stride = 1152;  // 4,096-byte K block + K and V scales, in floats
  EXPECT_EQ(s.token_scale_page_step(), 1152);
  EXPECT_EQ(s.token_scale_index(0, 2, 5), 2 * 16 + 5);
  EXPECT_EQ(s.token_scale_index(3, 2, 5), 3 * 1152 + 2 * 16 + 5);
  EXPECT_EQ(s.token_scale_index(std::int64_t{1} << 32, 0, 0), std::int64_t{1152} << 32);
  // k_dequant / v_dequant read through it.
  std::vector<float> k(2 * 1152, 0.0f), v(2 * 1152, 0.0f);
  k[1152 + 2 * 16 + 5] = 0.5f;
  v[1152 + 3 * 16 + 15] = 0.25f;
  s.k_token_scales = k.data();
  s.v_token_scales = v.data();
  EXPECT_EQ(s.k_dequant(1, 2, 5), 0.5f);
  EXPECT_EQ(s.v_dequant(1, 3, 15), 0.25f);
}

static_assert([] {
  PagedKVStorage s =
      PagedKVStorage::dense(nullptr, nullptr, DType::kINT8, KVLayout::kNHD, 4, 2, 8, 8, 3);
  s.token_scale_page_stride = 20;
  return s.token_scale_index(2, 1, 3) == 2 * 20 + 1 * 4 + 3;
}());

// token_scales_in_k_pages: both scale blocks of a page inside its K page.
TEST(PagedKVStorage, TokenScalesInKPagesNeedTheKPageStride) {
  constexpr std::int32_t kPs = 16, kHeads = 2, kDim = 8, kPages = 3;
  constexpr std::int64_t kBlock = kPs * kHeads * kDim, kScales = kPs * kHeads;  // bytes, floats
  constexpr std::int64_t kStride = kBlock + 2 * kScales * 4;                    // bytes
  std::vector<float> words(kPages * kStride / 4);
  auto* k = reinterpret_cast<std::int8_t*>(words.data());
  std::vector<std::int8_t> v(kPages * kBlock);
  PagedKVStorage s = PagedKVStorage::dense(k, v.data(), DType::kINT8, KVLayout::kHND, kPs, kHeads,
                                           kDim, kDim, kPages);
  s.k_page_stride = kStride;
  s.k_token_scales = words.data() + kBlock / 4;
  s.v_token_scales = s.k_token_scales + kScales;
  s.token_scale_page_stride = kStride / 4;
  EXPECT_TRUE(s.token_scales_in_k_pages());
  PagedKVStorage other = s;
  other.token_scale_page_stride = 0;  // dense arrays: pages kScales floats apart
  EXPECT_FALSE(other.token_scales_in_k_pages());
  other = s;
  other.v_token_scales = s.k_token_scales + 2 * kScales;  // past the K page
  EXPECT_FALSE(other.token_scales_in_k_pages());
  std::vector<float> separate(kPages * kScales);
  other = s;
  other.k_token_scales = separate.data();
  EXPECT_FALSE(other.token_scales_in_k_pages());
  other = s;
  other.dtype = DType::kFP8E4M3;
  EXPECT_FALSE(other.token_scales_in_k_pages());
}

// Every element (page, head, slot, dim) of a dense storage has a distinct
// offset, and together they cover [0, pages * page_stride) exactly.
void expect_dense_bijection(KVLayout layout) {
  constexpr std::int32_t kPages = 3, kPs = 5, kHeads = 3, kDim = 4, kVDim = 2;
  const PagedKVStorage s = PagedKVStorage::dense(nullptr, nullptr, DType::kF32, layout, kPs, kHeads,
                                                 kDim, kVDim, kPages);
  std::set<std::int64_t> k, v;
  for (std::int64_t p = 0; p < kPages; ++p)
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t t = 0; t < kPs; ++t) {
        for (std::int64_t d = 0; d < kDim; ++d) k.insert(s.k_offset(p, h, t) + d);
        for (std::int64_t d = 0; d < kVDim; ++d) v.insert(s.v_offset(p, h, t) + d);
      }
  EXPECT_EQ(std::ssize(k), kPages * s.k_page_stride);
  EXPECT_EQ(*k.begin(), 0);
  EXPECT_EQ(*k.rbegin(), kPages * s.k_page_stride - 1);
  EXPECT_EQ(std::ssize(v), kPages * s.v_page_stride);
  EXPECT_EQ(*v.rbegin(), kPages * s.v_page_stride - 1);
}

TEST(PagedKVStorage, DenseOffsetsAreABijectionHND) {
  expect_dense_bijection(KVLayout::kHND);
}
TEST(PagedKVStorage, DenseOffsetsAreABijectionNHD) {
  expect_dense_bijection(KVLayout::kNHD);
}

TEST(PagedKVStorage, OffsetsAre64Bit) {
  constexpr std::int64_t kPages = std::numeric_limits<std::int32_t>::max();
  const PagedKVStorage s =
      PagedKVStorage::dense(nullptr, nullptr, DType::kF32, KVLayout::kHND, 16, 8, 128, 128, kPages);
  const std::int64_t last = kPages - 1;
  EXPECT_EQ(s.k_offset(last, 7, 15), last * 16384 + 7 * 2048 + 15 * 128);
  EXPECT_GT(s.k_offset(last, 7, 15), std::int64_t{1} << 44);
  EXPECT_EQ(s.v_offset(last, 0, 0), last * 16384);
}

// Two sequences: b = 0 has 2 sinks and a gap of 5, b = 1 a gap of 3 and no
// sinks. Page size 4.
struct GapTable {
  std::vector<std::int32_t> qo = {0, 2, 3}, indptr = {0, 4, 6}, indices = {10, 11, 12, 13, 20, 21},
                            last = {3, 2}, lens = {10, 3}, sinks = {2, 0}, gaps = {5, 3};
  PagedKVTable table(bool with_gaps) const {
    PagedKVTable t;
    t.batch_size = 2;
    t.page_size = 4;
    t.qo_indptr = qo.data();
    t.kv_indptr = indptr.data();
    t.kv_indices = indices.data();
    t.kv_last_page_len = last.data();
    t.kv_lens = lens.data();
    if (with_gaps) {
      t.kv_sink_lens = sinks.data();
      t.kv_gap_lens = gaps.data();
    }
    return t;
  }
};

TEST(PagedKVTable, SlotOfKeyWithSinksAndGaps) {
  const GapTable g;
  const PagedKVTable t = g.table(true);
  EXPECT_EQ(t.slot_of_key(0, 0), 0);
  EXPECT_EQ(t.slot_of_key(0, 1), 1);   // last sink
  EXPECT_EQ(t.slot_of_key(0, 2), 7);   // first key after the gap
  EXPECT_EQ(t.slot_of_key(0, 9), 14);  // last key: page 3, offset 2 (last_page_len 3)
  EXPECT_EQ(t.page_of_key(0, 0), 10);
  EXPECT_EQ(t.page_of_key(0, 2), 11);
  EXPECT_EQ(t.offset_of_key(0, 2), 3);
  EXPECT_EQ(t.page_of_key(0, 9), 13);
  EXPECT_EQ(t.offset_of_key(0, 9), 2);
  EXPECT_EQ(t.slot_of_key(1, 0), 3);  // no sinks: every key shifts
  EXPECT_EQ(t.page_of_key(1, 0), 20);
  EXPECT_EQ(t.page_of_key(1, 1), 21);
  EXPECT_EQ(t.offset_of_key(1, 2), 1);
  EXPECT_EQ(t.num_pages_of(0), 4);
  EXPECT_EQ(t.num_pages_of(1), 2);
  EXPECT_EQ(t.q_len(0), 2);
  EXPECT_EQ(t.q_len(1), 1);
}

TEST(PagedKVTable, SlotOfKeyWithoutGapArraysIsTheKey) {
  const GapTable g;
  const PagedKVTable t = g.table(false);
  for (std::int64_t j = 0; j < 10; ++j) EXPECT_EQ(t.slot_of_key(0, j), j);
  EXPECT_EQ(t.page_of_key(0, 5), 11);
  EXPECT_EQ(t.offset_of_key(0, 5), 1);
  EXPECT_EQ(t.page_of_key(1, 4), 21);
}

TEST(PagedKVTable, SlotOfKeyIs64Bit) {
  const std::vector<std::int32_t> indptr = {0, 1}, indices = {0}, sinks = {1},
                                  gaps = {std::numeric_limits<std::int32_t>::max()};
  PagedKVTable t;
  t.batch_size = 1;
  t.page_size = 1;
  t.kv_indptr = indptr.data();
  t.kv_indices = indices.data();
  t.kv_sink_lens = sinks.data();
  t.kv_gap_lens = gaps.data();
  const std::int64_t j = std::numeric_limits<std::int32_t>::max();
  EXPECT_EQ(t.slot_of_key(0, j), 2 * j);
}

}  // namespace
}  // namespace pagedattn
