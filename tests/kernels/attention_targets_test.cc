// Every Highway target this build compiled and this CPU runs, against the
// double-precision reference, on randomized shapes: decode, chunked and full
// prefill, causal and not, GQA, head dims with tails, page sizes, and every
// KV dtype, in deterministic mode and not. The kernel's dot-product paths
// (vdpbf16ps for prefill on KV of 16 bits or fewer and for decode on bf16,
// f16 and fp8 KV with bf16 products allowed, vpdpbusd for int8 decode with
// int8 products allowed) run only on AVX-512 targets whose CPU has the
// extension, and only there do their tolerances (attention_case.h) apply:
// every other target stays on f32 products with the options on.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention_case.h"
#include "kernels/cpu/product_paths.h"
#include "kernels/nan_flags.h"
#include "pagedattn/cpu_features.h"

namespace pagedattn::testing {
namespace {
namespace attention_targets_test {  // this file's own names in a unity batch

// --- cases -------------------------------------------------------------------------------

enum class Mode { kDecode, kChunkedPrefill, kPrefill };

// A small random case of `mode` with KV dtype `kv`: a few sequences, key
// counts with ragged tails (1, odd, a page and one, ...), work kept small
// for the double reference under ASan.
CaseSpec random_case(Mode mode, DType kv, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](auto... values) { return pick_one(rng, values...); };
  CaseSpec s;
  s.seed = seed;
  const int heads = pick(0, 1, 2, 3, 4);
  const std::int32_t qo[] = {8, 32, 12, 8, 16}, kvh[] = {8, 8, 2, 1, 2};  // MHA, GQA 4, 6, 8, 8
  s.num_qo_heads = qo[heads];
  s.num_kv_heads = kvh[heads];
  s.head_dim = pick(64, 128, 80, 96, 136, 40, 256, 20);  // 20: not a multiple of 8
  s.page_size = pick(1, 5, 16, 16, 32);
  s.kv_dtype = kv;
  // Queries and outputs as a model would pair them, sometimes another type.
  const DType natural = kv == DType::kF32   ? DType::kF32
                        : kv == DType::kF16 ? DType::kF16
                                            : DType::kBF16;
  s.q_dtype = pick(natural, natural, DType::kF32);
  s.o_dtype = pick(natural, natural, DType::kF32);
  s.per_head_fp8_scales = pick(false, true);
  s.options.causal = mode != Mode::kPrefill || pick(true, false);
  if (pick(0, 0, 0, 1)) s.options.scale = 0.3f;
  const int batch = mode == Mode::kDecode ? pick(1, 3, 6) : pick(1, 2);
  const std::int64_t budget = 250'000 / (std::int64_t{s.num_qo_heads} * s.head_dim) + 64;
  std::int64_t used = 0;
  for (int b = 0; b < batch; ++b) {
    std::int32_t kv_len = pick(1, 15, 17, 33, 97, 127, 300, 513);
    std::int32_t q_len = mode == Mode::kDecode    ? 1
                         : mode == Mode::kPrefill ? kv_len
                                                  : std::max(1, kv_len / pick(2, 3, 8));
    while (used + std::int64_t{kv_len} * q_len > budget && kv_len > 1) {
      kv_len = (kv_len + 1) / 2;
      q_len = std::min(q_len, kv_len);
      if (mode == Mode::kPrefill) q_len = kv_len;
    }
    used += std::int64_t{kv_len} * q_len;
    s.kv_lens.push_back(kv_len);
    s.q_lens.push_back(q_len);
  }
  return s;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Each mode x KV dtype, a few seeds, on every target. The seeds differ per
// target so that the targets together cover more shapes.
TEST(AttentionTargets, EveryTargetMatchesReferenceOnRandomShapes) {
  const DType kvs[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                       DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};
  const Mode modes[] = {Mode::kDecode, Mode::kChunkedPrefill, Mode::kPrefill};
  int targets_run = 0;
  for_each_highway_target([&](std::int64_t target) {
    const std::string name = lower(hwy::TargetName(target));
    if (dispatched_target_name() != name) {  // PAGEDATTN_MAX_TARGET is below it
      std::printf("skipping %s: dispatch is capped at %s\n", name.c_str(), max_target().c_str());
      return;
    }
    ++targets_run;
    const CpuFeatures used = dispatched_features();
    for (Mode mode : modes)
      for (DType kv : kvs)
        for (std::uint32_t k = 0; k < 2; ++k) {
          const std::uint32_t seed = static_cast<std::uint32_t>(targets_run) * 1000 +
                                     static_cast<std::uint32_t>(mode) * 100 +
                                     static_cast<std::uint32_t>(kv) * 10 + k;
          const CaseSpec spec = random_case(mode, kv, seed);
          const std::string what = name + " " + describe_case(spec);
          SCOPED_TRACE(what);
          AttentionCase c(spec);
          paged_attention_reference(c.params(0));
          // Split KV often; deterministic mode (a fixed chunk: every row on
          // the decode path), the default (prefill rows on the f32
          // outer-product path), bf16 products allowed (bf16 dot products
          // in prefill where the CPU has them) and int8 products allowed
          // (int8 dot products in int8 decode where the CPU has VNNI).
          struct Variant {
            std::int32_t fixed_chunk;
            bool bf16, int8, f16;
          };
          for (const Variant v : {Variant{32, false, false, false}, Variant{0, false, false, false},
                                  Variant{0, true, false, false}, Variant{0, false, true, false},
                                  Variant{0, false, false, true}}) {
            AttentionRunner runner(
                AttentionPlanOptions{2, v.fixed_chunk, 16, v.bf16, v.int8, v.f16, false, false});
            runner.run(c.params(1));
            const AttentionPlan& plan = runner.last_plan();
            const DotProducts allowed{plan.bf16_products, plan.int8_products, plan.f16_products};
            expect_rows_close(c, tolerance_for(spec, used, allowed),
                              what + " fixed chunk " + std::to_string(v.fixed_chunk) + " bf16 " +
                                  std::to_string(v.bf16) + " int8 " + std::to_string(v.int8) +
                                  " f16 " + std::to_string(v.f16));
            if (::testing::Test::HasFailure()) return;
          }
        }
  });
  EXPECT_GE(targets_run, 1);
}

// Output 1 (kernel) against output 0 (reference) where the reference has
// NaNs: NaN in the same elements and LSE, the other elements within `rel`
// of their row's largest finite value. Returns the rows with a NaN.
int ExpectTheReferencesNaNs(const AttentionCase& c, std::int32_t row_len, double rel,
                            const std::string& what) {
  const std::vector<float> want = c.output(0), got = c.output(1);
  const std::size_t n = std::size_t(row_len);
  int nan_rows = 0;
  for (std::size_t r = 0; r * n < want.size(); ++r) {
    float row_max = 0.0f;
    bool row_nan = false;
    for (std::size_t i = r * n; i < (r + 1) * n; ++i) {
      row_nan |= std::isnan(want[i]);
      if (!std::isnan(want[i])) row_max = std::max(row_max, std::fabs(want[i]));
    }
    nan_rows += row_nan;
    EXPECT_EQ(std::isnan(c.lse(1)[r]), std::isnan(c.lse(0)[r])) << what << " row " << r;
    for (std::size_t i = r * n; i < (r + 1) * n; ++i) {
      EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i]))
          << what << " row " << r << " element " << i - r * n;
      if (!std::isnan(want[i])) {
        EXPECT_NEAR(got[i], want[i], rel * row_max + 1e-6) << what << " row " << r;
      }
      if (::testing::Test::HasFailure()) return nan_rows;
    }
  }
  return nan_rows;
}

