// KVCacheConfig validation (every field, each error naming the field and its
// value) and resolution (v_head_dim default, num_pages from a byte budget).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"

namespace pagedattn::test {
namespace {

constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();

// small_config(4, 8): 2 layers, 4 qo / 2 kv heads, head_dim 4, v_head_dim 3,
// f32 -> one page over all layers = 2 x 4 tokens x 2 heads x (4 + 3) x 4 B.
constexpr std::int64_t kSmallPageBytes = 2 * 4 * 2 * (4 + 3) * 4;

struct BadConfig {
  const char* name;
  std::function<void(KVCacheConfig&)> mutate;
  std::vector<std::string_view> substrings;
};

void PrintTo(const BadConfig& bad, std::ostream* os) {
  *os << bad.name;
}

class InvalidConfig : public ::testing::TestWithParam<BadConfig> {};

TEST_P(InvalidConfig, IsRejectedNamingTheField) {
  KVCacheConfig c = small_config(4, 8);
  GetParam().mutate(c);
  const std::string message = expect_throws<InvalidArgument>([&] { PagedKVCache kv(c); });
  for (std::string_view s : GetParam().substrings)
    EXPECT_THAT(message, ::testing::HasSubstr(std::string(s)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, InvalidConfig,
    ::testing::Values(BadConfig{"num_layers_zero",
                                [](KVCacheConfig& c) { c.num_layers = 0; },
                                {"KVCacheConfig.num_layers = 0", ">= 1"}},
                      BadConfig{"num_layers_negative",
                                [](KVCacheConfig& c) { c.num_layers = -3; },
                                {"num_layers = -3"}},
                      BadConfig{"num_qo_heads_zero",
                                [](KVCacheConfig& c) { c.num_qo_heads = 0; },
                                {"KVCacheConfig.num_qo_heads = 0"}},
                      BadConfig{"num_kv_heads_zero",
                                [](KVCacheConfig& c) { c.num_kv_heads = 0; },
                                {"KVCacheConfig.num_kv_heads = 0"}},
                      BadConfig{"kv_heads_not_dividing",
                                [](KVCacheConfig& c) { c.num_kv_heads = 3; },
                                {"num_kv_heads = 3", "must divide num_qo_heads = 4"}},
                      BadConfig{"kv_heads_above_qo_heads",
                                [](KVCacheConfig& c) { c.num_kv_heads = 8; },
                                {"num_kv_heads = 8", "num_qo_heads = 4"}},
                      BadConfig{"head_dim_zero",
                                [](KVCacheConfig& c) { c.head_dim = 0; },
                                {"KVCacheConfig.head_dim = 0"}},
                      BadConfig{"v_head_dim_negative",
                                [](KVCacheConfig& c) { c.v_head_dim = -1; },
                                {"KVCacheConfig.v_head_dim = -1"}},
                      BadConfig{"page_size_zero",
                                [](KVCacheConfig& c) { c.page_size = 0; },
                                {"KVCacheConfig.page_size = 0"}},
                      BadConfig{"page_size_negative",
                                [](KVCacheConfig& c) { c.page_size = -16; },
                                {"page_size = -16"}},
                      BadConfig{"kv_dtype_unknown",
                                [](KVCacheConfig& c) { c.kv_dtype = static_cast<DType>(200); },
                                {"KVCacheConfig.kv_dtype = 200"}},
                      BadConfig{"layout_unknown",
                                [](KVCacheConfig& c) { c.layout = static_cast<KVLayout>(7); },
                                {"KVCacheConfig.layout = 7"}},
                      BadConfig{"num_pages_negative",
                                [](KVCacheConfig& c) { c.num_pages = -1; },
                                {"KVCacheConfig.num_pages = -1"}},
                      BadConfig{"budget_negative",
                                [](KVCacheConfig& c) {
                                  c.num_pages = 0;
                                  c.memory_budget_bytes = -4096;
                                },
                                {"KVCacheConfig.memory_budget_bytes = -4096"}},
                      BadConfig{"pages_and_budget",
                                [](KVCacheConfig& c) { c.memory_budget_bytes = 4096; },
                                {"num_pages (8)", "memory_budget_bytes (4096)", "not both"}},
                      BadConfig{"neither_pages_nor_budget",
                                [](KVCacheConfig& c) { c.num_pages = 0; },
                                {"num_pages = 0 and memory_budget_bytes = 0"}},
                      BadConfig{"budget_below_one_page",
                                [](KVCacheConfig& c) {
                                  c.num_pages = 0;
                                  c.memory_budget_bytes = kSmallPageBytes - 1;
                                },
                                {"memory_budget_bytes = 447", "holds no page", "448 bytes"}},
                      BadConfig{"num_pages_above_int32",
                                [](KVCacheConfig& c) { c.num_pages = std::int64_t{1} << 31; },
                                {"num_pages = 2147483648", "exceeds 2147483647"}},
                      BadConfig{"page_bytes_overflow",
                                [](KVCacheConfig& c) {
                                  c.num_qo_heads = c.num_kv_heads = kInt32Max;
                                  c.head_dim = c.v_head_dim = kInt32Max;
                                  c.page_size = kInt32Max;
                                  c.num_layers = kInt32Max;
                                },
                                {"exceeds 2^63 bytes"}},
                      BadConfig{"page_bytes_overflow_one_layer",
                                [](KVCacheConfig& c) {
                                  c.num_layers = 1;
                                  c.num_qo_heads = c.num_kv_heads = kInt32Max;
                                  c.head_dim = c.v_head_dim = kInt32Max;
                                  c.page_size = 1;
                                },
                                {"exceeds 2^63 bytes"}},
                      BadConfig{"storage_bytes_overflow",
                                [](KVCacheConfig& c) {
                                  c.num_layers = 1;
                                  c.num_qo_heads = c.num_kv_heads = 1;
                                  c.head_dim = c.v_head_dim = 1 << 30;  // 2^33 bytes per page
                                  c.page_size = 1;
                                  c.num_pages = kInt32Max;
                                },
                                {"num_pages = 2147483647", "overflows 64 bits"}}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return std::string(info.param.name); });

TEST(ConfigResolution, BudgetDerivesNumPages) {
  KVCacheConfig c = small_config(4, 0);
  c.kv_dtype = DType::kF16;  // 224 bytes per page
  c.memory_budget_bytes = 224 * 10 + 223;
  PagedKVCache kv(c);
  EXPECT_EQ(kv.bytes_per_page(), 224);
  EXPECT_EQ(kv.config().num_pages, c.memory_budget_bytes / kv.bytes_per_page());
  EXPECT_EQ(kv.num_pages(), 10);
  EXPECT_EQ(kv.num_free_pages(), 10);
  EXPECT_EQ(kv.storage_bytes(), 2240);
  EXPECT_EQ(kv.config().memory_budget_bytes, c.memory_budget_bytes);
  EXPECT_TRUE(kv.empty());
}

TEST(ConfigResolution, BudgetOfExactlyOnePage) {
  KVCacheConfig c = small_config(4, 0);
  c.memory_budget_bytes = kSmallPageBytes;
  PagedKVCache kv(c);
  EXPECT_EQ(kv.num_pages(), 1);
  EXPECT_EQ(kv.bytes_per_page(), kSmallPageBytes);
}

TEST(ConfigResolution, BytesPerPageFollowsDtypeAndDims) {
  for (auto [dtype, elem] : {std::pair{DType::kF32, 4}, {DType::kF16, 2}, {DType::kBF16, 2}}) {
    KVCacheConfig c = small_config(16, 3);
    c.kv_dtype = dtype;
    c.num_layers = 3;
    c.head_dim = 8;
    c.v_head_dim = 0;  // means head_dim
    PagedKVCache kv(c);
    EXPECT_EQ(kv.config().v_head_dim, 8);
    EXPECT_EQ(kv.bytes_per_page(), 3 * 16 * 2 * (8 + 8) * elem);
    EXPECT_EQ(kv.storage_bytes(), 3 * kv.bytes_per_page());
  }
}

TEST(ConfigResolution, ConfigIsReturnedResolvedAndOtherwiseUnchanged) {
  KVCacheConfig c = small_config(8, 5, true);
  c.layout = KVLayout::kNHD;
  c.kv_dtype = DType::kBF16;
  PagedKVCache kv(c);
  const KVCacheConfig& r = kv.config();
  EXPECT_EQ(r.num_layers, 2);
  EXPECT_EQ(r.num_qo_heads, 4);
  EXPECT_EQ(r.num_kv_heads, 2);
  EXPECT_EQ(r.head_dim, 4);
  EXPECT_EQ(r.v_head_dim, 3);
  EXPECT_EQ(r.page_size, 8);
  EXPECT_EQ(r.num_pages, 5);
  EXPECT_EQ(r.kv_dtype, DType::kBF16);
  EXPECT_EQ(r.layout, KVLayout::kNHD);
  EXPECT_TRUE(r.support_sliding_window);
  const PagedKVStorage s = kv.layer_storage(1);
  EXPECT_EQ(s.dtype, DType::kBF16);
  EXPECT_EQ(s.layout, KVLayout::kNHD);
  EXPECT_EQ(s.num_pages, 5);
  EXPECT_EQ(s.page_size, 8);
  EXPECT_EQ(s.head_dim, 4);
  EXPECT_EQ(s.v_head_dim, 3);
}

TEST(ConfigResolution, MoveKeepsTheState) {
  PagedKVCache a(small_config(4, 8));
  a.add_sequence(3);
  const std::uint64_t digest = a.state_digest();
  PagedKVCache b(std::move(a));
  EXPECT_TRUE(b.has_sequence(3));
  EXPECT_EQ(b.state_digest(), digest);
  PagedKVCache c(small_config(2, 2));
  c = std::move(b);
  EXPECT_EQ(c.state_digest(), digest);
  EXPECT_EQ(c.config().page_size, 4);
}

}  // namespace
}  // namespace pagedattn::test
