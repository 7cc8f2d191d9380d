// The CUDA block ops against the CPU ones on the same inputs: append through
// a slot mapping (every storage dtype, both layouts, MLA), copy_pages, swap
// round trips and RoPE, bit for bit. The argument checks run on the host
// before any CUDA call, so they are tested without a GPU too.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/rope.h"
#include "support/random_floats.h"

namespace pagedattn::testing {
namespace {

using ::testing::HasSubstr;
using Pairs = std::vector<std::pair<std::int64_t, std::int64_t>>;

constexpr DType kActivationTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr DType kStorageTypes[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                                   DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};

template <class T>
T* data_or_null(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

// Runs `call` and expects ErrorT with `needle` in its message.
template <class ErrorT = InvalidArgument, class Call>
void expect_error(const Call& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming \"" << needle << "\"";
  } catch (const ErrorT& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

// --- storages -------------------------------------------------------------------------

struct StorageSpec {
  DType dtype = DType::kF16;
  KVLayout layout = KVLayout::kHND;
  std::int32_t num_pages = 6, page_size = 7, heads = 3, head_dim = 37, v_head_dim = 5;
  bool latent = false;           // MLA: V is the head of each K row (one head)
  bool per_head_scales = false;  // fp8: per-head scales instead of per-tensor ones
  bool nan_flags = false;        // e4m3: page_may_hold_nan
};

std::string describe(const StorageSpec& s) {
  return std::string(dtype_name(s.dtype)) + (s.layout == KVLayout::kHND ? " HND" : " NHD") +
         (s.latent ? " latent" : "") + (s.per_head_scales ? " per-head scales" : "") +
         " head_dim " + std::to_string(s.head_dim) + " v_head_dim " + std::to_string(s.v_head_dim);
}

// A storage's arrays on the host, holding random bytes (as pages left by
// earlier tenants): e4m3 pages hold NaN codes in every third page only, so
// NaN flags computed from the bytes vary. Not copyable: `view` points into it.
struct HostStorage {
  HostStorage(const StorageSpec& s, std::uint32_t seed) : spec(s) {
    view = s.latent ? PagedKVStorage::latent(nullptr, s.dtype, s.layout, s.page_size, s.head_dim,
                                             s.v_head_dim, s.num_pages)
                    : PagedKVStorage::dense(nullptr, nullptr, s.dtype, s.layout, s.page_size,
                                            s.heads, s.head_dim, s.v_head_dim, s.num_pages);
    std::mt19937 rng(seed);
    const auto es = static_cast<std::int64_t>(dtype_size(s.dtype));
    k = page_bytes(rng, view.k_page_stride * es);
    if (!s.latent) v = page_bytes(rng, view.v_page_stride * es);
    if (s.dtype == DType::kINT8) {
      const std::size_t n = std::size_t(s.num_pages) * view.num_kv_heads * s.page_size;
      pagedattn::test::UniformFloats uniform(0.0f, 0.1f);
      for (std::size_t i = 0; i < n; ++i) k_scales.push_back(uniform(rng));
      if (!s.latent)
        for (std::size_t i = 0; i < n; ++i) v_scales.push_back(uniform(rng));
    }
    if (s.per_head_scales)
      for (std::int32_t h = 0; h < view.num_kv_heads; ++h) {
        k_head_scales.push_back(0.3f + 0.17f * float(h));
        v_head_scales.push_back(0.9f - 0.11f * float(h));
      }
    if (s.nan_flags)
      for (std::int32_t p = 0; p < s.num_pages; ++p) flags.push_back(std::uint8_t(rng() % 2));
    view.k_scale = 0.7f;  // not powers of two: 1 / scale rounds
    view.v_scale = 0.45f;
    view.k_data = k.data();
    view.v_data = s.latent ? k.data() : v.data();
    view.k_token_scales = data_or_null(k_scales);
    view.v_token_scales = data_or_null(v_scales);
    view.k_head_scales = data_or_null(k_head_scales);
    view.v_head_scales = data_or_null(v_head_scales);
    view.page_may_hold_nan = data_or_null(flags);
    if (s.latent) view.share_k_scales_with_v();
  }
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;

  std::vector<std::uint8_t> page_bytes(std::mt19937& rng, std::int64_t page_bytes) const {
    std::vector<std::uint8_t> bytes(std::size_t(page_bytes * spec.num_pages));
    for (auto& b : bytes) b = std::uint8_t(rng());
    if (spec.dtype != DType::kFP8E4M3) return bytes;
    for (auto& b : bytes)
      if ((b & 0x7f) == 0x7f) b = 0;
    for (std::int32_t p = 0; p < spec.num_pages; p += 3)
      bytes[std::size_t(p * page_bytes + page_bytes / 2)] = 0xff;
    return bytes;
  }

  StorageSpec spec;
  std::vector<std::uint8_t> k, v, flags;
  std::vector<float> k_scales, v_scales, k_head_scales, v_head_scales;
  PagedKVStorage view;
};

// The same storage in device memory, uploaded from a host one.
struct DeviceStorage {
  explicit DeviceStorage(const HostStorage& h)
      : k(h.k),
        v(h.v),
        flags(h.flags),
        k_scales(h.k_scales),
        v_scales(h.v_scales),
        k_head_scales(h.k_head_scales),
        v_head_scales(h.v_head_scales),
        latent(h.spec.latent),
        view(h.view) {
    view.k_data = k.get();
    view.v_data = latent ? k.get() : v.get();
    view.k_token_scales = k_scales.as<float>();
    view.v_token_scales = v_scales.as<float>();
    view.k_head_scales = k_head_scales.as<float>();
    view.v_head_scales = v_head_scales.as<float>();
    view.page_may_hold_nan = flags.as<std::uint8_t>();
    if (latent) view.share_k_scales_with_v();
  }

  DeviceBytes k, v, flags, k_scales, v_scales, k_head_scales, v_head_scales;
  bool latent;
  PagedKVStorage view;
};

// `got` holds exactly the bytes of `want`; names the first differing element.
template <class T>
void expect_same_bytes(const DeviceBytes& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.bytes(), want.size() * sizeof(T)) << what;
  const std::vector<std::uint8_t> bytes = got.download<std::uint8_t>();
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(bytes.data() + i * sizeof(T), &want[i], sizeof(T)) != 0) {
      T value;
      std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
      FAIL() << what << " element " << i << ": got " << +value << ", want " << +want[i];
    }
}

void expect_same_storage(const DeviceStorage& got, const HostStorage& want) {
  expect_same_bytes(got.k, want.k, "K");
  expect_same_bytes(got.v, want.v, "V");
  expect_same_bytes(got.k_scales, want.k_scales, "K token scales");
  expect_same_bytes(got.v_scales, want.v_scales, "V token scales");
  expect_same_bytes(got.flags, want.flags, "NaN flags");
}

// --- append inputs ----------------------------------------------------------------------

// Values that exercise every conversion: signed zeros, ties, saturation,
// subnormals, infinities and (unless `with_nan` is false) NaN among normal
// values over 2^-12 .. 2^12.
std::vector<float> test_values(std::mt19937& rng, std::size_t n, bool with_nan) {
  pagedattn::test::NormalFloats normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * std::ldexp(1.0f, int(rng() % 24) - 12);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> specials = {0.0f,     -0.0f,    1.0f,  -1.0625f, 0.53125f, 1.00390625f,
                                 65504.0f, 70000.0f, 1e-8f, -3.5f,    448.0f,   500.0f,
                                 1e5f,     5e-40f,   inf,   -inf,     313.6f,   -0.0078125f};
  if (with_nan) specials.push_back(std::numeric_limits<float>::quiet_NaN());
  for (float s : specials) v[rng() % n] = s;
  return v;
}

// [tokens][heads][dim] in `dtype` with a padded token stride, on the host
// and on the device.
struct Activations {
  Activations(DType dtype, std::int32_t tokens, std::int32_t heads, std::int32_t dim,
              const std::vector<float>& values) {
    const std::int64_t token_stride = std::int64_t{heads} * dim + 3;
    bytes.assign(std::size_t(tokens * token_stride) * dtype_size(dtype), 0x5a);
    for (std::int32_t t = 0; t < tokens; ++t)
      for (std::int32_t h = 0; h < heads; ++h)
        for (std::int32_t d = 0; d < dim; ++d)
          store_from_float(bytes.data(), dtype, std::size_t(t * token_stride + h * dim + d),
                           values[(std::size_t(t) * heads + h) * dim + d]);
    device = DeviceBytes(bytes);
    host_view = {bytes.data(), dtype, token_stride, dim};
    device_view = {device.get(), dtype, token_stride, dim};
  }
  std::vector<std::uint8_t> bytes;
  DeviceBytes device;
  HeadTensor host_view, device_view;
};

// `tokens` distinct slots of the storage in random order, about one in five -1.
std::vector<std::int64_t> random_slots(std::mt19937& rng, const StorageSpec& s,
                                       std::int32_t tokens) {
  std::vector<std::int64_t> slots(std::size_t(s.num_pages) * s.page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(std::size_t(tokens));
  for (auto& slot : slots)
    if (rng() % 5 == 0) slot = -1;
  return slots;
}

// Appends the same random tokens with the CPU and the GPU and compares every
// byte of the storages (pages, token scales, NaN flags).
void expect_append_matches_cpu(const StorageSpec& spec, DType k_dtype, DType v_dtype,
                               std::int32_t tokens, std::uint32_t seed) {
  SCOPED_TRACE(describe(spec) + ", k " + std::string(dtype_name(k_dtype)) + ", v " +
               std::string(dtype_name(v_dtype)));
  HostStorage cpu(spec, seed);
  DeviceStorage gpu(cpu);
  std::mt19937 rng(seed + 1);
  const bool with_nan = spec.dtype != DType::kINT8;  // a NaN row's int8 scale is the CPU target's
  const std::int32_t heads = cpu.view.num_kv_heads;
  const Activations k(k_dtype, tokens, heads, spec.head_dim,
                      test_values(rng, std::size_t(tokens) * heads * spec.head_dim, with_nan));
  const Activations v(v_dtype, tokens, heads, spec.v_head_dim,
                      test_values(rng, std::size_t(tokens) * heads * spec.v_head_dim, with_nan));
  const std::vector<std::int64_t> slots = random_slots(rng, spec, tokens);
  const DeviceBytes device_slots(slots);

  AppendParams host{k.host_view, v.host_view, slots.data(), tokens, cpu.view};
  AppendParams device{k.device_view, v.device_view, device_slots.as<std::int64_t>(), tokens,
                      gpu.view};
  if (spec.latent) host.v = device.v = HeadTensor{};
  append_paged_kv(host);
  cuda::cuda_append_paged_kv(device);
  synchronize();
  expect_same_storage(gpu, cpu);
}

TEST(CudaAppendPagedKv, MatchesTheCpuBitForBitInEveryDtypeAndLayout) {
  PAGEDATTN_REQUIRE_GPU();
  // Odd head dims with tails in every warp; then more rows than warps.
  const StorageSpec shapes[] = {
      {.num_pages = 6, .page_size = 7, .heads = 3, .head_dim = 37, .v_head_dim = 5},
      {.num_pages = 4, .page_size = 16, .heads = 9, .head_dim = 128, .v_head_dim = 72}};
  std::uint32_t seed = 1;
  for (StorageSpec spec : shapes)
    for (DType dtype : kStorageTypes)
      for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD})
        for (int inputs = 0; inputs < 3; ++inputs)
          for (bool per_head : {false, true}) {
            if (per_head && !is_fp8(dtype)) continue;
            spec.dtype = dtype;
            spec.layout = layout;
            spec.per_head_scales = per_head;
            spec.nan_flags = dtype == DType::kFP8E4M3;
            const std::int32_t tokens = spec.num_pages * spec.page_size * 2 / 3;
            expect_append_matches_cpu(spec, kActivationTypes[inputs],
                                      kActivationTypes[(inputs + 1) % 3], tokens, ++seed);
            if (HasFatalFailure()) return;
          }
}

TEST(CudaAppendPagedKv, WritesLatentRowsWithoutV) {
  PAGEDATTN_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kFP8E4M3, DType::kINT8})
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      StorageSpec spec{.dtype = dtype,
                       .layout = layout,
                       .num_pages = 4,
                       .page_size = 5,
                       .heads = 1,
                       .head_dim = 576,
                       .v_head_dim = 512,
                       .latent = true,
                       .nan_flags = dtype == DType::kFP8E4M3};
      expect_append_matches_cpu(spec, DType::kBF16, DType::kBF16, 13, ++seed);
      if (HasFatalFailure()) return;
    }
}

