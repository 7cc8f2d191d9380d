// Append (slot mapping, quantise on write), row conversion, RoPE and page
// copy/swap against scalar expectations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cpu/convert.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"
#include "support/random_floats.h"

namespace pagedattn {
namespace {

using ::testing::HasSubstr;

std::vector<float> interesting_floats(std::uint32_t seed, std::size_t n) {
  std::mt19937 rng(seed);
  pagedattn::test::NormalFloats normal;
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          1.00390625f /* bf16 tie */,
                          1.01171875f,
                          65504.0f,
                          70000.0f,
                          1e-8f,
                          -3.5f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          448.0f,
                          500.0f};
  while (v.size() < n) v.push_back(normal(rng) * std::ldexp(1.0f, int(rng() % 20) - 10));
  return v;
}

bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// Restores Highway's normal target choice when a test leaves early.
struct TargetReset {
  ~TargetReset() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(ConvertRow, MatchesScalarConversionsOnEveryTarget) {
  const std::vector<float> src = interesting_floats(1, 997);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (DType dst_t :
         {DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8}) {
      std::vector<unsigned char> dst(src.size() * dtype_size(dst_t));
      kernels::convert_row(src.data(), DType::kF32, dst.data(), dst_t, std::ssize(src), 0.5f);
      for (std::size_t i = 0; i < src.size(); ++i) {
        std::vector<unsigned char> want(dtype_size(dst_t));
        store_from_float(want.data(), dst_t, 0, src[i] * 0.5f);
        ASSERT_EQ(std::memcmp(want.data(), dst.data() + i * want.size(), want.size()), 0)
            << dtype_name(dst_t) << " element " << i << " value " << src[i];
      }
      if (dst_t != DType::kF16 && dst_t != DType::kBF16) continue;
      std::vector<float> back(src.size());
      kernels::convert_row(dst.data(), dst_t, back.data(), DType::kF32, std::ssize(src), 1.0f);
      for (std::size_t i = 0; i < src.size(); ++i)
        ASSERT_TRUE(same_bits(back[i], load_as_float(dst.data(), dst_t, i))) << i;
    }
  }
}

// The kernels' vector widening (LoadConvert) of every fp8 and int8 byte, on
// every target, equals the scalar decoding in dtype.h; e4m3 NaN stays NaN.
TEST(ConvertRow, WidensEveryQuantisedByteLikeTheScalarDecoding) {
  std::vector<unsigned char> bytes(256 + 7);  // a vector tail too
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i % 256);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (DType t : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8}) {
      std::vector<float> out(bytes.size());
      kernels::convert_row(bytes.data(), t, out.data(), DType::kF32, std::ssize(bytes), 1.0f);
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        const float want = load_as_float(bytes.data(), t, i);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(out[i])) << dtype_name(t) << " byte " << int(bytes[i]);
        } else {
          ASSERT_TRUE(same_bits(out[i], want))
              << dtype_name(t) << " byte " << int(bytes[i]) << ": " << out[i] << " != " << want;
        }
      }
    }
  }
}

// The fp8 e4m3 decode's steps, on every target: the NaN-code check finds a
// NaN code at any position of a row (full vectors and the 8-byte tail) and
// none in a row without one; the conversion without the NaN select gives
// every other byte's scalar decoding x 2^-8, bit for bit (-0 included).
TEST(ConvertRow, E4M3DecodeStepsMatchTheScalarDecoding) {
  std::vector<unsigned char> bytes;  // every code but the two NaN codes, then a tail of 8
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7F) != 0x7F) bytes.push_back(static_cast<unsigned char>(b));
  for (int b = 0; bytes.size() % 16 != 8; ++b) bytes.push_back(static_cast<unsigned char>(b));
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const auto n = std::ssize(bytes);
    ASSERT_FALSE(kernels::e4m3_has_nan(bytes.data(), n));
    for (const unsigned char nan : {0x7F, 0xFF})
      for (const std::int64_t at : {std::int64_t{0}, std::int64_t{15}, std::int64_t{63},
                                    std::int64_t{64}, n - 9, n - 8, n - 1}) {
        std::vector<unsigned char> poisoned = bytes;
        poisoned[std::size_t(at)] = nan;
        ASSERT_TRUE(kernels::e4m3_has_nan(poisoned.data(), n))
            << "code " << int(nan) << " at " << at;
      }
    std::vector<float> out(bytes.size(), -1.0f);
    kernels::e4m3_to_f32_nan_free(bytes.data(), out.data(), n);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      const float want = load_as_float(bytes.data(), DType::kFP8E4M3, i);
      const float got = out[i] * 256.0f;
      ASSERT_TRUE(same_bits(got, want))
          << "byte " << int(bytes[i]) << ": " << got << " != " << want;
    }
  }
}

