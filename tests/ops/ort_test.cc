// ORT com.microsoft.PagedAttention: parity with the scalar reference over
// ORT's own test matrix, ORT's conventions, and one test per validation rule.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "ort_case.h"

namespace pagedattn::ops::test {
namespace {

// Tolerances against the double reference: f32 accumulates in f32; f16/bf16
// outputs are rounded to 11 / 8 significant bits.
float tolerance(DType dtype) {
  return dtype == DType::kF32 ? 2e-4f : dtype == DType::kF16 ? 4e-3f : 3e-2f;
}

std::string describe(const OrtSpec& s) {
  std::ostringstream os;
  os << "seed " << s.seed << " heads (" << s.num_heads << "," << s.kv_num_heads << ") D "
     << s.head_size << " block " << s.block_size << " " << dtype_name(s.dtype) << " rotary "
     << s.rotary << (s.interleaved ? " interleaved" : "") << " packed " << s.packed << " window "
     << s.local_window_size << " softcap " << s.softcap << " seqs";
  for (const auto& [n, total] : s.seqs) os << " (" << n << "," << total << ")";
  return os.str();
}

void run_and_check(const OrtSpec& spec) {
  OrtCase c(spec);
  ort::paged_attention(c.params());
  const float tol = tolerance(spec.dtype);
  expect_close(c.output(), c.expected(), tol, tol, describe(spec));
  if (spec.skip_token < 0) {
    expect_close(c.stored_new(false), c.expected_new(false), 0, 0, "new K in cache");
    expect_close(c.stored_new(true), c.expected_new(true), 0, 0, "new V in cache");
  }
}

// ORT's test_paged_attention matrix: batches 1/3/5, (new, total) lengths,
// heads, head sizes, block sizes, rotary x interleaved x packed x window x
// softcap. Large (new, total) pairs fall back to small ones when a case
// would be slow for the double reference (all of them run at full size in
// EveryOrtSequenceShapeAtFullSize).
TEST(OrtPagedAttention, MatchesReferenceOnOrtMatrix) {
  const std::pair<std::int32_t, std::int32_t> lengths[] = {
      {3, 1024}, {1, 339}, {408, 800}, {17, 49}, {257, 257}};
  const std::pair<std::int32_t, std::int32_t> heads[] = {{6, 6}, {6, 3}, {9, 3}};
  const std::int32_t head_sizes[] = {32, 64, 80, 96, 128, 160, 192, 256};
  const std::int32_t block_sizes[] = {16, 32, 64, 128, 256, 512};
  const std::int32_t batches[] = {1, 3, 5};
  for (std::uint32_t i = 0; i < 48; ++i) {
    OrtSpec s;
    s.seed = 100 + i;
    std::mt19937 rng(s.seed);
    s.num_heads = heads[i % 3].first;
    s.kv_num_heads = heads[i % 3].second;
    s.head_size = head_sizes[(i / 3) % 8];
    s.block_size = block_sizes[i % 6];
    s.rotary = i & 1;
    s.interleaved = (i >> 1) & 1;
    s.packed = (i >> 2) & 1;
    s.local_window_size = (i >> 3) & 1 ? 17 + static_cast<std::int32_t>(i) : -1;
    s.softcap = (i >> 4) & 1 ? 50.0f : 0.0f;
    s.half_rotary = i % 5 == 0;
    std::int64_t work = 0;
    for (std::int32_t b = 0; b < batches[i % 3]; ++b) {
      auto pair = lengths[(i + b) % 5];
      if ((work + std::int64_t{pair.first} * pair.second) * s.num_heads * s.head_size > 4'000'000)
        pair = rng() % 2 ? std::pair{1, 339} : std::pair{17, 49};
      work += std::int64_t{pair.first} * pair.second;
      s.seqs.push_back(pair);
    }
    run_and_check(s);
  }
}

TEST(OrtPagedAttention, EveryOrtSequenceShapeAtFullSize) {
  OrtSpec s;
  s.seqs = {{3, 1024}, {1, 339}, {408, 800}, {17, 49}, {257, 257}};
  s.num_heads = 6;
  s.kv_num_heads = 3;
  s.head_size = 32;
  s.rotary = true;
  s.local_window_size = 100;
  run_and_check(s);
}

TEST(OrtPagedAttention, HalfPrecisionFourDimCachesSinksAndExplicitScale) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    OrtSpec s;
    s.seqs = {{5, 70}, {1, 33}, {17, 17}};
    s.dtype = dtype;
    s.four_d_cache = true;
    s.head_sink = true;
    s.scale = 0.2f;
    s.rotary = true;
    s.interleaved = true;
    s.head_size = 64;
    run_and_check(s);
  }
}

TEST(OrtPagedAttention, ExplicitSlotMappingSkipsMinusOne) {
  OrtSpec s;
  s.seqs = {{4, 20}, {3, 3}};
  s.slot_mapping = true;
  s.skip_token = 2;  // its slot keeps the K/V it held before the call
  run_and_check(s);
}