// Two decode sequences (97 and 40 keys, one token each) over 2 KV heads of
// `group` query heads: the cases of the tests that poison single elements.
CaseSpec TwoSequenceDecode(DType kv, std::int32_t group, std::uint32_t seed) {
  CaseSpec spec;
  spec.seed = seed;
  spec.kv_dtype = kv;
  spec.num_kv_heads = 2;
  spec.num_qo_heads = 2 * group;
  spec.kv_lens = {97, 40};
  spec.q_lens = {1, 1};
  return spec;
}

// Where K (value false) or V element `dim` of key `key` of sequence `seq`,
// KV head `head`, is stored.
void* KVElement(const AttentionParams& p, bool value, std::int32_t seq, std::int32_t key,
                std::int32_t head, std::int32_t dim) {
  const PagedKVTable& t = p.table;
  const std::int32_t page = t.kv_indices[t.kv_indptr[seq] + key / t.page_size],
                     slot = key % t.page_size;
  const std::int64_t at =
      (value ? p.kv.v_offset(page, head, slot) : p.kv.k_offset(page, head, slot)) + dim;
  return static_cast<std::byte*>(value ? p.kv.v_data : p.kv.k_data) +
         at * std::int64_t(dtype_size(p.kv.dtype));
}

// e4m3 decode converts a block in registers without mapping NaN codes when
// the block has none (HasE4M3Nan): a NaN code (S.1111.111) in one K or V
// element must still give NaN exactly where the reference does (a K NaN
// makes the rows of its KV head and their LSE NaN, a V NaN one output
// element of them), and the other rows the reference's values. NaN codes in K, in V, in both,
// in the first, a middle and the last block of a sequence (the tail block),
// on every target, GQA 1 and 4, head dims 128 and 80 (tails). With no code
// placed, HasE4M3Nan must not see one: the rows all stay finite. The same
// with page_may_hold_nan flags (kernels::page_holds_e4m3_nan of each page,
// as the writers set them), which the kernel then reads instead of the
// bytes; and with every flag clear over a placed code (a writer that broke
// the contract), which must decode without the NaN map (every row finite):
// the proof that the flags, not the bytes, decided.
enum class NanFlags { kNone, kSet, kClear };

// page_may_hold_nan for the pages of `kv`: as the writers set them
// (kernels::page_holds_e4m3_nan of each page) for kSet, all clear otherwise.
std::vector<std::uint8_t> PageNanFlags(const PagedKVStorage& kv, NanFlags flags) {
  std::vector<std::uint8_t> page_flags(std::size_t(kv.num_pages), 0);
  for (std::int64_t page = 0; flags == NanFlags::kSet && page < kv.num_pages; ++page)
    page_flags[std::size_t(page)] = kernels::page_holds_e4m3_nan(kv, page);
  return page_flags;
}

