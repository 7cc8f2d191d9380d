// The optimised attention kernel against the double-precision reference over
// a randomized matrix of shapes, dtypes and options, on every Highway target.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <random>

#include "attention_case.h"
#include "core/sanitizers.h"
#include "pagedattn/errors.h"

namespace pagedattn::testing {
namespace {

// A random case from the matrix, kept small enough for ASan runs.
CaseSpec random_spec(std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](auto... values) { return pick_one(rng, values...); };
  CaseSpec s;
  s.seed = seed;
  // GQA groups 1, 4, 6, 8, 3 and 7 (SmolLM2's 9 x 3, Qwen2.5's 14 x 2).
  const auto heads = pick(0, 1, 2, 3, 4, 5);
  const std::int32_t qo[] = {8, 32, 12, 8, 9, 14}, kv[] = {8, 8, 2, 1, 3, 2};
  s.num_qo_heads = qo[heads];
  s.num_kv_heads = kv[heads];
  s.head_dim = pick(32, 64, 80, 96, 128, 192, 256, 40, 136);
  s.v_head_dim = s.head_dim == 192 && pick(0, 1) ? 128 : s.head_dim;
  s.page_size = pick(1, 8, 16, 32, 5);
  s.q_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
  s.o_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
  s.kv_dtype =
      pick(DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8);
  s.layout = pick(KVLayout::kHND, KVLayout::kNHD);
  s.per_head_fp8_scales = pick(false, true);
  s.options.causal = pick(true, true, false);
  s.options.window_left = pick(-1, -1, 0, 7, 40);
  s.options.softcap = pick(0.0f, 0.0f, 30.0f);
  if (pick(0, 1, 2) == 0) s.options.scale = 0.3f;
  s.alibi = pick(false, false, true);
  s.sinks = pick(false, false, true);
  s.key_rope = pick(0, 0, 0, 1, 2);
  // Work budget: rows x keys x dim stays modest for the double reference.
  const int batch = pick(1, 2, 3, 5, 9, 17);
  const std::int64_t budget = 4'000'000 / (s.num_qo_heads * s.head_dim);
  std::int64_t used = 0;
  for (int b = 0; b < batch; ++b) {
    std::int32_t kv_len = pick(1, 54, 97, 1000, 1203, 17, 0);
    std::int32_t q_len = pick(1, 1, 1, 5, 37, 70);
    if (used + std::int64_t{kv_len} * q_len > budget) kv_len = pick(1, 54, 97), q_len = 1;
    if (s.options.causal || q_len > kv_len) q_len = std::min(q_len, std::max(kv_len, 1));
    if (kv_len == 0) q_len = pick(0, 1);  // no keys: zeros (and -inf LSE)
    used += std::int64_t{kv_len} * q_len;
    s.kv_lens.push_back(kv_len);
    s.q_lens.push_back(q_len);
  }
  return s;
}

void run_both(AttentionCase& c, const AttentionPlanOptions& plan_options) {
  paged_attention_reference(c.params(0));
  AttentionRunner runner(plan_options);
  runner.run(c.params(1));
}

TEST(AttentionKernel, MatchesReferenceOnRandomMatrix) {
  // Under ASan the first 64 cases: there the matrix looks for memory errors,
  // which these shapes reach as well; the Release build runs all of them.
  const std::uint32_t cases = core::kAddressSanitizer ? 64 : 160;
  for (std::uint32_t seed = 1; seed <= cases; ++seed) {
    const CaseSpec spec = random_spec(seed);
    SCOPED_TRACE(describe_case(spec));
    AttentionCase c(spec);
    AttentionPlanOptions po{
        .fp8_fast_products = false, .fast_prefill_products = false, .measured_products = false};
    po.num_threads = 1 + seed % 3;
    po.min_kv_chunk = 32;  // split often
    run_both(c, po);
    expect_close(c, describe_case(spec));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(AttentionKernel, EveryDtypeTripleMatchesReference) {
  const DType act[] = {DType::kF32, DType::kF16, DType::kBF16};
  const DType kv[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                      DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};
  std::uint32_t seed = 500;
  for (DType q : act)
    for (DType o : act)
      for (DType k : kv) {
        CaseSpec spec;
        spec.seed = ++seed;
        spec.q_lens = {1, 6};
        spec.kv_lens = {97, 54};
        spec.num_qo_heads = 12;
        spec.num_kv_heads = 2;
        spec.head_dim = 96;
        spec.page_size = 8;
        spec.q_dtype = q;
        spec.o_dtype = o;
        spec.kv_dtype = k;
        spec.per_head_fp8_scales = seed % 2 == 0;
        SCOPED_TRACE(describe_case(spec));
        AttentionCase c(spec);
        run_both(c, AttentionPlanOptions{2, 32, 16, false, false, false, false, false});
        expect_close(c, describe_case(spec));
      }
}

// Head dims that are not multiples of 8 must not read past the caller's
// K/V rows (the buffers are sized exactly: ASan sees any over-read) and must
// still match the reference (fuzz_ops_indices found the over-read).
TEST(AttentionKernel, HeadDimsNotMultipleOf8StayInsideTheirRows) {
  std::uint32_t seed = 700;
  for (const std::int32_t dim : {4, 12, 20, 36})
    for (const DType k : {DType::kF32, DType::kF16, DType::kFP8E4M3, DType::kINT8})
      for (const KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
        CaseSpec spec;
        spec.seed = ++seed;
        spec.q_lens = {1, 3};
        spec.kv_lens = {5, 16};
        spec.num_qo_heads = 4;
        spec.num_kv_heads = 2;
        spec.head_dim = dim;
        spec.page_size = 4;
        spec.kv_dtype = k;
        spec.layout = layout;
        SCOPED_TRACE(describe_case(spec));
        AttentionCase c(spec);
        run_both(c, AttentionPlanOptions{2, 0, 16, false, false, false, false, false});
        expect_close(c, describe_case(spec));
      }
}

TEST(AttentionKernel, EveryCompiledHighwayTargetMatchesReference) {
  for_each_highway_target([](std::int64_t target) {
    for (std::uint32_t seed = 1000; seed < 1012; ++seed) {
      const CaseSpec spec = random_spec(seed);
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + describe_case(spec));
      AttentionCase c(spec);
      run_both(c, AttentionPlanOptions{2, 0, 16, false, false, false, false, false});
      expect_close(c, hwy::TargetName(target));
    }
  });
}

// Prefill tiles (more than 8 rows per KV head: keys transposed, outer-product
// QK, register-blocked PV) on every target: row counts that leave partial
// row tiles, head dims whose PV leaves dims over (40, 136) and partial key
// blocks, every KV dtype. Tolerances: output_tolerance (by output dtype; the
// kernel accumulates in f32 like the reference's double, only the order differs).
TEST(AttentionKernel, PrefillTilesMatchReferenceOnEveryTarget) {
  for_each_highway_target([](std::int64_t target) {
    std::uint32_t seed = 3000;
    for (const std::int32_t dim : {40, 128, 136})
      for (const DType k : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3,
                            DType::kFP8E5M2, DType::kINT8}) {
        CaseSpec spec;
        spec.seed = ++seed;
        spec.q_lens = {7, 19};
        spec.kv_lens = {45, 83};
        spec.num_qo_heads = 12;
        spec.num_kv_heads = 3;
        spec.head_dim = dim;
        spec.v_head_dim = dim;
        spec.page_size = 16;
        spec.kv_dtype = k;
        spec.options.causal = seed % 2 == 0;
        spec.per_head_fp8_scales = seed % 3 == 0;
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + describe_case(spec));
        AttentionCase c(spec);
        run_both(c, AttentionPlanOptions{2, 0, 16, false, false, false, false, false});
        expect_close(c, hwy::TargetName(target));
      }
  });
}