// Runs check(t, ran) for both fp8 formats on every compiled target this CPU
// runs; check sets `ran` where the target has the conversion. Returns the
// targets that had it.
template <class Check>
int for_each_target_and_fp8_format(const Check& check) {
  TargetReset reset;
  int targets_with_it = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    bool ran = false;
    for (DType t : {DType::kFP8E4M3, DType::kFP8E5M2}) check(t, ran);
    targets_with_it += ran;
  }
  return targets_with_it;
}

// fp8 code i of `bytes` as the bf16 decode converts it (e4m3 x 2^-8, the
// kernel's convention), rounded to bf16 bits.
std::uint16_t expected_bf16_bits(const std::vector<unsigned char>& bytes, DType t, std::size_t i) {
  return float_to_bf16_bits(load_as_float(bytes.data(), t, i) *
                            (t == DType::kFP8E4M3 ? 0x1p-8f : 1.0f));
}

// The bf16 dot-product decode's fp8 -> bf16 conversion of two rows at once
// (VBMI byte tables), in both orders (PV's value pairs, QK's key halves):
// every code of both formats in each row of the pair, a masked tail of 8, on
// every target that has it, bit for bit the scalar decoding rounded to bf16
// (e4m3 x 2^-8, the kernel's convention), and that rounding exact.
TEST(ConvertRow, ConvertsEveryFp8CodePairToBf16BitsExactly) {
  std::vector<unsigned char> a(256 + 8), b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<unsigned char>((i * 7 + 3) % 256);
    b[i] = static_cast<unsigned char>((i * 13 + 100) % 256);
  }
  const bool vbmi = dispatched_features().avx512f && cpu_features().avx512_vbmi;
  const int targets_with_it = for_each_target_and_fp8_format([&](DType t, bool& ran) {
    for (const kernels::Fp8PairOrder order :
         {kernels::Fp8PairOrder::kValues, kernels::Fp8PairOrder::kKeys}) {
      SCOPED_TRACE(order == kernels::Fp8PairOrder::kKeys ? "key order" : "value order");
      std::vector<std::uint32_t> pairs(a.size() + 8, 0xdeadbeef);
      if (!kernels::fp8_pairs_to_bf16_bits(a.data(), b.data(), t, order, pairs.data(),
                                           std::ssize(a))) {
        for (std::uint32_t x : pairs) ASSERT_EQ(x, 0xdeadbeefu);
        return;
      }
      ran = true;
      const float format = t == DType::kFP8E4M3 ? 0x1p-8f : 1.0f;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::uint32_t want =
            expected_bf16_bits(a, t, i) | std::uint32_t{expected_bf16_bits(b, t, i)} << 16;
        ASSERT_EQ(pairs[i], want) << dtype_name(t) << " bytes " << int(a[i]) << ", " << int(b[i]);
        const float exact = load_as_float(a.data(), t, i) * format;
        ASSERT_TRUE(same_bits(bf16_bits_to_float(std::uint16_t(pairs[i] & 0xFFFF)), exact))
            << dtype_name(t) << " byte " << int(a[i]);
      }
      for (std::size_t i = a.size(); i < pairs.size(); ++i)
        ASSERT_EQ(pairs[i], 0xdeadbeefu) << "wrote past n";
    }
  });
  if (vbmi) {
    EXPECT_GE(targets_with_it, 1);
  }
}