// The cases above, run with `options` (on the dispatched target, named
// `target`), compared with the reference within `tolerance`.
void ExpectE4M3NanCodesGiveTheReferencesNaNs(const std::string& target,
                                             const AttentionPlanOptions& options,
                                             double tolerance) {
  for (std::uint32_t seed = 0; seed < 36; ++seed) {
    const auto flags = static_cast<NanFlags>(seed / 12);
    CaseSpec spec = TwoSequenceDecode(DType::kFP8E4M3, seed % 2 ? 4 : 1, seed);
    spec.head_dim = seed % 3 ? 128 : 80;
    spec.page_size = seed % 4 ? 16 : 5;
    spec.per_head_fp8_scales = true;
    AttentionCase c(spec);
    AttentionParams ref = c.params(0);
    const std::int32_t where = seed % 4;                        // 0: none; 1: K; 2: V; 3: both
    const std::int32_t key = std::int32_t(seed % 12 / 4) * 48;  // block 0, 1 or 3 of seq 0
    if (where & 1) *static_cast<std::uint8_t*>(KVElement(ref, false, 0, key, 1, 7)) = 0x7F;
    if (where & 2) *static_cast<std::uint8_t*>(KVElement(ref, true, 0, key, 1, 7)) = 0xFF;
    paged_attention_reference(ref);
    AttentionParams p = c.params(1);
    std::vector<std::uint8_t> page_flags = PageNanFlags(p.kv, flags);
    if (flags != NanFlags::kNone) p.kv.page_may_hold_nan = page_flags.data();
    AttentionRunner(options).run(p);
    const std::string what = target + " seed " + std::to_string(seed);
    if (flags == NanFlags::kClear) {
      for (float x : c.output(1)) ASSERT_TRUE(std::isfinite(x)) << what;
      continue;
    }
    const int nan_rows = ExpectTheReferencesNaNs(c, spec.head_dim, tolerance, what);
    if (::testing::Test::HasFailure()) return;
    EXPECT_EQ(nan_rows == 0, where == 0) << what;
  }
}

TEST(AttentionTargets, E4M3NanCodesGiveTheReferencesNaNsInDecode) {
  for_each_highway_target([&](std::int64_t target) {
    const std::string name = lower(hwy::TargetName(target));
    if (dispatched_target_name() != name) return;
    ExpectE4M3NanCodesGiveTheReferencesNaNs(name,
                                            AttentionPlanOptions{.num_threads = 2,
                                                                 .fp8_fast_products = false,
                                                                 .fast_prefill_products = false,
                                                                 .measured_products = false},
                                            1e-3);
  });
}

// Switches dot-product extensions off for a scope (set_disabled_features).
struct DisabledFeatures {
  explicit DisabledFeatures(const char* names) { set_disabled_features(names); }
  ~DisabledFeatures() { set_disabled_features(""); }
  DisabledFeatures(const DisabledFeatures&) = delete;
  DisabledFeatures& operator=(const DisabledFeatures&) = delete;
};

// A decode case of 4 sequences (1, 33, 97 and `longest` keys) for the
// dot-product paths' tests: 2 KV heads of `group` query heads, q in q_dtype,
// f32 outputs (the paths' differences stay visible), per-head fp8 scales at
// even group sizes.
CaseSpec DecodeGroupCase(DType kv, std::int32_t group, std::uint32_t seed, std::int32_t head_dim,
                         std::int32_t page, std::int32_t longest, DType q_dtype) {
  CaseSpec spec;
  spec.seed = seed;
  spec.num_kv_heads = 2;
  spec.num_qo_heads = 2 * group;
  spec.head_dim = head_dim;
  spec.page_size = page;
  spec.kv_dtype = kv;
  spec.q_dtype = q_dtype;
  spec.o_dtype = DType::kF32;
  spec.per_head_fp8_scales = group % 2 == 0;
  spec.kv_lens = {1, 33, 97, longest};
  spec.q_lens = {1, 1, 1, 1};
  return spec;
}

// Decode over bf16, f16 and fp8 KV with bf16 products allowed runs on vdpbf16ps
// where the CPU has AVX512-BF16 and VBMI (bf16_decode_kernel; the test takes
// the path without timing it, measured_products = false, and switches AMX
// off, as it did when CPUs with AMX kept decode on f32): within the dot-product
// tolerance of the reference, and not the f32 path's bits. GQA 1 to 8
// (every row grouping of the micro-kernels), head dims with masked tails
// of 8, 16 and 24 (40, 136; 80; 120), pages of 1 to 32, odd key counts,
// per-head fp8 scales.
TEST(AttentionTargets, Bf16DecodeRunsOnDotProductsWithinTolerance) {
  const DisabledFeatures no_amx("amx_bf16");
  const CpuFeatures used = dispatched_features();
  if (!(used.avx512f && used.avx512_bf16 && used.avx512_vbmi))
    GTEST_SKIP() << "no AVX512-BF16 and AVX512-VBMI at the dispatched target";
  const std::int32_t dims[] = {128, 40, 80, 136, 64, 256, 120};
  const std::int32_t pages[] = {1, 5, 16, 32};
  std::uint32_t seed = 7000;
  for (DType kv : {DType::kBF16, DType::kF16, DType::kFP8E4M3, DType::kFP8E5M2})
    for (std::int32_t group = 1; group <= 8; ++group) {
      ++seed;
      const CaseSpec spec =
          DecodeGroupCase(kv, group, seed, dims[seed % 7], pages[seed % 4], 130, DType::kBF16);
      const std::string what = describe_case(spec);
      SCOPED_TRACE(what);
      AttentionCase c(spec);
      paged_attention_reference(c.params(0));
      AttentionRunner(AttentionPlanOptions{.bf16_products = false,
                                           .fp8_fast_products = false,
                                           .fast_prefill_products = false,
                                           .measured_products = false})
          .run(c.params(1));
      const std::vector<float> f32_path = c.output(1);
      AttentionRunner(AttentionPlanOptions{.bf16_products = true,
                                           .fp8_fast_products = false,
                                           .fast_prefill_products = false,
                                           .measured_products = false})
          .run(c.params(1));
      expect_rows_close(c, tolerance_for(spec, used, {.bf16 = true}), what);
      EXPECT_NE(c.output(1), f32_path) << "bf16 products gave the f32 path's bits";
      if (::testing::Test::HasFailure()) return;
    }
}