TEST(AttentionKernel, PagedEqualsContiguousBitwise) {
  for (std::uint32_t seed = 2000; seed < 2030; ++seed) {
    const CaseSpec spec = random_spec(seed);
    SCOPED_TRACE(describe_case(spec));
    AttentionCase paged(spec);
    AttentionCase flat = paged.contiguous();
    AttentionPlanOptions po{1, 0, 256, false, false, false, false, false};
    AttentionRunner(po).run(paged.params(1));
    AttentionRunner(po).run(flat.params(1));
    EXPECT_EQ(paged.output(1), flat.output(1));
  }
}

// Threads take items as they finish, so which thread runs an item changes
// from run to run; its rows' bits must not (scratch left by a thread's
// previous item, or a partial slot filled by the wrong thread, would show).
TEST(AttentionKernel, RepeatedRunsGiveTheSameBitsWhicheverThreadTakesAnItem) {
  for (std::uint32_t seed = 3000; seed < 3012; ++seed) {
    const CaseSpec spec = random_spec(seed);
    SCOPED_TRACE(describe_case(spec));
    AttentionCase c(spec);
    AttentionPlanOptions po{
        .fp8_fast_products = false, .fast_prefill_products = false, .measured_products = false};
    po.num_threads = 3;
    po.min_kv_chunk = 32;  // many items: splits and their merges
    AttentionRunner runner(po);
    runner.run(c.params(0));
    for (int run = 0; run < 4; ++run) {
      runner.run(c.params(1));
      ASSERT_EQ(c.output(0), c.output(1)) << "run " << run;
    }
  }
}