// The last slot of the storage and a skipped token; nothing else written.
TEST(CudaAppendPagedKv, SkipsMinusOneAndWritesTheLastSlot) {
  PAGEDATTN_REQUIRE_GPU();
  const StorageSpec spec{.dtype = DType::kINT8,
                         .num_pages = 2,
                         .page_size = 3,
                         .heads = 2,
                         .head_dim = 8,
                         .v_head_dim = 8};
  HostStorage cpu(spec, 7);
  DeviceStorage gpu(cpu);
  std::mt19937 rng(8);
  const Activations k(DType::kF32, 2, 2, 8, test_values(rng, 32, false));
  const Activations v(DType::kF16, 2, 2, 8, test_values(rng, 32, false));
  const std::vector<std::int64_t> slots = {-1, 5};
  const DeviceBytes device_slots(slots);
  append_paged_kv({k.host_view, v.host_view, slots.data(), 2, cpu.view});
  cuda::cuda_append_paged_kv(
      {k.device_view, v.device_view, device_slots.as<std::int64_t>(), 2, gpu.view});
  synchronize();
  expect_same_storage(gpu, cpu);
}

// --- copy_pages ---------------------------------------------------------------------------

// `count` pairs: random sources in [src_begin, src_end) (repeats allowed),
// distinct random destinations in [dst_begin, dst_end).
Pairs random_pairs(std::mt19937& rng, std::int64_t count, std::int64_t src_begin,
                   std::int64_t src_end, std::int64_t dst_begin, std::int64_t dst_end) {
  std::vector<std::int64_t> dsts(std::size_t(dst_end - dst_begin));
  std::iota(dsts.begin(), dsts.end(), dst_begin);
  std::shuffle(dsts.begin(), dsts.end(), rng);
  Pairs pairs;
  for (std::int64_t i = 0; i < count; ++i)
    pairs.emplace_back(src_begin + std::int64_t(rng() % std::uint64_t(src_end - src_begin)),
                       dsts[std::size_t(i)]);
  return pairs;
}

