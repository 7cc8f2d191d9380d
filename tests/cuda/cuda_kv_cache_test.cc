// PagedKVCache with device storage on CUDA (KVCacheConfig.device = kCuda,
// cuda::kv_device_backend): the same steps on a CPU cache and on a CUDA
// cache give the same attention outputs within the kernels' rounding (decode
// rows multiply in f32: 1e-5 of the row's largest value; prefill rows on
// tensor cores round queries and weights to f16 or bf16), the same K/V and
// the same state digest. The construction checks at the end need no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_device.h"

namespace pagedattn::testing {
namespace {

struct CacheCase {
  const char* name = "";
  KVCacheConfig config;
  DType activations = DType::kF32;
  AttentionOptions options;
};

KVCacheConfig config_of(DType kv_dtype, KVLayout layout, std::int32_t page_size,
                        std::int32_t head_dim) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.num_pages = 64;
  c.kv_dtype = kv_dtype;
  c.layout = layout;
  c.enable_prefix_caching = true;
  c.host_num_pages = 32;
  return c;
}

CacheCase make_case(const char* name, const KVCacheConfig& config,
                    DType activations = DType::kF32) {
  CacheCase c;
  c.name = name;
  c.config = config;
  c.activations = activations;
  return c;
}

std::vector<CacheCase> cases() {
  std::vector<CacheCase> all;
  all.push_back(make_case("f16_hnd_128", config_of(DType::kF16, KVLayout::kHND, 16, 128)));
  {
    CacheCase c = make_case("bf16_nhd_rope_64", config_of(DType::kBF16, KVLayout::kNHD, 7, 64));
    c.config.rope_mode = RopeMode::kNormal;
    all.push_back(c);
  }
  {
    CacheCase c = make_case("e4m3_head_scales_80",
                            config_of(DType::kFP8E4M3, KVLayout::kHND, 16, 80), DType::kF16);
    c.config.k_head_scales = {0.05f, 0.1f};
    c.config.v_head_scales = {0.1f, 0.05f};
    c.options.window_left = 20;
    c.options.softcap = 30.0f;
    all.push_back(c);
  }
  all.push_back(
      make_case("int8_nhd_96", config_of(DType::kINT8, KVLayout::kNHD, 32, 96), DType::kBF16));
  {
    CacheCase c = make_case("mla_f16", config_of(DType::kF16, KVLayout::kHND, 16, 96));
    c.config.attention_kind = AttentionKind::kMLA;
    c.config.num_kv_heads = 1;
    c.config.v_head_dim = 64;
    all.push_back(c);
  }
  return all;
}

// Runs the same steps on a CPU cache and a CUDA cache and compares them.
class TwinCaches {
 public:
  explicit TwinCaches(const CacheCase& c)
      : case_(c), cpu_(c.config), gpu_(device_config(c.config), cuda::kv_device_backend()) {}

  // One step over `ids` with `lens` new tokens each: attention in every
  // layer on both, outputs compared; `prefill` picks the tensor-core tolerance.
  void step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens, bool prefill) {
    cpu_.begin_forward(ids, lens);
    gpu_.begin_forward(ids, lens);
    for (std::int32_t layer = 0; layer < case_.config.num_layers; ++layer) attend(layer, prefill);
    cpu_.end_forward();
    gpu_.end_forward();
    expect_same_state();
  }

  template <class Call>
  void both(Call&& call) {
    call(cpu_);
    call(gpu_);
    expect_same_state();
  }

  void expect_same_state() {
    // With RoPE the K copies are rotated by different code (the CUDA
    // kernel), so only the attention outputs are compared.
    if (case_.config.rope_mode == RopeMode::kNone) {
      EXPECT_EQ(cpu_.state_digest(), gpu_.state_digest()) << case_.name;
    }
  }

  // debug_get_kv of a whole sequence, equal bit for bit (no RoPE).
  void expect_same_kv(SeqId id) {
    const KVCacheConfig& c = cpu_.config();
    const std::int64_t len = cpu_.sequence_length(id);
    const auto rows = static_cast<std::size_t>(c.num_layers * len * c.num_kv_heads);
    std::vector<float> k[2], v[2];
    for (int side = 0; side < 2; ++side) {
      k[side].resize(rows * static_cast<std::size_t>(c.head_dim));
      v[side].resize(rows * static_cast<std::size_t>(c.v_head_dim));
      (side == 0 ? cpu_ : gpu_).debug_get_kv(id, 0, len, k[side], v[side]);
    }
    EXPECT_EQ(0, std::memcmp(k[0].data(), k[1].data(), k[0].size() * sizeof(float))) << case_.name;
    EXPECT_EQ(0, std::memcmp(v[0].data(), v[1].data(), v[0].size() * sizeof(float))) << case_.name;
  }

  PagedKVCache& cpu() { return cpu_; }
  PagedKVCache& gpu() { return gpu_; }

 private:
  static KVCacheConfig device_config(KVCacheConfig c) {
    c.device = KVDevice::kCuda;
    return c;
  }