TEST(AttentionKernel, SplitKvMatchesUnsplit) {
  CaseSpec spec;
  spec.q_lens = {1, 1, 3};
  spec.kv_lens = {2000, 700, 1500};
  spec.num_qo_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.kv_dtype = DType::kF16;
  spec.sinks = true;
  AttentionCase c(spec);
  paged_attention_reference(c.params(0));  // once: every split must give it
  for (std::int32_t chunk : {0, 64, 100, 333, 5000}) {
    SCOPED_TRACE(chunk);
    AttentionPlanOptions po{2, chunk, 256, false, false, false, false, false};
    AttentionRunner runner(po);
    runner.run(c.params(1));
    if (chunk > 0 && chunk < 2000) {
      EXPECT_GT(runner.last_plan().num_partials, 0);
    }
    expect_close(c, "chunk " + std::to_string(chunk));
  }
}

// Deterministic mode (fixed_kv_chunk): a query's output bits do not depend
// on the rows computed beside it. The last token of a 12-token chunk (GQA
// 4: 48 rows per KV head, softmax updates of 16 rows) against the same
// token alone (4 rows, decode's smaller reduction trees), same pages.
TEST(AttentionKernel, BatchInvariantRowKeepsItsBitsAloneOrInAChunk) {
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16, DType::kINT8}) {
    SCOPED_TRACE(dtype_name(kv));
    CaseSpec spec;
    spec.q_lens = {12};
    spec.kv_lens = {300};
    spec.num_qo_heads = 32;
    spec.num_kv_heads = 8;
    spec.head_dim = 128;
    spec.kv_dtype = kv;
    AttentionCase c(spec);
    AttentionRunner runner(AttentionPlanOptions{2, 64, 256, false, false, false, false, false});
    runner.run(c.params(0));
    constexpr std::int32_t kLast = 11;
    const std::int32_t qo_indptr[2] = {0, 1};
    AttentionParams alone = c.params(1);
    alone.table.qo_indptr = qo_indptr;
    alone.q.data = static_cast<std::byte*>(alone.q.data) +
                   kLast * alone.q.token_stride * std::int64_t(dtype_size(alone.q.dtype));
    alone.o.data = static_cast<std::byte*>(alone.o.data) +
                   kLast * alone.o.token_stride * std::int64_t(dtype_size(alone.o.dtype));
    alone.lse += kLast * alone.num_qo_heads;
    runner.run(alone);
    const std::vector<float> in_chunk = c.output(0), by_itself = c.output(1);
    const std::size_t row = std::size_t(spec.num_qo_heads) * std::size_t(spec.head_dim);
    for (std::size_t i = kLast * row; i < (kLast + 1) * row; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(in_chunk[i]),
                std::bit_cast<std::uint32_t>(by_itself[i]))
          << i;
    for (std::int32_t h = 0; h < spec.num_qo_heads; ++h)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(c.lse(0)[kLast * spec.num_qo_heads + h]),
                std::bit_cast<std::uint32_t>(c.lse(1)[kLast * spec.num_qo_heads + h]));
  }
}