TEST(ConvertRow, Fp8ToBf16RefusesOtherTypesAndLengths) {
  const std::vector<unsigned char> bytes(16, 0x38);
  constexpr auto kKeys = kernels::Fp8PairOrder::kKeys;
  std::vector<std::uint32_t> pairs(16, 0xdeadbeef);
  EXPECT_THROW(kernels::fp8_pairs_to_bf16_bits(bytes.data(), bytes.data(), DType::kINT8, kKeys,
                                               pairs.data(), 16),
               InvalidArgument);
  EXPECT_THROW(kernels::fp8_pairs_to_bf16_bits(bytes.data(), bytes.data(), DType::kFP8E4M3, kKeys,
                                               pairs.data(), 9),
               InvalidArgument);
  EXPECT_THROW(kernels::fp8_pairs_to_bf16_bits(bytes.data(), bytes.data(), DType::kFP8E5M2, kKeys,
                                               pairs.data(), -8),
               InvalidArgument);
  for (std::uint32_t x : pairs) EXPECT_EQ(x, 0xdeadbeefu);
}

// The writers' check (page_may_hold_nan) takes rows of any length: a NaN code
// at any position of the first n bytes is found, one just past them is not.
TEST(ConvertRow, E4M3NanCheckTakesAnyLength) {
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (std::int64_t n = 0; n <= 80; ++n) {
      std::vector<unsigned char> bytes(std::size_t(n) + 1, 0x7e);
      bytes[std::size_t(n)] = 0xff;
      ASSERT_FALSE(kernels::e4m3_has_nan(bytes.data(), n)) << "n = " << n;
      for (std::int64_t at = 0; at < n; ++at) {
        bytes[std::size_t(at)] = at % 2 ? 0x7f : 0xff;
        ASSERT_TRUE(kernels::e4m3_has_nan(bytes.data(), n)) << "n = " << n << ", at " << at;
        bytes[std::size_t(at)] = 0xfe;
      }
    }
  }
  const unsigned char byte = 0x7f;
  EXPECT_THROW(kernels::e4m3_has_nan(&byte, -1), InvalidArgument);
}

TEST(ConvertRow, E4M3DecodeStepsRefuseALengthThatIsNotAMultipleOf8) {
  const std::vector<unsigned char> bytes(16, 0x38);
  std::vector<float> out(16, -1.0f);
  EXPECT_THROW(kernels::e4m3_to_f32_nan_free(bytes.data(), out.data(), 9), InvalidArgument);
  EXPECT_THROW(kernels::e4m3_to_f32_nan_free(bytes.data(), out.data(), -8), InvalidArgument);
  for (float x : out) EXPECT_EQ(x, -1.0f);  // nothing written
}

// A small paged storage with its buffers.
struct Storage {
  Storage(DType dtype, KVLayout layout, std::int32_t pages, std::int32_t page_size,
          std::int32_t heads, std::int32_t dim, std::int32_t v_dim)
      : k(std::size_t(pages) * page_size * heads * dim * dtype_size(dtype), 0xab),
        v(std::size_t(pages) * page_size * heads * v_dim * dtype_size(dtype), 0xab),
        k_scales(std::size_t(pages) * page_size * heads, -1.0f),
        v_scales(k_scales.size(), -1.0f),
        view(PagedKVStorage::dense(k.data(), v.data(), dtype, layout, page_size, heads, dim, v_dim,
                                   pages)) {
    view.k_scale = 0.5f;
    view.v_scale = 0.25f;
    view.k_token_scales = k_scales.data();
    view.v_token_scales = v_scales.data();
  }
  std::vector<unsigned char> k, v;
  std::vector<float> k_scales, v_scales;
  PagedKVStorage view;
};