TEST(OrtPagedAttention, ZeroNewTokensForSomeOrAllSequences) {
  OrtSpec some;
  some.seqs = {{0, 37}, {0, 0}, {5, 5}, {0, 16}};
  some.rotary = true;
  run_and_check(some);
  OrtSpec none;
  none.seqs = {{0, 37}, {0, 0}};
  run_and_check(none);
}

// Conventions checked by hand: with q = 0 every visible key has the same
// logit, so the output is the mean of the visible values. Current ORT
// (PR #25927) shows L keys, the query's own included (not L + 1).
TEST(OrtPagedAttention, LocalWindowOfLShowsTheLastLKeys) {
  OrtSpec s;
  s.seqs = {{1, 11}};
  s.num_heads = s.kv_num_heads = 1;
  s.head_size = 8;
  s.local_window_size = 3;
  OrtCase c(s);
  std::fill(c.query.begin(), c.query.end(), 0);
  ort::paged_attention(c.params());
  const std::vector<float> v = decode(c.value_cache.data(), DType::kF32, c.value_cache.size() / 4);
  for (std::int32_t dim = 0; dim < 8; ++dim) {
    double mean = 0;
    for (std::int32_t pos = 8; pos <= 10; ++pos)  // the last L = 3 keys, the query's own included
      mean += v[std::size_t(c.block_table[pos / 16] * 16 + pos % 16) * 8 + dim] / 3.0;
    EXPECT_NEAR(c.output()[std::size_t(dim)], mean, 1e-5) << dim;
  }
}

TEST(OrtPagedAttention, ScaleZeroMeansOneOverSqrtHeadSize) {
  OrtSpec s;
  s.seqs = {{3, 40}};
  OrtCase by_default(s);
  ort::paged_attention(by_default.params());
  s.scale = 1.0f / std::sqrt(32.0f);
  OrtCase explicit_scale(s);
  ort::paged_attention(explicit_scale.params());
  EXPECT_EQ(by_default.out, explicit_scale.out);
}

// --- validation: one test per rule; each leaves the caches byte-identical ---

struct Rejection {
  const char* rule;
  std::function<void(ort::PagedAttentionParams&, OrtCase&)> mutate;
  std::vector<std::string_view> message;
};

void expect_rejected(const Rejection& r, OrtSpec spec = {}) {
  if (spec.seqs.empty()) spec.seqs = {{3, 20}, {2, 2}};
  OrtCase c(spec);
  ort::PagedAttentionParams p = c.params();
  r.mutate(p, c);
  SCOPED_TRACE(r.rule);
  expect_invalid([&] { ort::paged_attention(p); }, r.message, {&c.key_cache, &c.value_cache});
}