// Decode over every GQA group size from 2 to 8 (the kernels' tiles of 3, 5,
// 6 and 7 rows among them), with and without inline key RoPE (f32 scratch
// rows), on f32 products and on the bf16 and int8 ones where the CPU has
// them: each group against the double reference, and a row's bits the same
// as its query head's run alone (one row per KV head, the same pages and
// key chunks).
TEST(AttentionKernel, DecodeRowKeepsItsBitsInAnyGqaGroup) {
  const DType kv_types[] = {DType::kF32,  DType::kF16,     DType::kBF16,
                            DType::kINT8, DType::kFP8E4M3, DType::kFP8E5M2};
  const CpuFeatures used = dispatched_features();
  for (const DotProducts dot :
       {DotProducts{}, DotProducts{.bf16 = true}, DotProducts{.int8 = true}})
    for (std::int32_t group = 2; group <= 8; ++group)
      for (std::int32_t head_dim : {64, 128, 40})
        for (int key_rope : {0, 1})
          for (DType kv : kv_types) {
            const bool fp8 = kv == DType::kFP8E4M3 || kv == DType::kFP8E5M2;
            // bf16 products: decode over 16-bit and fp8 K/V without inline
            // RoPE; int8 products: over int8 K/V with head dims of 64s.
            if (dot.bf16 && !(used.avx512_bf16 && used.avx512_vbmi &&
                              (fp8 || kv == DType::kF16 || kv == DType::kBF16) && key_rope == 0))
              continue;
            if (dot.int8 && !(used.avx512_vnni && kv == DType::kINT8 && head_dim % 64 == 0))
              continue;
            const bool f32 = !dot.bf16 && !dot.int8;
            CaseSpec spec;
            spec.seed = std::uint32_t(group * 1000 + head_dim * 2 + key_rope);
            spec.q_lens = {1, 1, 1};
            spec.kv_lens = {1, 97, 300};
            spec.num_kv_heads = 2;
            spec.num_qo_heads = 2 * group;
            spec.head_dim = head_dim;
            spec.kv_dtype = kv;
            spec.layout = group % 2 ? KVLayout::kNHD : KVLayout::kHND;
            spec.key_rope = key_rope;
            SCOPED_TRACE(describe_case(spec));
            AttentionCase c(spec);
            paged_attention_reference(c.params(0));
            // Fixed chunks make the plan batch-invariant, which keeps f32
            // products; the other passes run each call's keys whole on one
            // thread.
            AttentionRunner runner(AttentionPlanOptions{.num_threads = f32 ? 2 : 1,
                                                        .fixed_kv_chunk = f32 ? 64 : 0,
                                                        .bf16_products = dot.bf16,
                                                        .int8_products = dot.int8,
                                                        .fp8_fast_products = false,
                                                        .fast_prefill_products = false,
                                                        .measured_products = false});
            runner.run(c.params(1));
            if (f32)
              expect_close(c, describe_case(spec));
            else
              expect_rows_close(c, tolerance_for(spec, used, dot), describe_case(spec));
            // On bf16 products only the key-pair tiles (fp8 K, f16 K below 8
            // rows) share one order of sums with a lone row's tile.
            if (dot.bf16 && !(fp8 || (kv == DType::kF16 && group < 8))) continue;
            const std::vector<float> together = c.output(1);
            const std::vector<float> together_lse = c.lse(1);
            std::vector<float> lse_alone(std::size_t(c.num_tokens()) * 2);
            for (std::int32_t i = 0; i < group; ++i) {
              AttentionParams alone = c.params(0);  // query heads i and group + i
              alone.num_qo_heads = 2;
              for (HeadTensor* t : {&alone.q, &alone.o}) {
                t->data = static_cast<std::byte*>(t->data) +
                          i * t->head_stride * std::int64_t(dtype_size(t->dtype));
                t->head_stride *= group;
              }
              alone.lse = lse_alone.data();
              runner.run(alone);
              for (std::int32_t t = 0; t < c.num_tokens(); ++t)
                for (std::int32_t h = 0; h < 2; ++h)
                  ASSERT_EQ(std::bit_cast<std::uint32_t>(together_lse[(t * 2 + h) * group + i]),
                            std::bit_cast<std::uint32_t>(lse_alone[t * 2 + h]))
                      << "token " << t << ", query head " << h * group + i;
            }
            const std::vector<float> alone_rows = c.output(0);
            for (std::size_t e = 0; e < together.size(); ++e)
              ASSERT_EQ(std::bit_cast<std::uint32_t>(together[e]),
                        std::bit_cast<std::uint32_t>(alone_rows[e]))
                  << "element " << e;
          }
}