TEST(AppendPagedKv, WritesEachTokenToItsSlotInEveryDtype) {
  for (DType dtype :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8})
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (layout == KVLayout::kHND ? " HND" : " NHD"));
      Storage st(dtype, layout, 6, 5, 3, 16, 8);
      const std::int32_t tokens = 7;
      std::vector<float> k(tokens * 3 * 16), v(tokens * 3 * 8);
      std::mt19937 rng(3);
      pagedattn::test::NormalFloats normal;
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      const std::vector<std::int64_t> slots = {29, 0, -1, 7, 13, 4, 22};
      AppendParams p{{k.data(), DType::kF32, 48, 16},
                     {v.data(), DType::kF32, 24, 8},
                     slots.data(),
                     tokens,
                     st.view};
      append_paged_kv(p);
      for (std::int32_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        const std::int64_t page = slots[t] / 5, slot = slots[t] % 5;
        for (std::int32_t h = 0; h < 3; ++h) {
          const float* row = &k[(t * 3 + h) * 16];
          float amax = 0.0f;
          for (int d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(row[d]));
          const float scale =
              dtype == DType::kINT8 ? amax / 127.0f : (is_quantized(dtype) ? 0.5f : 1.0f);
          if (dtype == DType::kINT8) {
            EXPECT_EQ(st.k_scales[st.view.token_scale_index(page, h, slot)], scale);
          }
          for (int d = 0; d < 16; ++d) {
            std::vector<unsigned char> want(dtype_size(dtype));
            store_from_float(want.data(), dtype, 0, row[d] * (1.0f / scale));
            const std::size_t at = std::size_t(st.view.k_offset(page, h, slot) + d) * want.size();
            ASSERT_EQ(std::memcmp(want.data(), st.k.data() + at, want.size()), 0)
                << "token " << t << " head " << h << " dim " << d;
          }
        }
      }
    }
}

TEST(AppendPagedKv, RejectsBadSlotsBeforeWritingAnything) {
  Storage st(DType::kF16, KVLayout::kHND, 4, 4, 2, 8, 8);
  const std::vector<unsigned char> before = st.k;
  std::vector<float> k(3 * 2 * 8, 1.0f), v(k.size(), 2.0f);
  std::vector<std::int64_t> slots = {1, 16, 2};
  AppendParams p{
      {k.data(), DType::kF32, 16, 8}, {v.data(), DType::kF32, 16, 8}, slots.data(), 3, st.view};
  try {
    append_paged_kv(p);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("slot_mapping[1] = 16"));
  }
  slots = {1, 5, 1};
  EXPECT_THROW(append_paged_kv(p), InvalidArgument);
  slots = {1, -2, 3};
  EXPECT_THROW(append_paged_kv(p), InvalidArgument);
  EXPECT_EQ(st.k, before);
}

// RoPE in double, straight from SEMANTICS.md.
std::vector<double> rope_reference(const std::vector<float>& x, std::int32_t tokens,
                                   std::int32_t heads, std::int32_t dim,
                                   const std::vector<std::int32_t>& pos, const RopeConfig& c) {
  const std::int32_t r = c.rotary_dim ? c.rotary_dim : dim;
  std::vector<double> out(x.begin(), x.end());
  for (std::int32_t t = 0; t < tokens; ++t)
    for (std::int32_t h = 0; h < heads; ++h)
      for (std::int32_t i = 0; i < r / 2; ++i) {
        const double angle = pos[t] * rope_inv_freq(c, r, i), m = rope_attention_factor(c);
        const std::size_t base = std::size_t(t * heads + h) * dim;
        const std::size_t a = base + (c.style == RopeStyle::kNeox ? i : 2 * i);
        const std::size_t b = base + (c.style == RopeStyle::kNeox ? i + r / 2 : 2 * i + 1);
        out[a] = m * (x[a] * std::cos(angle) - x[b] * std::sin(angle));
        out[b] = m * (x[b] * std::cos(angle) + x[a] * std::sin(angle));
      }
  return out;
}