// --- the f16 decode path ---------------------------------------------------------------

bool has_f16_decode(const CpuFeatures& used) {
  return used.avx512f && used.avx512_fp16;
}

// e4m3 and f16 decode with f16 products allowed runs on AVX512-FP16
// multiply-adds where the CPU has them: within kF16DotRowTolerance of the
// reference, and not the f32 path's bits. GQA 1 to 8 (every row grouping
// of the micro-kernels), every head dim the path takes up to 256 (and 80,
// which keeps f32 products), pages of 1 to 32, odd key counts, per-head
// scales, the default scale and 0.3 (a wider spread of logits). Prints the
// largest error it saw (the figure beside kF16DotRowTolerance).
TEST(AttentionTargets, F16DecodeRunsOnF16ProductsWithinTolerance) {
  const CpuFeatures used = dispatched_features();
  if (!has_f16_decode(used)) GTEST_SKIP() << "no AVX512-FP16 at the dispatched target";
  const std::int32_t dims[] = {128, 32, 64, 96, 80, 256, 160};
  const std::int32_t pages[] = {1, 5, 16, 32};
  std::uint32_t seed = 9000;
  double worst = 0.0;
  for (const DType kv : {DType::kFP8E4M3, DType::kF16})
    for (std::int32_t group = 1; group <= 8; ++group)
      for (int variant = 0; variant < 4; ++variant) {
        ++seed;
        CaseSpec spec = DecodeGroupCase(kv, group, seed, dims[seed % 7], pages[seed % 4], 530,
                                        variant % 2 ? DType::kF32 : DType::kBF16);
        if (variant >= 2) spec.options.scale = 0.3f;
        const std::string what = describe_case(spec);
        SCOPED_TRACE(what);
        AttentionCase c(spec);
        paged_attention_reference(c.params(0));
        AttentionRunner(AttentionPlanOptions{.f16_products = false,
                                             .fp8_fast_products = false,
                                             .fast_prefill_products = false,
                                             .measured_products = false})
            .run(c.params(1));
        const std::vector<float> f32_path = c.output(1);
        AttentionRunner(AttentionPlanOptions{.f16_products = true,
                                             .fp8_fast_products = false,
                                             .fast_prefill_products = false,
                                             .measured_products = false})
            .run(c.params(1));
        expect_rows_close(c, tolerance_for(spec, used, {.f16 = true}), what);
        worst = std::max(worst, largest_row_error(c));
        const std::vector<float> got = c.output(1);
        if (spec.head_dim == 80)
          EXPECT_EQ(got, f32_path) << "head dim 80 left the f32 path";
        else
          EXPECT_NE(got, f32_path) << "f16 products gave the f32 path's bits";
        if (::testing::Test::HasFailure()) return;
      }
  std::printf("largest f16-products error: %.2e of the row maximum\n", worst);
}

// f16 blocks the path cannot take keep f32 products: a K element of 60000
// against queries of ones (each product overflows f16; the reference's
// scores are finite), and single elements past the V bound or infinite or
// NaN in K or V give the reference's result (NaNs where it has them).
TEST(AttentionTargets, F16DecodeKeepsF16BlocksPastItsBoundsOnF32) {
  const CpuFeatures used = dispatched_features();
  if (!has_f16_decode(used)) GTEST_SKIP() << "no AVX512-FP16 at the dispatched target";
  CaseSpec spec = TwoSequenceDecode(DType::kF16, 4, 1);
  spec.head_dim = 128;
  {
    AttentionCase c(spec);
    AttentionParams p = c.params(0);
    auto* q = const_cast<float*>(static_cast<const float*>(p.q.data));
    std::fill_n(q, std::size_t(spec.num_qo_heads) * std::size_t(spec.head_dim),
                1.0f);  // sequence 0's token
    for (std::int32_t d = 0; d < spec.head_dim; ++d)
      *static_cast<std::uint16_t*>(KVElement(p, false, 0, 50, 1, d)) = float_to_f16_bits(60000.0f);
    paged_attention_reference(p);
    AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                         .f16_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    expect_rows_close(c, tolerance_for(spec, used, {.f16 = true}),
                      "K 60000 against queries of ones");
  }
  struct Poison {
    bool value;
    float x;
  };
  for (const Poison poison :
       {Poison{false, 80.0f}, Poison{true, 3000.0f}, Poison{false, INFINITY}, Poison{true, NAN}}) {
    AttentionCase c(spec);
    AttentionParams ref = c.params(0);
    *static_cast<std::uint16_t*>(KVElement(ref, poison.value, 0, 40, 1, 3)) =
        float_to_f16_bits(poison.x);
    paged_attention_reference(ref);
    AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                         .f16_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    ExpectTheReferencesNaNs(c, spec.head_dim, kF16DotRowTolerance,
                            std::string(poison.value ? "V " : "K ") + std::to_string(poison.x));
    if (::testing::Test::HasFailure()) return;
  }
}