// Within one storage (copy-on-write): more pairs than one launch takes.
TEST(CudaCopyPages, MatchesTheCpuWithinOneStorage) {
  PAGEDATTN_REQUIRE_GPU();
  std::uint32_t seed = 200;
  for (DType dtype : kStorageTypes)
    for (bool latent : {false, true}) {
      StorageSpec spec{.dtype = dtype,
                       .layout = KVLayout::kNHD,
                       .num_pages = 400,
                       .page_size = 3,
                       .heads = latent ? 1 : 2,
                       .head_dim = 12,
                       .v_head_dim = latent ? 8 : 6,
                       .latent = latent,
                       .nan_flags = dtype == DType::kFP8E4M3};
      SCOPED_TRACE(describe(spec));
      HostStorage cpu(spec, ++seed);
      DeviceStorage gpu(cpu);
      std::mt19937 rng(seed);
      const Pairs pairs = random_pairs(rng, 150, 0, 200, 200, 400);
      copy_pages(cpu.view, cpu.view, pairs);
      cuda::cuda_copy_pages(gpu.view, gpu.view, pairs);
      synchronize();
      expect_same_storage(gpu, cpu);
      if (HasFatalFailure()) return;
    }
}

// Between two storages; an e4m3 destination's NaN flags come from the
// source's flags, or from its bytes where it keeps none.
TEST(CudaCopyPages, MatchesTheCpuBetweenStoragesWithAndWithoutSourceFlags) {
  PAGEDATTN_REQUIRE_GPU();
  std::uint32_t seed = 300;
  for (DType dtype : {DType::kFP8E4M3, DType::kINT8, DType::kBF16})
    for (bool source_flags : {false, true}) {
      StorageSpec spec{.dtype = dtype,
                       .layout = KVLayout::kHND,
                       .num_pages = 30,
                       .page_size = 5,
                       .heads = 2,
                       .head_dim = 16,
                       .v_head_dim = 8,
                       .nan_flags = source_flags && dtype == DType::kFP8E4M3};
      SCOPED_TRACE(describe(spec) + (source_flags ? ", source flags" : ", no source flags"));
      HostStorage cpu_src(spec, ++seed);
      spec.nan_flags = dtype == DType::kFP8E4M3;
      HostStorage cpu_dst(spec, ++seed);
      DeviceStorage gpu_src(cpu_src), gpu_dst(cpu_dst);
      std::mt19937 rng(seed);
      const Pairs pairs = random_pairs(rng, 20, 0, 30, 0, 30);
      copy_pages(cpu_src.view, cpu_dst.view, pairs);
      cuda::cuda_copy_pages(gpu_src.view, gpu_dst.view, pairs);
      synchronize();
      expect_same_storage(gpu_dst, cpu_dst);
      expect_same_storage(gpu_src, cpu_src);
      if (HasFatalFailure()) return;
    }
}