// A plan for more threads than the batch has sequences splits their KV
// heads into items of their own: every row keeps the bits it has in an item
// of all the heads, on every product path the CPU has, decode and a short
// prefill.
TEST(AttentionKernel, RowsKeepTheirBitsWhenTheirHeadsAreSplit) {
  const DType kv_types[] = {DType::kF32,  DType::kF16,     DType::kBF16,
                            DType::kINT8, DType::kFP8E4M3, DType::kFP8E5M2};
  for (const DotProducts dot : {DotProducts{}, DotProducts{.bf16 = true}, DotProducts{.int8 = true},
                                DotProducts{.f16 = true}})
    for (std::int32_t group : {1, 3, 4, 8})
      for (std::int32_t q_len : {1, 5})
        for (DType kv : kv_types) {
          CaseSpec spec;
          spec.seed = std::uint32_t(group * 100 + q_len);
          spec.q_lens = {q_len};
          spec.kv_lens = {300};  // one key chunk: no split by keys
          spec.num_kv_heads = 4;
          spec.num_qo_heads = 4 * group;
          spec.head_dim = 128;
          spec.kv_dtype = kv;
          spec.layout = group % 2 ? KVLayout::kNHD : KVLayout::kHND;
          SCOPED_TRACE(describe_case(spec) + (dot.bf16 ? " bf16" : "") + (dot.int8 ? " int8" : "") +
                       (dot.f16 ? " f16" : ""));
          AttentionCase c(spec);
          const auto runner = [&](std::int32_t threads) {
            return AttentionRunner(AttentionPlanOptions{.num_threads = threads,
                                                        .bf16_products = dot.bf16,
                                                        .int8_products = dot.int8,
                                                        .f16_products = dot.f16,
                                                        .fp8_fast_products = true,
                                                        .measured_products = false});
          };
          AttentionRunner whole = runner(1), split = runner(4);
          whole.run(c.params(0));
          split.run(c.params(1));
          ASSERT_EQ(whole.last_plan().items.size(), 1u);
          ASSERT_EQ(split.last_plan().items.size(), 4u);
          ASSERT_EQ(split.last_plan().num_partials, 0);
          const std::vector<float> a = c.output(0), b = c.output(1);
          for (std::size_t e = 0; e < a.size(); ++e)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(a[e]), std::bit_cast<std::uint32_t>(b[e]))
                << "element " << e;
          for (std::size_t r = 0; r < c.lse(0).size(); ++r)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(c.lse(0)[r]),
                      std::bit_cast<std::uint32_t>(c.lse(1)[r]))
                << "row " << r;
        }
}

TEST(AttentionKernel, ForcedReferenceGivesReferenceBits) {
  AttentionCase c(random_spec(7));
  paged_attention_reference(c.params(0));
  set_force_reference_kernels(true);
  AttentionRunner().run(c.params(1));
  set_force_reference_kernels(false);
  EXPECT_EQ(c.output(0), c.output(1));
}