TEST(Rope, MatchesDoubleReferenceForStylesPartialDimsAndScaling) {
  const std::int32_t tokens = 5, heads = 3, dim = 64;
  const std::vector<std::int32_t> pos = {0, 1, 17, 4095, 32767};
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ})
    for (std::int32_t rotary : {0, 32})
      for (int scaling : {0, 1, 2, 3}) {  // none, llama3, yarn, frequency divisors
        RopeConfig c;
        c.style = style;
        c.rotary_dim = rotary;
        c.theta = 500000.0f;
        std::vector<float> divisors(std::size_t((rotary ? rotary : dim) / 2));
        for (std::size_t i = 0; i < divisors.size(); ++i) divisors[i] = 1.0f + 0.25f * float(i);
        if (scaling == 1) c.llama3 = {8.0f, 1.0f, 4.0f, 8192};
        if (scaling == 2) c.yarn = {4.0f, 4096};
        if (scaling == 3) c.freq_factors = divisors.data();
        std::vector<float> x(tokens * heads * dim);
        std::mt19937 rng(9);
        pagedattn::test::NormalFloats normal;
        for (float& e : x) e = normal(rng);
        const std::vector<double> want = rope_reference(x, tokens, heads, dim, pos, c);
        apply_rope({x.data(), DType::kF32, heads * dim, dim}, tokens, heads, dim, pos.data(), c);
        for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 2e-6) << i;
      }
}

// The model's call: a cos/sin table, and the query then the key heads of a
// fused q|k|v row (token stride beyond the heads), pairs past one 64-pair
// chunk, both styles, whole and partial rotary dims.
TEST(Rope, TableOnStridedHeadsMatchesDoubleReference) {
  const std::int32_t tokens = 3, heads = 5, dim = 192, stride = heads * dim + 2 * dim;
  const std::vector<std::int32_t> pos = {0, 7, 99};
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ})
    for (std::int32_t rotary : {0, 160}) {
      RopeConfig plain;
      plain.style = style;
      plain.rotary_dim = rotary;
      const std::int32_t half = (rotary ? rotary : dim) / 2, rows = 100;
      std::vector<float> cos_cache(std::size_t(rows) * half), sin_cache(cos_cache.size());
      for (std::int32_t p = 0; p < rows; ++p)
        for (std::int32_t i = 0; i < half; ++i)
          rope_cos_sin(plain, 2 * half, p, i, cos_cache[std::size_t(p * half + i)],
                       sin_cache[std::size_t(p * half + i)]);
      RopeConfig cached = plain;
      cached.cos_cache = cos_cache.data();
      cached.sin_cache = sin_cache.data();
      cached.cache_max_position = rows;
      std::vector<float> x(std::size_t(tokens) * stride);
      std::mt19937 rng(11);
      pagedattn::test::NormalFloats normal;
      for (float& e : x) e = normal(rng);
      std::vector<float> heads_only(std::size_t(tokens) * heads * dim);
      for (std::int32_t t = 0; t < tokens; ++t)
        std::copy_n(x.begin() + t * stride, heads * dim, heads_only.begin() + t * heads * dim);
      const std::vector<double> want = rope_reference(heads_only, tokens, heads, dim, pos, plain);
      const std::vector<float> before = x;
      apply_rope({x.data(), DType::kF32, stride, dim}, tokens, heads, dim, pos.data(), cached);
      for (std::int32_t t = 0; t < tokens; ++t) {
        for (std::int32_t i = 0; i < heads * dim; ++i)
          ASSERT_NEAR(x[std::size_t(t * stride + i)], want[std::size_t(t * heads * dim + i)], 2e-6)
              << "style " << int(style) << " rotary " << rotary << " token " << t << " at " << i;
        for (std::int32_t i = heads * dim; i < stride; ++i)  // past the heads: untouched
          ASSERT_EQ(x[std::size_t(t * stride + i)], before[std::size_t(t * stride + i)]);
      }
    }
}