// --- swap_pages ---------------------------------------------------------------------------

// Host -> device -> host on a stream of its own, runs of consecutive pages
// and scattered ones: every byte as two CPU copy_pages give.
TEST(CudaSwapPages, RoundTripsThroughTheDevice) {
  PAGEDATTN_REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::uint32_t seed = 400;
  // Runs 0-3 -> 10-13 and 20-21 -> 4-5, then scattered pages.
  const Pairs out = {{2, 12}, {0, 10}, {1, 11}, {3, 13}, {20, 4}, {21, 5}, {7, 30}, {9, 8}};
  const Pairs back = {{12, 0}, {13, 1}, {4, 2}, {30, 9}, {8, 17}, {10, 18}};
  for (DType dtype : {DType::kINT8, DType::kFP8E4M3, DType::kBF16})
    for (bool latent : {false, true}) {
      const StorageSpec spec{.dtype = dtype,
                             .num_pages = 32,
                             .page_size = 4,
                             .heads = latent ? 1 : 3,
                             .head_dim = 24,
                             .v_head_dim = 16,
                             .latent = latent,
                             .nan_flags = dtype == DType::kFP8E4M3};
      SCOPED_TRACE(describe(spec));
      HostStorage host(spec, ++seed), host_back(spec, ++seed);
      HostStorage device_want(spec, ++seed);
      DeviceStorage device(device_want);
      copy_pages(host.view, device_want.view, out);
      HostStorage host_back_want(spec, seed - 1);  // host_back's initial bytes
      copy_pages(device_want.view, host_back_want.view, back);

      cuda::cuda_swap_pages(host.view, device.view, out, cuda::SwapDirection::kHostToDevice,
                            stream);
      cuda::cuda_swap_pages(device.view, host_back.view, back, cuda::SwapDirection::kDeviceToHost,
                            stream);
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      expect_same_storage(device, device_want);
      EXPECT_EQ(host_back.k, host_back_want.k);
      EXPECT_EQ(host_back.v, host_back_want.v);
      EXPECT_EQ(host_back.k_scales, host_back_want.k_scales);
      EXPECT_EQ(host_back.v_scales, host_back_want.v_scales);
      EXPECT_EQ(host_back.flags, host_back_want.flags);
    }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

// Where the source keeps no NaN flags, the destination's flags of the moved
// pages become 1 (conservative), the others stay as they were.
TEST(CudaSwapPages, MarksDestinationFlagsWhereTheSourceKeepsNone) {
  PAGEDATTN_REQUIRE_GPU();
  StorageSpec spec{.dtype = DType::kFP8E4M3,
                   .num_pages = 8,
                   .page_size = 2,
                   .heads = 1,
                   .head_dim = 8,
                   .v_head_dim = 8};
  HostStorage host_plain(spec, 1);
  spec.nan_flags = true;
  HostStorage host_flags(spec, 2), device_init(spec, 3);
  std::fill(host_flags.flags.begin(), host_flags.flags.end(), 0);
  std::fill(device_init.flags.begin(), device_init.flags.end(), 0);
  DeviceStorage device(device_init);
  cuda::cuda_swap_pages(host_plain.view, device.view, Pairs{{0, 1}, {1, 2}, {5, 6}},
                        cuda::SwapDirection::kHostToDevice);
  synchronize();
  EXPECT_EQ(device.flags.download<std::uint8_t>(),
            (std::vector<std::uint8_t>{0, 1, 1, 0, 0, 0, 1, 0}));

  HostStorage device_plain_init(StorageSpec{.dtype = DType::kFP8E4M3,
                                            .num_pages = 8,
                                            .page_size = 2,
                                            .heads = 1,
                                            .head_dim = 8,
                                            .v_head_dim = 8},
                                4);
  DeviceStorage device_plain(device_plain_init);
  cuda::cuda_swap_pages(device_plain.view, host_flags.view, Pairs{{3, 3}, {4, 7}},
                        cuda::SwapDirection::kDeviceToHost);
  synchronize();
  EXPECT_EQ(host_flags.flags, (std::vector<std::uint8_t>{0, 0, 0, 1, 0, 0, 0, 1}));
}

// --- apply_rope -----------------------------------------------------------------------------

// f32 bits of element i of an activation buffer.
std::uint32_t element_bits(const std::vector<std::uint8_t>& bytes, DType dtype, std::size_t i) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * dtype_size(dtype), dtype_size(dtype));
  return bits;
}