  std::vector<std::byte> random_activations(std::size_t n) {
    std::normal_distribution<float> normal;
    std::vector<std::byte> bytes(n * dtype_size(case_.activations));
    for (std::size_t i = 0; i < n; ++i)
      store_from_float(bytes.data(), case_.activations, i, normal(rng_));
    return bytes;
  }

  void attend(std::int32_t layer, bool prefill) {
    const KVCacheConfig& c = cpu_.config();
    const bool mla = c.attention_kind == AttentionKind::kMLA;
    const auto tokens = static_cast<std::size_t>(cpu_.num_step_tokens());
    const auto hq = static_cast<std::size_t>(c.num_qo_heads);
    const auto hkv = static_cast<std::size_t>(c.num_kv_heads);
    const auto d = static_cast<std::size_t>(c.head_dim),
               dv = static_cast<std::size_t>(c.v_head_dim);
    const std::vector<std::byte> q = random_activations(tokens * hq * d);
    const std::vector<std::byte> k = random_activations(tokens * hkv * d);
    const std::vector<std::byte> v =
        mla ? std::vector<std::byte>() : random_activations(tokens * hkv * dv);
    const DType a = case_.activations;
    const auto view = [&](void* data, DType dtype, std::size_t heads, std::size_t dim) {
      return HeadTensor{data, dtype, std::int64_t(heads * dim), std::int64_t(dim)};
    };
    std::vector<float> out_cpu(tokens * hq * dv), lse_cpu(tokens * hq);
    cpu_.attention(layer, view(const_cast<std::byte*>(q.data()), a, hq, d),
                   view(const_cast<std::byte*>(k.data()), a, hkv, d),
                   mla ? HeadTensor{} : view(const_cast<std::byte*>(v.data()), a, hkv, dv),
                   view(out_cpu.data(), DType::kF32, hq, dv), case_.options, lse_cpu.data());

    DeviceBytes q_dev(q), k_dev(k), v_dev(v);
    DeviceBytes out_dev(out_cpu.size() * sizeof(float)), lse_dev(lse_cpu.size() * sizeof(float));
    out_dev.fill(0xff);  // rows the cache forgets to write stay NaN
    gpu_.attention(layer, view(q_dev.get(), a, hq, d), view(k_dev.get(), a, hkv, d),
                   mla ? HeadTensor{} : view(v_dev.get(), a, hkv, dv),
                   view(out_dev.get(), DType::kF32, hq, dv), case_.options, lse_dev.as<float>());
    synchronize();
    const std::vector<float> out = out_dev.download<float>();
    const std::vector<float> lse = lse_dev.download<float>();
    expect_rows_close(out_cpu, out, lse_cpu, lse, dv, prefill, layer);
  }

  // Each output row within the tolerance of its largest value; LSE absolute.
  void expect_rows_close(const std::vector<float>& expected, const std::vector<float>& actual,
                         const std::vector<float>& expected_lse,
                         const std::vector<float>& actual_lse, std::size_t dim, bool prefill,
                         std::int32_t layer) {
    const bool bf16 = case_.config.kv_dtype == DType::kBF16;
    const double row_tolerance = !prefill ? 2e-5 : bf16 ? 3.5e-2 : 1e-2;
    const double lse_tolerance = !prefill ? 5e-5 : bf16 ? 2e-2 : 4e-3;
    int reported = 0;
    for (std::size_t row = 0; row * dim < expected.size() && reported < 5; ++row) {
      double largest = 1.0;
      for (std::size_t i = 0; i < dim; ++i)
        largest = std::max(largest, std::fabs(double(expected[row * dim + i])));
      for (std::size_t i = 0; i < dim; ++i) {
        const double e = expected[row * dim + i], g = actual[row * dim + i];
        if (std::fabs(e - g) <= row_tolerance * largest) continue;
        ADD_FAILURE() << case_.name << " layer " << layer << " row " << row << " element " << i
                      << ": cpu " << e << ", cuda " << g << (prefill ? " (prefill)" : " (decode)");
        ++reported;
        break;
      }
      if (std::fabs(double(expected_lse[row]) - actual_lse[row]) > lse_tolerance) {
        ADD_FAILURE() << case_.name << " layer " << layer << " row " << row << ": LSE cpu "
                      << expected_lse[row] << ", cuda " << actual_lse[row];
        ++reported;
      }
    }
  }

  CacheCase case_;
  PagedKVCache cpu_;
  PagedKVCache gpu_;
  std::mt19937 rng_{7};
};