TEST(Rope, Llama3ScalingHasThreeRegimes) {
  RopeConfig c;
  c.theta = 500000.0f;
  c.llama3 = {8.0f, 1.0f, 4.0f, 8192};
  const double plain0 = 1.0, plain_last = 1.0 / std::pow(500000.0, 126.0 / 128.0);
  EXPECT_DOUBLE_EQ(rope_inv_freq(c, 128, 0), plain0);             // high frequency: unchanged
  EXPECT_DOUBLE_EQ(rope_inv_freq(c, 128, 63), plain_last / 8.0);  // low frequency: / factor
  // Pair 32: wavelength 2 pi / 500000^-0.5 = 4443, between 8192 / 4 and 8192 / 1.
  const double mid = rope_inv_freq(c, 128, 32), plain_mid = 1.0 / std::pow(500000.0, 64.0 / 128.0);
  EXPECT_GT(mid, plain_mid / 8.0);
  EXPECT_LT(mid, plain_mid);
}

// Hugging Face's _compute_yarn_parameters written out for one config
// (rope_theta 1e6, head_dim 128, factor 4, original 32768: Qwen 2.5's
// long-context setting): correction dims floor(23.60) = 23 and
// ceil(39.65) = 40, a linear ramp between them, attention factor
// 0.1 ln 4 + 1.
TEST(Rope, YarnMatchesHuggingFaceFormula) {
  RopeConfig c;
  c.theta = 1e6f;
  c.yarn = {4.0f, 32768};
  const double pi = 3.14159265358979323846;
  const auto correction_dim = [&](double rotations) {
    return 128.0 * std::log(32768.0 / (rotations * 2.0 * pi)) / (2.0 * std::log(1e6));
  };
  const double low = std::floor(correction_dim(32.0)), high = std::ceil(correction_dim(1.0));
  EXPECT_EQ(low, 23.0);
  EXPECT_EQ(high, 40.0);
  for (std::int32_t t = 0; t < 64; ++t) {
    const double plain = 1.0 / std::pow(1e6, 2.0 * t / 128.0);
    const double ramp = std::clamp((t - low) / (high - low), 0.0, 1.0);
    const double extrapolation_share = 1.0 - ramp;
    const double want = plain / 4.0 * (1.0 - extrapolation_share) + plain * extrapolation_share;
    EXPECT_NEAR(rope_inv_freq(c, 128, t), want, 1e-15 * plain) << t;
  }
  EXPECT_DOUBLE_EQ(rope_attention_factor(c), 0.1 * std::log(4.0) + 1.0);
  c.yarn.attention_factor = 1.5f;
  EXPECT_DOUBLE_EQ(rope_attention_factor(c), 1.5);
  float cs, sn;
  rope_cos_sin(c, 128, 0, 0, cs, sn);  // angle 0: cos is the attention factor itself
  EXPECT_FLOAT_EQ(cs, 1.5f);
  EXPECT_FLOAT_EQ(sn, 0.0f);
}

TEST(Rope, FrequencyDivisorsAndBadScalingAreChecked) {
  RopeConfig c;
  const std::vector<float> divisors = {1.0f, 2.0f, 8.0f, 0.5f};
  c.freq_factors = divisors.data();
  for (std::int32_t t = 0; t < 4; ++t)
    EXPECT_DOUBLE_EQ(rope_inv_freq(c, 8, t), 1.0 / std::pow(10000.0, t / 4.0) / divisors[t]);
  std::vector<float> x(8, 1.0f);
  const std::int32_t pos = 3;
  const std::vector<float> bad = {1.0f, 0.0f, 1.0f, 1.0f};
  c.freq_factors = bad.data();
  try {
    apply_rope({x.data(), DType::kF32, 8, 8}, 1, 1, 8, &pos, c);
    ADD_FAILURE() << "a zero divisor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("freq_factors[1] = 0 must be finite and > 0"));
  }
  RopeConfig yarn;
  yarn.yarn = {0.5f, 4096};
  try {
    apply_rope({x.data(), DType::kF32, 8, 8}, 1, 1, 8, &pos, yarn);
    ADD_FAILURE() << "a yarn factor below 1 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("yarn scaling factor = 0.5"));
  }
  EXPECT_EQ(x, std::vector<float>(8, 1.0f));  // failed calls leave x as it was
}