// Rotates the same tokens with the CPU and the GPU. With a cos/sin cache
// both read the same floats: bit for bit. Without, both form cos and sin in
// double and round once to f32, but CUDA's double sin / cos are within 2
// ulp and glibc's within 1, so a float cos / sin may differ by one ulp where
// the double falls next to a rounding boundary, which is rare: each element
// within a few ulp of the row's largest input (and one ulp of a 16-bit
// output), and almost every element bit for bit (one differing cos / sin
// touches its pair in every head).
void expect_rope_matches_cpu(DType dtype, const RopeConfig& config,
                             const std::vector<std::int32_t>& positions, bool exact) {
  const auto tokens = static_cast<std::int32_t>(positions.size());
  const std::int32_t heads = 5, dim = 72;
  std::mt19937 rng(11);
  pagedattn::test::NormalFloats normal;
  std::vector<float> values(std::size_t(tokens) * heads * dim);
  for (float& x : values) x = normal(rng);
  Activations x(dtype, tokens, heads, dim, values);
  const DeviceBytes device_positions(positions);
  apply_rope(x.host_view, tokens, heads, dim, positions.data(), config);
  RopeConfig device_config = config;
  DeviceBytes cos_cache, sin_cache;
  if (config.cos_cache) {
    const std::size_t n = std::size_t(config.cache_max_position) * (dim / 2);
    cos_cache = DeviceBytes(config.cos_cache, n * sizeof(float));
    sin_cache = DeviceBytes(config.sin_cache, n * sizeof(float));
    device_config.cos_cache = cos_cache.as<float>();
    device_config.sin_cache = sin_cache.as<float>();
  }
  cuda::cuda_apply_rope(x.device_view, tokens, heads, dim, device_positions.as<std::int32_t>(),
                        device_config);
  synchronize();
  const std::vector<std::uint8_t> got = x.device.download<std::uint8_t>();
  const float output_ulp = dtype == DType::kF16 ? 0x1p-10f : (dtype == DType::kBF16 ? 0x1p-7f : 0);
  std::size_t inexact = 0, compared = 0;
  for (std::int32_t t = 0; t < tokens; ++t)
    for (std::int32_t h = 0; h < heads; ++h) {
      float row_max = 0.0f;
      for (std::int32_t d = 0; d < dim; ++d)
        row_max = std::max(row_max, std::fabs(values[(std::size_t(t) * heads + h) * dim + d]));
      for (std::int32_t d = 0; d < dim; ++d) {
        const std::size_t i = std::size_t(t * x.host_view.token_stride + h * dim + d);
        ++compared;
        if (element_bits(got, dtype, i) == element_bits(x.bytes, dtype, i)) continue;
        ++inexact;
        ASSERT_FALSE(exact) << "token " << t << " head " << h << " dim " << d;
        const float want = load_as_float(x.bytes.data(), dtype, i);
        const float value = load_as_float(got.data(), dtype, i);
        EXPECT_NEAR(value, want, 1e-6f * row_max + output_ulp * std::fabs(want))
            << "token " << t << " head " << h << " dim " << d;
      }
    }
  EXPECT_LE(inexact, compared / 50) << "the GPU computes otherwise than the CPU";
}