TEST(OrtPagedAttentionValidation, EveryRuleNamesInputIndexAndValue) {
  const std::vector<Rejection> rules = {
      {"heads", [](auto& p, auto&) { p.kv_num_heads = 4; }, {"num_heads = 6", "kv_num_heads = 4"}},
      {"scale finite", [](auto& p, auto&) { p.scale = NAN; }, {"scale = nan"}},
      {"softcap >= 0", [](auto& p, auto&) { p.softcap = -1; }, {"softcap = -1"}},
      {"window >= -1",
       [](auto& p, auto&) { p.local_window_size = -2; },
       {"local_window_size = -2"}},
      {"window of no key",
       [](auto& p, auto&) { p.local_window_size = 0; },
       {"local_window_size = 0 must be -1 (off) or >= 1"}},
      {"key without value", [](auto& p, auto&) { p.value.reset(); }, {"key and value"}},
      {"query rank", [](auto& p, auto&) { p.query.rank = 3; }, {"query has rank 3"}},
      {"query dtype",
       [](auto& p, auto&) { p.query.dtype = DType::kINT8; },
       {"query has dtype int8"}},
      {"query contiguous",
       [](auto& p, auto&) { p.query.strides[0] += 8; },
       {"query must be contiguous", "stride[0]"}},
      {"query width",
       [](auto& p, auto&) {
         p.query.shape[1] = 100;
         p.query.strides[0] = 100;
       },
       {"query.shape[1] = 100"}},
      {"key shape",
       [](auto& p, auto&) { p.key->shape[0] = 4; },
       {"key has shape [4, 96]", "expected [5, 96]"}},
      {"key dtype", [](auto& p, auto&) { p.key->dtype = DType::kF16; }, {"key has dtype float16"}},
      {"output shape",
       [](auto& p, auto&) { p.output.shape[1] = 96; },
       {"output has shape [5, 96]"}},
      {"output null", [](auto& p, auto&) { p.output.data = nullptr; }, {"output is null"}},
      {"cache rank", [](auto& p, auto&) { p.key_cache.rank = 2; }, {"key_cache has rank 2"}},
      {"cache shape",
       [](auto& p, auto&) { p.key_cache.shape[2] = 64; },
       {"key_cache has shape", "64]"}},
      {"value_cache shape",
       [](auto& p, auto&) { p.value_cache.shape[0] -= 1; },
       {"value_cache must have key_cache's shape"}},
      {"cache dtype",
       [](auto& p, auto&) { p.value_cache.dtype = DType::kBF16; },
       {"value_cache has dtype bfloat16"}},
      {"cache contiguous",
       [](auto& p, auto&) { p.key_cache.strides[1] = 1; },
       {"key_cache must be contiguous"}},
      {"index dtype",
       [](auto& p, auto& c) {
         p.block_table.type = IndexType::kInt64;
         (void)c;
       },
       {"block_table has dtype int64"}},
      {"cu shape",
       [](auto& p, auto&) { p.cumulative_sequence_length.shape[0] = 2; },
       {"cumulative_sequence_length has shape [2], expected [3]"}},
      {"cu starts at 0",
       [](auto&, auto& c) { c.cu[0] = 1; },
       {"cumulative_sequence_length[0] = 1"}},
      {"cu non-decreasing",
       [](auto&, auto& c) { c.cu[1] = 6; },
       {"cumulative_sequence_length[2] = 5 is less than", "[1] = 6"}},
      {"cu ends at T",
       [](auto&, auto& c) { c.cu[2] = 4; },
       {"cumulative_sequence_length[2] = 4 must equal the token count 5"}},
      {"past >= 0", [](auto&, auto& c) { c.past[1] = -1; }, {"past_seqlens[1] = -1"}},
      {"past within capacity",
       [](auto&, auto& c) { c.past[0] = 46; },
       {"past_seqlens + new tokens of sequence[0] = 49", "[0, 48]"}},
      {"block id in range",
       [](auto&, auto& c) { c.block_table[1] = static_cast<std::int32_t>(c.num_blocks); },
       {"block_table[0][1] = 5 is outside [0, 5)"}},
      {"block id negative",
       [](auto&, auto& c) { c.block_table[c.max_blocks] = -3; },
       {"block_table[1][0] = -3"}},
      {"slot in range",
       [](auto& p, auto& c) {
         c.slots = {0, 1, 2, 3, 80};
         p.slot_mapping = IndexView::dense(c.slots.data(), {5});
       },
       {"slot_mapping[4] = 80 is outside [0, 80)"}},
      {"slot shape",
       [](auto& p, auto& c) {
         c.slots.assign(4, 0);
         p.slot_mapping = IndexView::dense(c.slots.data(), {4});
       },
       {"slot_mapping has shape [4], expected [5]"}},
      {"slot duplicates",
       [](auto& p, auto& c) {
         c.slots = {1, 2, 3, 4, 1};
         p.slot_mapping = IndexView::dense(c.slots.data(), {5});
       },
       {"slot 1 appears more than once"}},
      {"rotary without cos",
       [](auto& p, auto&) { p.do_rotary = true; },
       {"cos_cache and sin_cache must be given exactly when do_rotary = 1"}},
      {"head_sink shape",
       [](auto& p, auto& c) {
         c.sink.assign(16, 0);
         p.head_sink = TensorView::dense(c.sink.data(), DType::kF32, {4});
       },
       {"head_sink has shape [4], expected [6]"}},
      {"int32 overflow",
       [](auto& p, auto&) { p.block_table.shape[1] = 1 << 28; },
       {"max_blocks_per_sequence * block_size = 268435456 x 16 overflows int32"}},
  };
  for (const Rejection& r : rules) expect_rejected(r);
}

TEST(OrtPagedAttentionValidation, RotaryTablesMustCoverEveryPositionAndFitTheHead) {
  OrtSpec s;
  s.seqs = {{3, 20}, {2, 2}};
  s.rotary = true;
  expect_rejected({"cos rows",
                   [](auto& p, auto&) {
                     p.cos_cache->shape[0] = 19;
                     p.sin_cache->shape[0] = 19;
                   },
                   {"cos_cache has 19 rows but position 19 is used"}},
                  s);
  expect_rejected({"rotary dim",
                   [](auto& p, auto&) {
                     p.cos_cache->shape[1] = 17;
                     p.cos_cache->strides[0] = 17;
                   },
                   {"cos_cache.shape[1] = 17", "head_size / 2 = 16"}},
                  s);
  expect_rejected({"sin shape",
                   [](auto& p, auto&) { p.sin_cache->shape[0] = 2; },
                   {"sin_cache has shape [2, 16]"}},
                  s);
}

TEST(OrtPagedAttentionValidation, UnusedBlockTableEntriesAreNotChecked) {
  OrtSpec s;
  s.seqs = {{3, 20}, {2, 2}};
  OrtCase c(s);  // the spare column holds 2^30, far outside the cache
  EXPECT_NO_THROW(ort::paged_attention(c.params()));
}

}  // namespace
}  // namespace pagedattn::ops::test