// Blocks holding an e4m3 NaN code keep f32 products (the f16 conversion
// would read the code as 1.875): the reference's NaNs, with f16 products
// allowed. Queries that are not finite keep the whole item on f32 products:
// the same bits as with f16 products off.
TEST(AttentionTargets, F16DecodeKeepsNaNBlocksAndNonFiniteQueriesOnF32) {
  const CpuFeatures used = dispatched_features();
  if (!has_f16_decode(used)) GTEST_SKIP() << "no AVX512-FP16 at the dispatched target";
  for (std::uint32_t seed = 0; seed < 8; ++seed) {
    CaseSpec spec = TwoSequenceDecode(DType::kFP8E4M3, seed % 2 ? 4 : 1, seed);
    spec.per_head_fp8_scales = true;
    AttentionCase c(spec);
    AttentionParams ref = c.params(0);
    const std::int32_t key = std::int32_t(seed / 2) * 32 % 97;
    *static_cast<std::uint8_t*>(KVElement(ref, seed % 2 == 0, 0, key, 1, 5)) =
        seed % 2 ? 0xFF : 0x7F;
    paged_attention_reference(ref);
    AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                         .f16_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    ExpectTheReferencesNaNs(c, spec.head_dim, kF16DotRowTolerance, "seed " + std::to_string(seed));
    if (::testing::Test::HasFailure()) return;
  }
  const CaseSpec spec = TwoSequenceDecode(DType::kFP8E4M3, 4, 1);
  for (const float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    AttentionCase c(spec);
    const_cast<float*>(static_cast<const float*>(c.params(0).q.data))[3] =
        bad;  // sequence 0, head 0
    AttentionRunner(AttentionPlanOptions{.num_threads = 1,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(0));
    AttentionRunner(AttentionPlanOptions{.num_threads = 1,
                                         .f16_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    // Sequence 0's token (its item) keeps f32 products, sequence 1's not.
    const std::vector<float> off = c.output(0), on = c.output(1);
    const std::size_t token = std::size_t(spec.num_qo_heads) * std::size_t(spec.head_dim);
    ASSERT_EQ(off.size(), 2 * token);
    EXPECT_EQ(std::memcmp(off.data(), on.data(), token * sizeof(float)), 0)
        << "query element " << bad;
    EXPECT_NE(std::memcmp(off.data() + token, on.data() + token, token * sizeof(float)), 0)
        << "query element " << bad;
  }
}

// The f16 path (e4m3 decode's fast products on AVX512-FP16) skips the probe
// of a block's bytes when its pages' flags say no NaN code was written, and
// probes them otherwise: the cases of E4M3NanCodesGiveTheReferencesNaNsInDecode
// on f16 products, where a code under clear flags must decode finite.
TEST(AttentionTargets, F16DecodeReadsTheE4M3PagesNanFlags) {
  if (!has_f16_decode(dispatched_features()))
    GTEST_SKIP() << "no AVX512-FP16 at the dispatched target";
  ExpectE4M3NanCodesGiveTheReferencesNaNs(dispatched_target_name(),
                                          AttentionPlanOptions{.num_threads = 2,
                                                               .f16_products = true,
                                                               .fp8_fast_products = false,
                                                               .fast_prefill_products = false,
                                                               .measured_products = false},
                                          kF16DotRowTolerance);
}

// One block of keys (20) whose KV head 1 holds an e4m3 NaN code in K. With
// its pages flagged, the f16 path's probe finds the code and the head keeps
// f32 products: the f32 run's bits (NaN). With the flags clear (a writer
// that broke the contract) the f16 path skips the probe and runs the head on
// f16 products: finite, and not the f32 run's bits. Head 0 takes the f16
// path either way.
TEST(AttentionTargets, F16DecodeSkipsTheProbeOfE4M3PagesFlaggedFreeOfNan) {
  if (!has_f16_decode(dispatched_features()))
    GTEST_SKIP() << "no AVX512-FP16 at the dispatched target";
  constexpr std::int32_t kGroup = 4, kDim = 128;
  CaseSpec spec = TwoSequenceDecode(DType::kFP8E4M3, kGroup, 5);
  spec.kv_lens = {20};
  spec.q_lens = {1};
  spec.head_dim = kDim;
  spec.o_dtype = DType::kF32;
  for (const NanFlags flags : {NanFlags::kSet, NanFlags::kClear}) {
    AttentionCase c(spec);
    AttentionParams f32 = c.params(0), f16 = c.params(1);
    *static_cast<std::uint8_t*>(KVElement(f32, false, 0, 11, 1, 7)) = 0x7F;
    std::vector<std::uint8_t> page_flags = PageNanFlags(f32.kv, flags);
    f32.kv.page_may_hold_nan = f16.kv.page_may_hold_nan = page_flags.data();
    AttentionPlanOptions options{.num_threads = 2,
                                 .fp8_fast_products = false,
                                 .fast_prefill_products = false,
                                 .measured_products = false};
    AttentionRunner(options).run(f32);
    options.f16_products = true;
    AttentionRunner(options).run(f16);
    const std::vector<float> want = c.output(0), got = c.output(1);
    const std::size_t head = std::size_t(kGroup) * kDim;  // a KV head's rows
    ASSERT_EQ(got.size(), 2 * head);
    EXPECT_NE(std::memcmp(want.data(), got.data(), head * sizeof(float)), 0) << "head 0";
    const bool same = std::memcmp(want.data() + head, got.data() + head, head * sizeof(float)) == 0;
    if (flags == NanFlags::kSet) {
      EXPECT_TRUE(same) << "flagged: the probe must send head 1 to f32 products";
      EXPECT_TRUE(std::isnan(got[head])) << "flagged: the code is a NaN";
    } else {
      EXPECT_FALSE(same) << "flags clear: head 1 must run on f16 products";
      for (float x : got) ASSERT_TRUE(std::isfinite(x)) << "flags clear";
    }
  }
}

// The tolerance is not so loose that a kernel reading the wrong keys passes:
// the reference on a neighbouring case (other keys) fails it.
TEST(AttentionTargets, ToleranceRejectsWrongKeys) {
  const CaseSpec spec = random_case(Mode::kDecode, DType::kINT8, 42);
  CaseSpec other = spec;
  other.seed = 43;
  AttentionCase a(spec), b(other);
  paged_attention_reference(a.params(0));
  paged_attention_reference(b.params(0));
  const std::vector<float> want = a.output(0), wrong = b.output(0);
  // The loosest: the int8 allowance at the largest logit spread of the
  // random cases (scale 0.3, head dim 256).
  CaseSpec widest = spec;
  widest.head_dim = 256;
  widest.options.scale = 0.3f;
  const RowTolerance tol{output_row_tolerance(spec.o_dtype) + int8_dot_row_tolerance(widest), 0.0};
  const std::size_t dim = static_cast<std::size_t>(spec.head_dim);
  int rows_failing = 0;
  for (std::size_t row = 0; row * dim < want.size(); ++row) {
    const auto [err, scale] = row_error(want, wrong, row, dim);
    rows_failing += err > tol.row * scale + 1e-6;
  }
  EXPECT_EQ(rows_failing * dim, want.size()) << "the largest tolerance accepts unrelated outputs";
}

// --- the int8 dot-product path -------------------------------------------------------------

bool has_int8_dot(const CpuFeatures& used) {
  return used.avx512f && used.avx512_vnni;
}

// The outputs of a case run with int8 products off (output 0) and on (1).
void run_with_and_without_int8(AttentionCase& c) {
  AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                       .fp8_fast_products = false,
                                       .fast_prefill_products = false,
                                       .measured_products = false})
      .run(c.params(0));
  AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                       .int8_products = true,
                                       .fp8_fast_products = false,
                                       .fast_prefill_products = false,
                                       .measured_products = false})
      .run(c.params(1));
}