TEST(CudaApplyRope, MatchesTheCpuForStylesPartialDimsScalingsAndDtypes) {
  PAGEDATTN_REQUIRE_GPU();
  std::vector<float> divisors(36);
  for (std::size_t i = 0; i < divisors.size(); ++i) divisors[i] = 1.0f + 0.25f * float(i);
  for (DType dtype : kActivationTypes)
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ})
      for (std::int32_t rotary : {0, 32})
        for (int scaling : {0, 1, 2, 3}) {  // none, llama3, yarn, frequency divisors
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " style " + std::to_string(int(style)) +
                       " rotary " + std::to_string(rotary) + " scaling " + std::to_string(scaling));
          RopeConfig c;
          c.style = style;
          c.rotary_dim = rotary;
          c.theta = 500000.0f;
          c.attention_factor = 1.25f;
          if (scaling == 1) c.llama3 = {8.0f, 1.0f, 4.0f, 8192};
          if (scaling == 2) c.yarn = {4.0f, 4096};
          if (scaling == 3) c.freq_factors = divisors.data();
          expect_rope_matches_cpu(dtype, c, {0, 1, 17, 4095, 32767, 131071, 500000}, false);
          if (HasFatalFailure()) return;
        }
}

TEST(CudaApplyRope, ReadsTheCosSinCacheBitForBit) {
  PAGEDATTN_REQUIRE_GPU();
  const std::int32_t dim = 72, half = dim / 2, rows = 4096;
  RopeConfig plain;
  plain.theta = 1e6f;
  std::vector<float> cos_cache(std::size_t(rows) * half), sin_cache(cos_cache.size());
  for (std::int32_t p = 0; p < rows; ++p)
    for (std::int32_t i = 0; i < half; ++i)
      rope_cos_sin(plain, dim, p, i, cos_cache[std::size_t(p) * half + i],
                   sin_cache[std::size_t(p) * half + i]);
  RopeConfig cached;
  cached.cos_cache = cos_cache.data();
  cached.sin_cache = sin_cache.data();
  cached.cache_max_position = rows;
  for (DType dtype : kActivationTypes)
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " style " + std::to_string(int(style)));
      cached.style = style;
      expect_rope_matches_cpu(dtype, cached, {0, 1, 17, 999, 2048, 4000, 4095}, true);
      if (HasFatalFailure()) return;
    }
}

