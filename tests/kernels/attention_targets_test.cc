// Every Highway target this build compiled and this CPU runs, against the
// double-precision reference, on randomized shapes: decode, chunked and full
// prefill, causal and not, GQA, head dims with tails, page sizes, and every
// KV dtype. The kernel's dot-product paths (vdpbf16ps for bf16 / fp8 KV,
// vpdpbusd for int8 KV) run only on AVX-512 targets whose CPU has the
// extension, and only there do their tolerances apply.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "attention_case.h"
#include "attention_peak.h"
#include "pagedattn/cpu_features.h"

namespace pagedattn::testing {
namespace {

// --- tolerances --------------------------------------------------------------------------
//
// Checked per output row (one token, one query head): max |kernel - reference|
// over the row <= tolerance x max |reference| over the row, so a long
// sequence, whose outputs average many values and are small, is held to the
// same relative standard as a short one. The reference reads the same stored
// K/V and queries and accumulates in double.

// The kernel's fp32 arithmetic (accumulation order, vectorised exp) and the
// rounding of the stored output: half an ulp of f16 is 2^-11 = 4.9e-4 and of
// bf16 2^-9 = 2.0e-3 relative to an element, at most that of the row maximum.
double output_row_tolerance(DType o) {
  switch (o) {
    case DType::kF16: return 1e-3;
    case DType::kBF16: return 4e-3;
    default: return 5e-5;
  }
}

// The dot-product paths round their inputs. vdpbf16ps: queries and softmax
// weights to bf16 (8 significant bits); a numpy model of that rounding over
// 400 random rows (head dims 32-256, up to 1203 keys) gave at most 0.5% of
// the row maximum at the default scale 1/sqrt(d) and 2.1% at scale 0.3.
// vpdpbusd: queries quantised to int8 per row (absmax / 127): at most 1.7%
// and 5.9%. The allowances are about 1.5x those.
constexpr double kBf16DotRowTolerance = 3e-2;
constexpr double kInt8DotRowTolerance = 8e-2;
// The LSE moves with the scores: the same allowances, absolute, for
// max(1, |lse|); the fp32 path keeps the suite's 5e-5.
constexpr double kFp32LseTolerance = 5e-5;

struct RowTolerance {
  double row = 0.0;
  double lse = 0.0;
};

RowTolerance tolerance_for(DType kv, DType o, const CpuFeatures& used) {
  namespace pb = pagedattn::bench;
  const bool bf16_dot = pb::kKernelUsesBf16Dot && used.avx512f && used.avx512_bf16 &&
                        (kv == DType::kBF16 || is_fp8(kv));
  const bool int8_dot = pb::kKernelUsesInt8Dot && used.avx512f && used.avx512_vnni && kv == DType::kINT8;
  const double dot = int8_dot ? kInt8DotRowTolerance : bf16_dot ? kBf16DotRowTolerance : 0.0;
  return {output_row_tolerance(o) + dot, dot > 0.0 ? dot : kFp32LseTolerance};
}

// --- cases -------------------------------------------------------------------------------

std::string describe(const CaseSpec& s) {
  std::ostringstream os;
  os << "seed " << s.seed << " heads " << s.num_qo_heads << "x" << s.num_kv_heads << " dim "
     << s.head_dim << " page " << s.page_size << " q/o/kv " << dtype_name(s.q_dtype) << "/"
     << dtype_name(s.o_dtype) << "/" << dtype_name(s.kv_dtype) << " causal " << s.options.causal
     << " scale " << s.options.scale.value_or(0.0f) << " q_lens";
  for (std::int32_t q : s.q_lens) os << " " << q;
  os << " kv_lens";
  for (std::int32_t k : s.kv_lens) os << " " << k;
  return os.str();
}

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
  const DType natural = kv == DType::kF32 ? DType::kF32 : kv == DType::kF16 ? DType::kF16 : DType::kBF16;
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
    std::int32_t q_len = mode == Mode::kDecode ? 1
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

void expect_rows_close(const AttentionCase& c, const RowTolerance& tol, const std::string& what) {
  const std::vector<float> want = c.output(0), got = c.output(1);
  const std::size_t dim = static_cast<std::size_t>(c.spec().v_head_dim ? c.spec().v_head_dim : c.spec().head_dim);
  int reported = 0;
  for (std::size_t row = 0; row * dim < want.size(); ++row) {
    double err = 0.0, scale = 0.0;
    for (std::size_t i = row * dim; i < (row + 1) * dim; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << " output " << i << " is " << got[i];
      err = std::max(err, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    if (err > tol.row * scale + 1e-6 && reported++ < 3)
      ADD_FAILURE() << what << " row " << row << ": max error " << err << " against row maximum "
                    << scale << " (tolerance " << tol.row << " of it)";
  }
  for (std::size_t i = 0; i < c.lse(0).size(); ++i) {
    const float a = c.lse(0)[i], b = c.lse(1)[i];
    if (std::isinf(a)) {
      EXPECT_EQ(a, b) << what << " lse " << i;
    } else if (std::fabs(a - b) > tol.lse * std::max(1.0f, std::fabs(a)) && reported++ < 3) {
      ADD_FAILURE() << what << " lse " << i << ": reference " << a << ", kernel " << b;
    }
  }
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Each mode x KV dtype, a few seeds, on every target. The seeds differ per
// target so that the targets together cover more shapes.
TEST(AttentionTargets, EveryTargetMatchesReferenceOnRandomShapes) {
  const DType kvs[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};
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
          const std::uint32_t seed =
              static_cast<std::uint32_t>(targets_run) * 1000 + static_cast<std::uint32_t>(mode) * 100 +
              static_cast<std::uint32_t>(kv) * 10 + k;
          const CaseSpec spec = random_case(mode, kv, seed);
          const std::string what = name + " " + describe(spec);
          SCOPED_TRACE(what);
          AttentionCase c(spec);
          paged_attention_reference(c.params(0));
          AttentionRunner(AttentionPlanOptions{2, 32, 16}).run(c.params(1));  // split KV often
          expect_rows_close(c, tolerance_for(kv, spec.o_dtype, used), what);
          if (::testing::Test::HasFailure()) return;
        }
  });
  EXPECT_GE(targets_run, 1);
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
  const RowTolerance tol{output_row_tolerance(spec.o_dtype) + kInt8DotRowTolerance, 0.0};  // the loosest
  const std::size_t dim = static_cast<std::size_t>(spec.head_dim);
  int rows_failing = 0;
  for (std::size_t row = 0; row * dim < want.size(); ++row) {
    double err = 0.0, scale = 0.0;
    for (std::size_t i = row * dim; i < (row + 1) * dim; ++i) {
      err = std::max(err, double(std::fabs(wrong[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    rows_failing += err > tol.row * scale + 1e-6;
  }
  EXPECT_EQ(rows_failing * dim, want.size()) << "the largest tolerance accepts unrelated outputs";
}

}  // namespace
}  // namespace pagedattn::testing