TEST(CudaKVCache, StepsMatchTheCpuCache) {
  PAGEDATTN_REQUIRE_GPU();
  for (const CacheCase& c : cases()) {
    SCOPED_TRACE(c.name);
    TwinCaches twins(c);
    const std::vector<std::int32_t> prompt(45, 3);
    for (SeqId id : {1, 2, 3}) twins.both([&](PagedKVCache& kv) { kv.add_sequence(id); });
    twins.step({1, 2, 3}, {37, 5, 64}, /*prefill=*/true);
    twins.both([&](PagedKVCache& kv) {
      kv.set_sequence_tokens(3, std::span<const std::int32_t>(prompt).first(45));
    });
    for (int i = 0; i < 3; ++i) twins.step({1, 2, 3}, {1, 1, 1}, /*prefill=*/false);
    // Copy-on-write of a forked partial page, and a rolled-back sequence.
    twins.both([](PagedKVCache& kv) { kv.fork_sequence(1, 4); });
    twins.both([](PagedKVCache& kv) { kv.pop_n(2, 3); });
    for (int i = 0; i < 2; ++i) twins.step({1, 4, 2}, {1, 1, 1}, /*prefill=*/false);
    // A prefix hit on device pages, then the host tier both ways.
    std::int64_t hits[2] = {};
    hits[0] = twins.cpu().add_sequence_with_prefix(5, prompt);
    hits[1] = twins.gpu().add_sequence_with_prefix(5, prompt);
    EXPECT_EQ(hits[0], hits[1]);
    EXPECT_GT(hits[0], 0);
    twins.step({5}, {45 - hits[0]}, /*prefill=*/true);
    const std::vector<SeqId> swapped = {1, 4};
    twins.both([&](PagedKVCache& kv) { kv.swap_out(swapped); });
    twins.step({2, 3}, {1, 1}, /*prefill=*/false);
    twins.both([&](PagedKVCache& kv) { kv.swap_in(swapped); });
    twins.step({1, 2, 3, 4, 5}, {1, 1, 1, 1, 1}, /*prefill=*/false);
    if (c.config.rope_mode == RopeMode::kNone)
      for (SeqId id : {1, 2, 3, 4, 5}) twins.expect_same_kv(id);
    // debug_set_kv writes through host copies of the pages.
    const KVCacheConfig& config = twins.cpu().config();
    const auto rows = static_cast<std::size_t>(config.num_layers * 2 * config.num_kv_heads);
    std::vector<float> k(rows * static_cast<std::size_t>(config.head_dim), 0.5f);
    std::vector<float> v(config.attention_kind == AttentionKind::kMLA
                             ? 0
                             : rows * static_cast<std::size_t>(config.v_head_dim),
                         -0.25f);
    twins.both([&](PagedKVCache& kv) { kv.debug_set_kv(2, 0, 2, k, v); });
    if (c.config.rope_mode == RopeMode::kNone) twins.expect_same_kv(2);
    twins.step({2}, {1}, /*prefill=*/false);
    if (HasFailure()) return;
  }
}

TEST(CudaKVCache, BranchingTokenTreesAreRefusedAndTheStepStaysUsable) {
  PAGEDATTN_REQUIRE_GPU();
  KVCacheConfig c = config_of(DType::kF16, KVLayout::kHND, 16, 64);
  c.device = KVDevice::kCuda;
  PagedKVCache kv(c, cuda::kv_device_backend());
  kv.add_sequence(1);
  const std::vector<SeqId> one = {1};
  const std::vector<std::int64_t> three = {3}, parents = {-1, 0, 0};  // two children of node 0
  kv.begin_forward(one, three, parents);
  const std::uint64_t before = kv.state_digest();
  DeviceBytes q(3 * 8 * 64 * 4), k(3 * 2 * 64 * 4), v(3 * 2 * 64 * 4), out(3 * 8 * 64 * 4);
  const auto view = [](const DeviceBytes& b, std::int64_t heads) {
    return HeadTensor{b.get(), DType::kF32, heads * 64, 64};
  };
  try {
    kv.attention(0, view(q, 8), view(k, 2), view(v, 2), view(out, 8));
    ADD_FAILURE() << "a branching token tree was attended on CUDA";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("token-tree"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.state_digest(), before);
  kv.cancel_forward();
}

// --- construction (no GPU needed) ---------------------------------------------------

KVCacheConfig cuda_config() {
  KVCacheConfig c = config_of(DType::kF16, KVLayout::kHND, 16, 64);
  c.device = KVDevice::kCuda;
  return c;
}

TEST(CudaKVCache, ACudaCacheWithoutABackendIsUnsupported) {
  try {
    PagedKVCache kv(cuda_config());
    ADD_FAILURE() << "constructed a kCuda cache without a backend";
  } catch (const Unsupported& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("PagedKVCache(config)"), std::string::npos) << message;
    EXPECT_NE(message.find("kv_device_backend"), std::string::npos) << message;
  }
}

TEST(CudaKVCache, InlineRopeIsRefusedWithTheCudaBackend) {
  KVCacheConfig c = cuda_config();
  c.rope_mode = RopeMode::kInline;
  try {
    PagedKVCache kv(c, cuda::kv_device_backend());
    ADD_FAILURE() << "constructed a CUDA cache with inline RoPE";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("rope_mode"), std::string::npos) << e.what();
  }
}

TEST(CudaKVCache, Float32KVIsRefusedWithTheCudaBackend) {
  KVCacheConfig c = cuda_config();
  c.kv_dtype = DType::kF32;
  try {
    PagedKVCache kv(c, cuda::kv_device_backend());
    ADD_FAILURE() << "constructed a CUDA cache with float32 K/V";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("kv_dtype = float32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedattn::testing