// --- argument checks (host only: no GPU needed) ------------------------------------------------

// Host buffers stand in for device memory: every call below must fail its
// checks before touching them or CUDA.
struct FakeAppend {
  FakeAppend() : storage(StorageSpec{.dtype = DType::kINT8}, 1) {
    params.k = {k.data(), DType::kF32, 3 * 37, 37};
    params.v = {v.data(), DType::kF32, 3 * 5, 5};
    params.slot_mapping = slots.data();
    params.num_tokens = 2;
    params.kv = storage.view;
  }
  std::vector<float> k = std::vector<float>(2 * 3 * 37), v = std::vector<float>(2 * 3 * 5);
  std::vector<std::int64_t> slots = {0, 1};
  HostStorage storage;
  AppendParams params;
};

TEST(CudaAppendPagedKv, RejectsBadArgumentsOnTheHost) {
  const auto append = [](const AppendParams& p) { return [p] { cuda::cuda_append_paged_kv(p); }; };
  FakeAppend f;
  AppendParams p = f.params;
  p.num_tokens = -1;
  expect_error(append(p), "num_tokens = -1");
  p = f.params;
  p.slot_mapping = nullptr;
  expect_error(append(p), "slot_mapping");
  p = f.params;
  p.k.dtype = DType::kINT8;
  expect_error(append(p), "k.dtype = int8");
  p = f.params;
  p.v.dtype = DType::kFP8E4M3;
  expect_error(append(p), "v.dtype = float8_e4m3fn");
  p = f.params;
  p.kv.layout = static_cast<KVLayout>(7);
  expect_error(append(p), "kv.layout = 7");
  p = f.params;
  p.kv.dtype = static_cast<DType>(9);
  expect_error(append(p), "kv.dtype = unknown (9)");
  p = f.params;
  p.kv.page_size = 0;
  expect_error(append(p), "page_size = 0");
  p = f.params;
  p.kv.v_token_scales = nullptr;
  expect_error(append(p), "v_token_scales");
  p = f.params;
  p.kv.dtype = DType::kFP8E5M2;
  p.kv.k_scale = 0.0f;
  expect_error(append(p), "kv.k_scale = 0");
  p = f.params;
  p.kv.v_in_k = true;
  expect_error(append(p), "v.data must be null");
  p = f.params;
  p.kv.k_data = nullptr;
  expect_error(append(p), "kv.k_data");
  // Nothing to append: no checks of the pointers, no CUDA call.
  p = AppendParams{};
  EXPECT_NO_THROW(cuda::cuda_append_paged_kv(p));
}

TEST(CudaCopyPages, RejectsBadArgumentsOnTheHost) {
  HostStorage a(StorageSpec{.dtype = DType::kF16, .num_pages = 4}, 1);
  HostStorage b(StorageSpec{.dtype = DType::kBF16, .num_pages = 4}, 2);
  HostStorage c(StorageSpec{.dtype = DType::kF16, .num_pages = 4, .head_dim = 36}, 3);
  const auto copy = [](const PagedKVStorage& s, const PagedKVStorage& d, Pairs pairs) {
    return [&s, &d, pairs] { cuda::cuda_copy_pages(s, d, pairs); };
  };
  expect_error(copy(a.view, b.view, {{0, 1}}),
               "src.dtype = float16 (1) and dst.dtype = bfloat16 (2) differ");
  expect_error(copy(a.view, c.view, {{0, 1}}), "src.head_dim = 37 and dst.head_dim = 36");
  expect_error(copy(a.view, a.view, {{0, 1}, {2, 1}}), "destination page 1 appears more than once");
  expect_error(copy(a.view, a.view, {{0, 1}, {1, 2}}), "page 1 is both a source and a destination");
  expect_error(copy(a.view, a.view, {{0, 4}}), "pair 0 destination page 4 is outside [0, 4)");
  expect_error(copy(a.view, a.view, {{-1, 2}}), "pair 0 source page -1");
  PagedKVStorage bad_layout = a.view;
  bad_layout.layout = static_cast<KVLayout>(3);
  expect_error(copy(bad_layout, bad_layout, {{0, 1}}), "src.layout = 3");
  PagedKVStorage no_data = a.view;
  no_data.v_data = nullptr;
  expect_error(copy(a.view, no_data, {{0, 1}}), "data pointers must be non-null");
  HostStorage q(StorageSpec{.dtype = DType::kINT8, .num_pages = 4}, 4);
  PagedKVStorage no_scales = q.view;
  no_scales.k_token_scales = nullptr;
  expect_error(copy(q.view, no_scales, {{0, 1}}), "token scales");
  EXPECT_NO_THROW(cuda::cuda_copy_pages(a.view, a.view, Pairs{}));  // nothing to launch
}