TEST(AttentionKernel, MergeStatesOfTwoHalvesEqualsWhole) {
  // Attention over keys [0, 600) equals the merge of [0, 300) and [300, 600),
  // each computed as its own (non-causal) batch over half the pages.
  CaseSpec spec;
  spec.q_lens = {4};
  spec.kv_lens = {600};
  spec.page_size = 20;
  spec.head_dim = 64;
  spec.options.causal = false;
  AttentionCase whole(spec);
  AttentionParams p = whole.params(0);
  paged_attention_reference(p);
  const std::int32_t half_lens[] = {300};
  const std::int32_t first_half[] = {0, 15}, second_half[] = {0, 15};
  std::vector<float> o_a(4 * 8 * 64), o_b(o_a.size()), s_a(32), s_b(32);
  AttentionParams a = p;
  a.table.kv_lens = half_lens;
  a.table.kv_indptr = first_half;
  a.o = {o_a.data(), DType::kF32, 8 * 64, 64};
  a.lse = s_a.data();
  paged_attention_reference(a);
  AttentionParams b = a;
  b.table.kv_indptr = second_half;
  b.table.kv_indices = p.table.kv_indices + 15;
  b.o.data = o_b.data();
  b.lse = s_b.data();
  paged_attention_reference(b);
  std::vector<float> o(o_a.size()), s(32);
  merge_states(o_a, s_a, o_b, s_b, o, s, 64);
  const std::vector<float> want = whole.output(0);
  for (std::size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], want[i], 1e-5f) << i;
  for (std::size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(s[i], whole.lse(0)[i], 1e-5f) << i;
}

TEST(AttentionKernel, MergeStatesHandlesEmptyStatesAndValidatesSizes) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v_a = {1, 2}, s_a = {-inf}, v_b = {3, 4}, s_b = {0.5f}, v(2), s(1);
  merge_states(v_a, s_a, v_b, s_b, v, s, 2);
  EXPECT_EQ(v, (std::vector<float>{3, 4}));
  EXPECT_EQ(s[0], 0.5f);
  s_b[0] = -inf;
  s_a[0] = -inf;
  merge_states(v_a, s_a, v_b, s_b, v, s, 2);
  EXPECT_EQ(s[0], -inf);
  std::vector<float> short_v(1);
  EXPECT_THROW(merge_states(v_a, s_a, v_b, s_b, short_v, s, 2), InvalidArgument);
}

TEST(AttentionKernel, RejectsBadParamsNamingTheField) {
  CaseSpec spec = random_spec(3);
  spec.num_qo_heads = spec.num_kv_heads = 8;
  AttentionCase c(spec);
  AttentionParams p = c.params(1);
  p.num_qo_heads = 7;  // not a multiple of the KV heads
  try {
    AttentionRunner().run(p);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("num_qo_heads = 7"));
  }
  p = c.params(1);
  std::vector<std::int32_t> bad(p.table.kv_indices,
                                p.table.kv_indices + p.table.kv_indptr[p.table.batch_size]);
  bad[0] = 1 << 30;
  p.table.kv_indices = bad.data();
  EXPECT_THROW(AttentionRunner().run(p), InvalidArgument);
  p = c.params(1);
  p.options.window_left = -2;
  EXPECT_THROW(AttentionRunner().run(p), InvalidArgument);
  p = c.params(1);
  p.options.softcap = -1.0f;
  EXPECT_THROW(paged_attention_reference(p), InvalidArgument);
}

TEST(AttentionKernel, RejectsPlanForAnotherBatch) {
  AttentionCase small(random_spec(11));
  CaseSpec other = random_spec(11);
  other.kv_lens.assign(other.kv_lens.size(), 1);
  other.q_lens.assign(other.q_lens.size(), 1);
  AttentionCase tiny(other);
  AttentionParams p = small.params(1);
  const AttentionShape shape{p.num_qo_heads, p.kv.num_kv_heads, p.kv.head_dim, p.kv.v_head_dim};
  const AttentionPlan plan = plan_attention(p.table, shape, p.options);
  std::vector<std::byte> ws(plan.workspace_bytes + 64);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 63) &
                                               ~std::uintptr_t{63});
  AttentionParams q = tiny.params(1);
  ASSERT_TRUE(std::any_of(plan.items.begin(), plan.items.end(),
                          [](const AttentionWorkItem& w) { return w.kv_end > 1 || w.q_end > 1; }));
  EXPECT_THROW(paged_attention(q, plan, {aligned, plan.workspace_bytes}), InvalidArgument);
  EXPECT_THROW(paged_attention(p, plan, {aligned, plan.workspace_bytes / 2}), InvalidArgument);
}

}  // namespace
}  // namespace pagedattn::testing