TEST(Rope, CosSinCacheAndHalfPrecisionInputs) {
  const std::int32_t dim = 16, half = 8, max_pos = 50;
  std::vector<float> cos_cache(max_pos * half), sin_cache(max_pos * half);
  RopeConfig plain;
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      cos_cache[p * half + i] = float(std::cos(p * rope_inv_freq(plain, dim, i)));
      sin_cache[p * half + i] = float(std::sin(p * rope_inv_freq(plain, dim, i)));
    }
  RopeConfig cached;
  cached.cos_cache = cos_cache.data();
  cached.sin_cache = sin_cache.data();
  cached.cache_max_position = max_pos;
  std::vector<float> a(2 * dim), b;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.1f * float(i) - 1.0f;
  b = a;
  const std::vector<std::int32_t> pos = {3, 49};
  apply_rope({a.data(), DType::kF32, dim, dim}, 2, 1, dim, pos.data(), plain);
  apply_rope({b.data(), DType::kF32, dim, dim}, 2, 1, dim, pos.data(), cached);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  const std::vector<std::int32_t> too_far = {3, 50};
  EXPECT_THROW(apply_rope({b.data(), DType::kF32, dim, dim}, 2, 1, dim, too_far.data(), cached),
               InvalidArgument);
  std::vector<std::uint16_t> h(2 * dim);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16_bits(0.1f * float(i) - 1.0f);
  apply_rope({h.data(), DType::kBF16, dim, dim}, 2, 1, dim, pos.data(), plain);
  for (std::size_t i = 0; i < h.size(); ++i)
    EXPECT_NEAR(bf16_bits_to_float(h[i]), a[i], 1.6e-2) << i;
}

TEST(CopyPages, CopiesWithinAndBetweenStoragesIncludingInt8Scales) {
  Storage cache(DType::kINT8, KVLayout::kNHD, 5, 4, 2, 8, 8);
  Storage host(DType::kINT8, KVLayout::kNHD, 3, 4, 2, 8, 8);
  for (std::size_t i = 0; i < cache.k.size(); ++i) cache.k[i] = static_cast<unsigned char>(i * 7);
  for (std::size_t i = 0; i < cache.k_scales.size(); ++i) cache.k_scales[i] = float(i);
  const std::vector<std::pair<std::int64_t, std::int64_t>> cow = {{1, 3}};
  copy_pages(cache.view, cache.view, cow);
  const std::size_t page_bytes = 4 * 2 * 8;
  EXPECT_EQ(0, std::memcmp(&cache.k[3 * page_bytes], &cache.k[1 * page_bytes], page_bytes));
  EXPECT_EQ(cache.k_scales[3 * 8], cache.k_scales[1 * 8]);
  const std::vector<std::pair<std::int64_t, std::int64_t>> out = {{0, 2}, {4, 0}};
  copy_pages(cache.view, host.view, out);
  EXPECT_EQ(0, std::memcmp(&host.k[2 * page_bytes], &cache.k[0], page_bytes));
  EXPECT_EQ(0, std::memcmp(&host.k[0], &cache.k[4 * page_bytes], page_bytes));
  EXPECT_EQ(host.k_scales[2 * 8 + 5], cache.k_scales[5]);
}

TEST(CopyPages, RejectsConflictsAndMismatches) {
  Storage a(DType::kF16, KVLayout::kHND, 4, 4, 2, 8, 8);
  Storage b(DType::kBF16, KVLayout::kHND, 4, 4, 2, 8, 8);
  const std::vector<unsigned char> before = a.k;
  using Pairs = std::vector<std::pair<std::int64_t, std::int64_t>>;
  EXPECT_THROW(copy_pages(a.view, a.view, Pairs{{0, 1}, {2, 1}}), InvalidArgument);
  EXPECT_THROW(copy_pages(a.view, a.view, Pairs{{0, 1}, {1, 2}}), InvalidArgument);
  EXPECT_THROW(copy_pages(a.view, a.view, Pairs{{0, 4}}), InvalidArgument);
  EXPECT_THROW(copy_pages(a.view, b.view, Pairs{{0, 1}}), InvalidArgument);
  EXPECT_EQ(a.k, before);
}

}  // namespace
}  // namespace pagedattn