// Int8 decode with int8 products allowed: on a VNNI machine the path is
// taken (outputs differ from the f32 path's bits, within the allowance of
// the reference); elsewhere, and for shapes it does not take (head dims
// not multiples of 64, inline key RoPE, prefill rows), the bits are the
// f32 path's.
TEST(AttentionInt8Dot, TakenOnVnniWithinTolerance) {
  const CpuFeatures used = dispatched_features();
  struct Shape {
    std::int32_t head_dim;
    int key_rope;
    std::int32_t q_len;
    bool taken;
  };
  for (const Shape shape : {Shape{128, 0, 1, true}, Shape{64, 0, 2, true}, Shape{80, 0, 1, false},
                            Shape{128, 1, 1, false}, Shape{128, 0, 40, false}}) {
    CaseSpec spec;
    spec.q_lens = {shape.q_len, shape.q_len, shape.q_len};
    spec.kv_lens = {300, 77, 1000};
    spec.num_qo_heads = 32;
    spec.num_kv_heads = 8;
    spec.head_dim = shape.head_dim;
    spec.kv_dtype = DType::kINT8;
    spec.key_rope = shape.key_rope;
    SCOPED_TRACE(describe_case(spec));
    AttentionCase c(spec);
    run_with_and_without_int8(c);
    const bool taken = shape.taken && has_int8_dot(used);
    const std::vector<float> f32 = c.output(0), int8 = c.output(1);
    if (taken) {
      EXPECT_NE(f32, int8) << "int8 products allowed on a VNNI CPU, yet the f32 path's bits";
      paged_attention_reference(c.params(0));
      expect_rows_close(c, tolerance_for(spec, used, {false, true}), "int8 products");
    } else {
      EXPECT_EQ(f32, int8) << "int8 products changed a shape the int8 path does not take";
    }
  }
  if (!has_int8_dot(used))
    GTEST_SKIP() << "no AVX512-VNNI at the dispatched target: the path is not taken";
}

// Tails: key counts not multiples of 4 or of the 32-key block, pages of 1,
// 5 and 16 slots, 1 to 8 rows per KV head (GQA 1-8, and 2 tokens x GQA 4
// of speculative decoding), V head dims other than K's, with masks, ALiBi,
// softcap and sinks.
TEST(AttentionInt8Dot, TailsMatchReference) {
  const CpuFeatures used = dispatched_features();
  std::mt19937 rng(2024);
  auto pick = [&](auto... values) { return pick_one(rng, values...); };
  for (std::uint32_t seed = 0; seed < 24; ++seed) {
    CaseSpec spec;
    spec.seed = seed;
    spec.kv_dtype = DType::kINT8;
    spec.num_kv_heads = pick(1, 2, 8);
    const std::int32_t group = std::int32_t(seed % 8) + 1;
    spec.num_qo_heads = spec.num_kv_heads * group;
    spec.head_dim = pick(64, 128, 256);
    spec.v_head_dim = pick(0, 0, 64);  // 0: head_dim
    spec.page_size = pick(1, 5, 16);
    spec.q_dtype = spec.o_dtype = pick(DType::kF32, DType::kBF16);
    const std::int32_t q_len = group <= 4 ? pick(1, 2) : 1;
    for (int b = 0; b < 3; ++b) {
      spec.kv_lens.push_back(pick(1, 3, 5, 31, 33, 63, 67, 130));
      spec.q_lens.push_back(std::min(q_len, spec.kv_lens.back()));
    }
    spec.options.window_left = pick(-1, -1, 20);
    spec.options.softcap = pick(0.0f, 0.0f, 30.0f);
    spec.alibi = pick(false, true);
    spec.sinks = pick(false, true);
    SCOPED_TRACE(describe_case(spec));
    AttentionCase c(spec);
    paged_attention_reference(c.params(0));
    AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                         .int8_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    expect_rows_close(c, tolerance_for(spec, used, {false, true}), "int8 products, tails");
    if (::testing::Test::HasFailure()) return;
  }
}