TEST(CudaSwapPages, RejectsBadArgumentsOnTheHost) {
  HostStorage a(StorageSpec{.dtype = DType::kF16, .num_pages = 4}, 1);
  HostStorage b(StorageSpec{.dtype = DType::kFP8E4M3, .num_pages = 4}, 2);
  const auto swap = [](const PagedKVStorage& s, const PagedKVStorage& d, Pairs pairs,
                       cuda::SwapDirection direction) {
    return [&s, &d, pairs, direction] { cuda::cuda_swap_pages(s, d, pairs, direction); };
  };
  const auto h2d = cuda::SwapDirection::kHostToDevice;
  expect_error(swap(a.view, b.view, {{0, 1}}, h2d), "src.dtype = float16 (1)");
  expect_error(swap(a.view, a.view, {{0, 2}, {1, 2}}, h2d), "destination page 2 appears");
  expect_error(swap(a.view, a.view, {{0, 9}}, h2d), "destination page 9 is outside");
  expect_error(swap(a.view, a.view, {{0, 1}}, static_cast<cuda::SwapDirection>(7)),
               "direction = 7");
  EXPECT_NO_THROW(cuda::cuda_swap_pages(a.view, a.view, Pairs{}, h2d));
}

TEST(CudaApplyRope, RejectsBadArgumentsOnTheHost) {
  std::vector<float> x(4 * 1024);
  const std::vector<std::int32_t> positions = {0, 1};
  const HeadTensor view{x.data(), DType::kF32, 1024, 1024};
  const auto rope = [&](HeadTensor t, std::int32_t dim, const std::int32_t* pos, RopeConfig c) {
    return [t, dim, pos, c] { cuda::cuda_apply_rope(t, 2, 1, dim, pos, c); };
  };
  RopeConfig c;
  c.rotary_dim = 80;
  expect_error(rope(view, 64, positions.data(), c), "rotary_dim = 80");
  c.rotary_dim = 7;
  expect_error(rope(view, 64, positions.data(), c), "rotary_dim = 7");
  c.rotary_dim = 0;
  expect_error<Unsupported>(rope(view, 1024, positions.data(), c), "rotary_dim = 1024");
  expect_error(rope({x.data(), DType::kINT8, 64, 64}, 64, positions.data(), c), "x.dtype = int8");
  expect_error(rope(view, 64, nullptr, c), "positions");
  expect_error(rope({nullptr, DType::kF32, 64, 64}, 64, positions.data(), c), "x.data");
  RopeConfig bad = c;
  bad.theta = -1.0f;
  expect_error(rope(view, 64, positions.data(), bad), "theta = -1");
  bad = c;
  bad.yarn = {0.5f, 4096};
  expect_error(rope(view, 64, positions.data(), bad), "yarn scaling factor = 0.5");
  const std::vector<float> divisors = {1.0f, 0.0f, 1.0f, 1.0f};
  bad = c;
  bad.freq_factors = divisors.data();
  expect_error(rope(view, 8, positions.data(), bad), "freq_factors[1] = 0");
  bad = c;
  bad.cos_cache = x.data();
  expect_error(rope(view, 64, positions.data(), bad), "cos_cache and sin_cache");
  bad.sin_cache = x.data();
  expect_error(rope(view, 64, positions.data(), bad), "cache_max_position = 0");
  bad = c;
  bad.style = static_cast<RopeStyle>(5);
  expect_error(rope(view, 64, positions.data(), bad), "style = 5");
  EXPECT_NO_THROW(cuda::cuda_apply_rope(view, 0, 1, 64, nullptr, c));  // no tokens
}

}  // namespace
}  // namespace pagedattn::testing