// A NaN int8 token scale in K makes the rows of its KV head NaN, one in V
// their outputs (as the reference gives them), on the f32 path and with
// int8 products (vpdpbusd where the CPU has VNNI: the block's weights are
// quantised against their largest, which a NaN weight must not hide).
TEST(AttentionInt8Dot, NanTokenScalesGiveTheReferencesNaNs) {
  const CpuFeatures used = dispatched_features();
  for (std::uint32_t seed = 0; seed < 8; ++seed) {
    CaseSpec spec = TwoSequenceDecode(DType::kINT8, 4, seed);
    spec.head_dim = 128;
    AttentionCase c(spec);
    AttentionParams ref = c.params(0);
    const PagedKVTable& t = ref.table;
    const std::int32_t key = std::int32_t(seed / 2) * 31;  // blocks 0-2 of sequence 0
    const std::int32_t page = t.kv_indices[t.kv_indptr[0] + key / spec.page_size];
    const std::int64_t at = ref.kv.token_scale_index(page, 1, key % spec.page_size);
    (seed % 2 ? ref.kv.v_token_scales : ref.kv.k_token_scales)[at] =
        std::numeric_limits<float>::quiet_NaN();
    paged_attention_reference(ref);
    const bool products = seed % 4 >= 2;
    AttentionRunner(AttentionPlanOptions{.num_threads = 2,
                                         .int8_products = products,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
    const double rel = products && has_int8_dot(used) ? int8_dot_row_tolerance(spec) + 1e-3 : 1e-3;
    const std::string what = "seed " + std::to_string(seed) + (seed % 2 ? " V" : " K") +
                             " scale, int8 products " + std::to_string(products);
    EXPECT_EQ(ExpectTheReferencesNaNs(c, spec.head_dim, rel, what), 4) << what;
    if (::testing::Test::HasFailure()) return;
  }
}

// Prefill with bf16 products on AMX tiles (CPUs with AMX-BF16, head dims
// multiples of 32) against the reference at the bf16 allowance, and against
// the vdpbf16ps path (AMX switched off), which rounds the same queries and
// values the same way. The weights differ: the tiles take the softmax over
// a step of 256 keys, vdpbf16ps over each block of 32, so each path rounds
// exp(s - m) to bf16 against its own running maximum m (2^-9 of each weight
// apiece). The two then agree to kAmxAgainstDotTolerance of a row's largest
// output - a quarter of the reference allowance, and a tile reading the
// wrong rows, keys or dims is off by the output's own size.
// Rows per KV head from 9 (no whole tile: every row on the left-over path)
// to 8 tiles, GQA 1 to 8, V head dims other than K's, pages of 1
// to 32, keys from 9 (one partial block) to 513 (2 whole steps and a key),
// masks (causal, window, softcap, ALiBi, sinks), per-token and per-head
// scales (int8, fp8).
TEST(AttentionAmx, PrefillTilesMatchReferenceAndTheDotProductPath) {
  const CpuFeatures used = dispatched_features();
  if (!used.amx_bf16) GTEST_SKIP() << "no AMX-BF16 at the dispatched target";
  struct Shape {
    std::int32_t group, head_dim, v_head_dim, q_len, kv_len, page;
  };
  // Rows per KV head (q_len x group) from 9 to 128: one prefill tile, so
  // that no row of either run takes a decode path (with AMX switched off,
  // decode rows would run on vdpbf16ps: bf16_decode_kernel).
  const Shape shapes[] = {{1, 64, 64, 9, 9, 16},      {4, 128, 128, 13, 77, 16},
                          {8, 128, 128, 15, 300, 5},  {2, 96, 96, 40, 40, 1},
                          {6, 256, 256, 11, 130, 32}, {4, 64, 128, 16, 97, 16},
                          {1, 128, 80, 70, 513, 16},  {3, 32, 32, 40, 50, 7}};
  const DType kvs[] = {DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kINT8};
  std::uint32_t seed = 9100;
  for (const Shape& sh : shapes)
    for (DType kv : kvs) {
      CaseSpec spec;
      spec.seed = ++seed;
      spec.num_kv_heads = 2;
      spec.num_qo_heads = 2 * sh.group;
      spec.head_dim = sh.head_dim;
      spec.v_head_dim = sh.v_head_dim == sh.head_dim ? 0 : sh.v_head_dim;
      spec.page_size = sh.page;
      spec.kv_dtype = kv;
      spec.q_dtype = kv == DType::kF16 ? DType::kF16 : DType::kBF16;
      spec.o_dtype = DType::kF32;  // the paths' differences stay visible
      spec.per_head_fp8_scales = seed % 2 == 0;
      spec.options.causal = seed % 3 != 0;
      if (seed % 4 == 1) spec.options.window_left = 23;
      if (seed % 5 == 2) spec.options.softcap = 30.0f;
      spec.alibi = seed % 7 == 3;
      spec.sinks = seed % 3 == 1;
      spec.q_lens = {sh.q_len, sh.q_len};
      spec.kv_lens = {sh.kv_len, std::max(sh.q_len, sh.kv_len / 3)};
      const std::string what = describe_case(spec);
      SCOPED_TRACE(what);
      AttentionCase c(spec);
      paged_attention_reference(c.params(0));
      AttentionRunner amx(AttentionPlanOptions{.bf16_products = true,
                                               .fp8_fast_products = false,
                                               .fast_prefill_products = false,
                                               .measured_products = false});
      amx.run(c.params(1));
      expect_rows_close(c, tolerance_for(spec, used, {.bf16 = true}), what + " (AMX)");
      const std::vector<float> tiles = c.output(1);
      {
        const DisabledFeatures off("amx_bf16");
        AttentionRunner(AttentionPlanOptions{.bf16_products = true,
                                             .fp8_fast_products = false,
                                             .fast_prefill_products = false,
                                             .measured_products = false})
            .run(c.params(1));
      }
      const std::vector<float> dot = c.output(1);
      const std::size_t dim = std::size_t(sh.v_head_dim);
      for (std::size_t row = 0; row * dim < dot.size(); ++row) {
        double err = 0.0, scale = 0.0;
        for (std::size_t i = row * dim; i < (row + 1) * dim; ++i) {
          err = std::max(err, double(std::fabs(tiles[i] - dot[i])));
          scale = std::max(scale, double(std::fabs(dot[i])));
        }
        constexpr double kAmxAgainstDotTolerance =
            8e-3;  // 2 x 2^-9 per weight, with room for cancellation
        ASSERT_LE(err, kAmxAgainstDotTolerance * scale + 1e-6)
            << what << " row " << row << ": AMX against vdpbf16ps";
      }
      if (::testing::Test::HasFailure()) return;
    }
}

// bf16 K/V and queries, heads 8x2, head dim 128, causal.
CaseSpec bf16_gqa4_case(std::vector<std::int32_t> q_lens, std::vector<std::int32_t> kv_lens) {
  CaseSpec spec;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 128;
  spec.kv_dtype = DType::kBF16;
  spec.q_dtype = DType::kBF16;
  spec.q_lens = std::move(q_lens);
  spec.kv_lens = std::move(kv_lens);
  spec.options.causal = true;
  return spec;
}

// The tile path is taken where it should be: switching AMX off changes the
// bits of a prefill with bf16 products (else both runs took one path).
TEST(AttentionAmx, TakenOnlyWhereAvailable) {
  if (!dispatched_features().amx_bf16) GTEST_SKIP() << "no AMX-BF16 at the dispatched target";
  AttentionCase c(bf16_gqa4_case({64}, {200}));
  AttentionRunner(AttentionPlanOptions{.bf16_products = true,
                                       .fp8_fast_products = false,
                                       .fast_prefill_products = false,
                                       .measured_products = false})
      .run(c.params(0));
  {
    const DisabledFeatures off("amx_bf16");
    EXPECT_FALSE(dispatched_features().amx_bf16);
    AttentionRunner(AttentionPlanOptions{.bf16_products = true,
                                         .fp8_fast_products = false,
                                         .fast_prefill_products = false,
                                         .measured_products = false})
        .run(c.params(1));
  }
  EXPECT_TRUE(dispatched_features().amx_bf16);
  EXPECT_NE(c.output(0), c.output(1)) << "AMX switched off gave the AMX path's bits";
}

// On a CPU with AMX, vdpbf16ps issues at half the FMA rate, so decode with
// bf16 products allowed is expected to time slower than f32 products and
// keep the f32 path's bits (its prefill runs on the tiles); decode takes
// vdpbf16ps only where the timing (product_path_pays) found it faster.
TEST(AttentionAmx, DecodeTakesBf16ProductsOnlyWhereTheyMeasuredFaster) {
  if (!dispatched_features().amx_bf16) GTEST_SKIP() << "no AMX-BF16 at the dispatched target";
  const CaseSpec spec = bf16_gqa4_case({1, 1}, {300, 77});
  AttentionCase c(spec);
  AttentionRunner(AttentionPlanOptions{.bf16_products = false,
                                       .fp8_fast_products = false,
                                       .fast_prefill_products = false,
                                       .measured_products = false})
      .run(c.params(0));
  AttentionRunner(AttentionPlanOptions{.bf16_products = true,
                                       .fp8_fast_products = false,
                                       .fast_prefill_products = false})
      .run(c.params(1));
  const kernels::ProductShape shape{spec.kv_dtype,
                                    spec.layout,
                                    spec.head_dim,
                                    spec.head_dim,
                                    spec.num_qo_heads / spec.num_kv_heads,
                                    false};
  if (kernels::product_path_pays(shape, kernels::ProductPath::kBf16Decode)) {
    EXPECT_NE(c.output(0), c.output(1)) << "timed faster, yet decode kept f32 products";
  } else {
    EXPECT_EQ(c.output(0), c.output(1));
  }
}

}  // namespace attention_targets_test
}  // namespace
}  // namespace pagedattn::testing
