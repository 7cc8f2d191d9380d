#include "attention_case.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "attention_peak.h"
#include "support/random_floats.h"

namespace pagedattn::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kFp8TensorScale = 0.05f;

// Fills a raw buffer of `dtype` with a value that decodes to NaN where the
// format has one (int8 has none: its NaN goes into the token scales).
void poison(std::vector<unsigned char>& buf, DType dtype) {
  const std::size_t n = buf.size() / dtype_size(dtype);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == DType::kFP8E4M3)
      buf[i] = 0x7f;
    else if (dtype == DType::kFP8E5M2)
      buf[i] = 0x7e;
    else if (dtype == DType::kINT8)
      buf[i] = 0x7f;
    else
      store_from_float(buf.data(), dtype, i, kNaN);
  }
}

}  // namespace

AttentionCase::AttentionCase(const CaseSpec& spec) : spec_(spec) {
  if (spec_.v_head_dim == 0) spec_.v_head_dim = spec_.head_dim;
  std::mt19937 rng(spec_.seed);
  build_table(rng);
  fill_kv(rng);
  pagedattn::test::NormalFloats normal;
  const std::size_t q_elems = std::size_t(num_tokens()) * spec_.num_qo_heads * spec_.head_dim;
  q_.assign(q_elems * dtype_size(spec_.q_dtype), 0);
  for (std::size_t i = 0; i < q_elems; ++i)
    store_from_float(q_.data(), spec_.q_dtype, i, normal(rng));
  const std::size_t o_elems = std::size_t(num_tokens()) * spec_.num_qo_heads * spec_.v_head_dim;
  for (int w = 0; w < 2; ++w) {
    o_[w].assign(o_elems * dtype_size(spec_.o_dtype), 0xcd);
    lse_[w].assign(std::size_t(num_tokens()) * spec_.num_qo_heads, kNaN);
  }
  rope_.style = spec_.seed % 2 ? RopeStyle::kNeox : RopeStyle::kGptJ;
  rope_.rotary_dim = spec_.head_dim % 16 == 0 ? spec_.head_dim / 2 : 0;
  if (spec_.key_rope == 2) {  // a cos/sin cache covering every key position
    const std::int32_t r = rope_.rotary_dim ? rope_.rotary_dim : spec_.head_dim, half = r / 2;
    const std::int32_t positions = std::max(1, *std::max_element(kv_lens_.begin(), kv_lens_.end()));
    for (std::int32_t pos = 0; pos < positions; ++pos)
      for (std::int32_t i = 0; i < half; ++i) {
        rope_cos_.push_back(float(std::cos(pos * rope_inv_freq(rope_, r, i))));
        rope_sin_.push_back(float(std::sin(pos * rope_inv_freq(rope_, r, i))));
      }
    rope_.cos_cache = rope_cos_.data();
    rope_.sin_cache = rope_sin_.data();
    rope_.cache_max_position = positions;
  }
  for (std::int32_t h = 0; h < spec_.num_qo_heads; ++h) {
    alibi_.push_back(std::ldexp(1.0f, -(h % 8) - 1));  // the usual 2^-k slopes
    sinks_.push_back(normal(rng) * 2.0f);
  }
}

void AttentionCase::build_table(std::mt19937& rng) {
  const std::int32_t ps = spec_.page_size;
  qo_indptr_ = {0};
  kv_indptr_ = {0};
  std::vector<std::int32_t> pages_per_seq;
  for (std::size_t b = 0; b < spec_.kv_lens.size(); ++b) {
    qo_indptr_.push_back(qo_indptr_.back() + spec_.q_lens[b]);
    kv_lens_.push_back(spec_.kv_lens[b]);
    const std::int32_t n = (spec_.kv_lens[b] + ps - 1) / ps;
    pages_per_seq.push_back(n);
    kv_indptr_.push_back(kv_indptr_.back() + n);
    last_page_len_.push_back(n == 0 ? 0 : spec_.kv_lens[b] - (n - 1) * ps);
  }
  num_pages_ = kv_indptr_.back() + 3;  // a few pages nobody uses
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages_));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  kv_indices_.assign(ids.begin(), ids.begin() + kv_indptr_.back());
}

float AttentionCase::kv_value(std::mt19937& rng) const {
  pagedattn::test::NormalFloats normal;
  return normal(rng);
}

void AttentionCase::fill_kv(std::mt19937& rng) {
  const CaseSpec& s = spec_;
  const std::size_t slots = std::size_t(num_pages_) * s.page_size * s.num_kv_heads;
  k_.assign(slots * s.head_dim * dtype_size(s.kv_dtype), 0);
  v_.assign(slots * s.v_head_dim * dtype_size(s.kv_dtype), 0);
  poison(k_, s.kv_dtype);
  poison(v_, s.kv_dtype);
  k_token_scales_.assign(slots, kNaN);
  v_token_scales_.assign(slots, kNaN);
  pagedattn::test::UniformFloats uniform(0.5f, 1.5f);
  for (std::int32_t h = 0; h < s.num_kv_heads; ++h) {
    k_head_scales_.push_back(kFp8TensorScale * uniform(rng));
    v_head_scales_.push_back(kFp8TensorScale * uniform(rng));
  }
  const PagedKVStorage st =
      PagedKVStorage::dense(k_.data(), v_.data(), s.kv_dtype, s.layout, s.page_size, s.num_kv_heads,
                            s.head_dim, s.v_head_dim, num_pages_);
  // Stored value for a real value x: divided by its dequantisation scale.
  auto store = [&](unsigned char* base, std::int64_t off, std::int32_t dim, float* token_scale,
                   float head_scale) {
    std::vector<float> x(static_cast<std::size_t>(dim));
    float amax = 0.0f;
    for (float& e : x) amax = std::max(amax, std::fabs(e = kv_value(rng)));
    float scale = 1.0f;
    if (s.kv_dtype == DType::kINT8) *token_scale = scale = amax / 127.0f;
    if (s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kFP8E5M2) scale = head_scale;
    for (std::int32_t d = 0; d < dim; ++d)
      store_from_float(base, s.kv_dtype, std::size_t(off + d), x[d] / scale);
  };
  for (std::size_t b = 0; b < kv_lens_.size(); ++b)
    for (std::int32_t j = 0; j < kv_lens_[b]; ++j) {
      const std::int32_t page = kv_indices_[kv_indptr_[b] + j / s.page_size];
      const std::int32_t slot = j % s.page_size;
      for (std::int32_t h = 0; h < s.num_kv_heads; ++h) {
        const std::int64_t ti = st.token_scale_index(page, h, slot);
        const float k_head = s.per_head_fp8_scales ? k_head_scales_[h] : kFp8TensorScale;
        const float v_head = s.per_head_fp8_scales ? v_head_scales_[h] : kFp8TensorScale;
        store(k_.data(), st.k_offset(page, h, slot), s.head_dim, &k_token_scales_[ti], k_head);
        store(v_.data(), st.v_offset(page, h, slot), s.v_head_dim, &v_token_scales_[ti], v_head);
      }
    }
}

AttentionParams AttentionCase::params(int which) {
  const CaseSpec& s = spec_;
  AttentionParams p;
  p.num_qo_heads = s.num_qo_heads;
  p.q = {q_.data(), s.q_dtype, std::int64_t{s.num_qo_heads} * s.head_dim, s.head_dim};
  p.o = {o_[which].data(), s.o_dtype, std::int64_t{s.num_qo_heads} * s.v_head_dim, s.v_head_dim};
  p.lse = s.with_lse ? lse_[which].data() : nullptr;
  p.table.batch_size = static_cast<std::int32_t>(kv_lens_.size());
  p.table.page_size = s.page_size;
  p.table.qo_indptr = qo_indptr_.data();
  p.table.kv_indptr = kv_indptr_.data();
  p.table.kv_indices = kv_indices_.data();
  p.table.kv_last_page_len = last_page_len_.data();
  p.table.kv_lens = kv_lens_.data();
  p.kv = PagedKVStorage::dense(k_.data(), v_.data(), s.kv_dtype, s.layout, s.page_size,
                               s.num_kv_heads, s.head_dim, s.v_head_dim, num_pages_);
  p.kv.k_scale = p.kv.v_scale = kFp8TensorScale;
  if (s.per_head_fp8_scales) {
    p.kv.k_head_scales = k_head_scales_.data();
    p.kv.v_head_scales = v_head_scales_.data();
  }
  p.kv.k_token_scales = k_token_scales_.data();
  p.kv.v_token_scales = v_token_scales_.data();
  p.options = s.options;
  p.options.alibi_slopes = s.alibi ? alibi_.data() : nullptr;
  p.options.sinks = s.sinks ? sinks_.data() : nullptr;
  p.options.key_rope = s.key_rope ? &rope_ : nullptr;
  return p;
}

std::vector<float> AttentionCase::output(int which) const {
  const std::size_t n = o_[which].size() / dtype_size(spec_.o_dtype);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = load_as_float(o_[which].data(), spec_.o_dtype, i);
  return out;
}

AttentionCase AttentionCase::contiguous() const {
  AttentionCase c;
  c.spec_ = spec_;
  const std::int32_t longest = std::max(1, *std::max_element(kv_lens_.begin(), kv_lens_.end()));
  c.spec_.page_size = longest;
  c.qo_indptr_ = qo_indptr_;
  c.kv_lens_ = kv_lens_;
  c.kv_indptr_ = {0};
  const std::size_t batch = kv_lens_.size();
  for (std::size_t b = 0; b < batch; ++b) {
    c.kv_indices_.push_back(static_cast<std::int32_t>(b));
    c.kv_indptr_.push_back(static_cast<std::int32_t>(b + 1));
    c.last_page_len_.push_back(kv_lens_[b]);
  }
  c.num_pages_ = static_cast<std::int64_t>(batch);
  const std::size_t es = dtype_size(spec_.kv_dtype);
  const std::size_t slots = std::size_t(c.num_pages_) * longest * spec_.num_kv_heads;
  c.k_.assign(slots * spec_.head_dim * es, 0);
  c.v_.assign(slots * spec_.v_head_dim * es, 0);
  c.k_token_scales_.assign(slots, 0.0f);
  c.v_token_scales_.assign(slots, 0.0f);
  c.k_head_scales_ = k_head_scales_;
  c.v_head_scales_ = v_head_scales_;
  const auto src = PagedKVStorage::dense(const_cast<unsigned char*>(k_.data()),
                                         const_cast<unsigned char*>(v_.data()), spec_.kv_dtype,
                                         spec_.layout, spec_.page_size, spec_.num_kv_heads,
                                         spec_.head_dim, spec_.v_head_dim, num_pages_);
  const auto dst =
      PagedKVStorage::dense(c.k_.data(), c.v_.data(), spec_.kv_dtype, spec_.layout, longest,
                            spec_.num_kv_heads, spec_.head_dim, spec_.v_head_dim, c.num_pages_);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::int32_t j = 0; j < kv_lens_[b]; ++j)
      for (std::int32_t h = 0; h < spec_.num_kv_heads; ++h) {
        const std::int32_t page = kv_indices_[kv_indptr_[b] + j / spec_.page_size];
        const std::int32_t slot = j % spec_.page_size;
        std::copy_n(&k_[std::size_t(src.k_offset(page, h, slot)) * es], spec_.head_dim * es,
                    &c.k_[std::size_t(dst.k_offset(std::int64_t(b), h, j)) * es]);
        std::copy_n(&v_[std::size_t(src.v_offset(page, h, slot)) * es], spec_.v_head_dim * es,
                    &c.v_[std::size_t(dst.v_offset(std::int64_t(b), h, j)) * es]);
        c.k_token_scales_[std::size_t(dst.token_scale_index(std::int64_t(b), h, j))] =
            k_token_scales_[std::size_t(src.token_scale_index(page, h, slot))];
        c.v_token_scales_[std::size_t(dst.token_scale_index(std::int64_t(b), h, j))] =
            v_token_scales_[std::size_t(src.token_scale_index(page, h, slot))];
      }
  c.q_ = q_;
  for (int w = 0; w < 2; ++w) {
    c.o_[w].assign(o_[w].size(), 0xcd);
    c.lse_[w].assign(lse_[w].size(), kNaN);
  }
  c.alibi_ = alibi_;
  c.sinks_ = sinks_;
  c.rope_cos_ = rope_cos_;
  c.rope_sin_ = rope_sin_;
  c.rope_ = rope_;
  c.rope_.cos_cache = c.rope_cos_.empty() ? nullptr : c.rope_cos_.data();
  c.rope_.sin_cache = c.rope_sin_.empty() ? nullptr : c.rope_sin_.data();
  return c;
}

Tolerance output_tolerance(DType o) {
  switch (o) {
    case DType::kF16:
      return {2e-3f, 2e-3f};  // 1 ulp of f16 near 1 is 1e-3
    case DType::kBF16:
      return {1.6e-2f, 1.6e-2f};  // 1 ulp of bf16 near 1 is 7.8e-3
    default:
      return {5e-5f, 5e-5f};
  }
}
namespace {
constexpr float kLseTolerance = 5e-5f;  // relative to max(1, |lse|)
}  // namespace

double output_row_tolerance(DType o) {
  switch (o) {
    case DType::kF16:
      return 0x1p-10 + 5e-5;
    case DType::kBF16:
      return 0x1p-7 + 5e-5;
    default:
      return 5e-5;
  }
}

double int8_dot_row_tolerance(const CaseSpec& spec) {
  const double d = spec.head_dim;
  const double spread =
      std::fabs(spec.options.scale.value_or(float(1.0 / std::sqrt(d)))) * std::sqrt(d);
  return kInt8DotRowTolerance * std::max(1.0, spread);
}

double dot_row_tolerance(const CaseSpec& spec, const CpuFeatures& used, DotProducts allowed) {
  namespace pb = pagedattn::bench;
  const DType kv = spec.kv_dtype;
  const std::int32_t v_dim = spec.v_head_dim ? spec.v_head_dim : spec.head_dim;
  const bool bf16_dot = allowed.bf16 && pb::kKernelUsesBf16Dot && used.avx512f &&
                        used.avx512_bf16 && kv != DType::kF32;
  const bool int8_dot = allowed.int8 && pb::kKernelUsesInt8Dot && used.avx512f &&
                        used.avx512_vnni && kv == DType::kINT8 &&
                        pb::attention_int8_dot_dims(spec.head_dim) &&
                        pb::attention_int8_dot_dims(v_dim) && spec.key_rope == 0;
  const bool f16_dot = allowed.f16 && pb::kKernelUsesF16Decode && used.avx512f &&
                       used.avx512_fp16 && (kv == DType::kFP8E4M3 || kv == DType::kF16) &&
                       pb::attention_f16_decode_dims(spec.head_dim, v_dim) && spec.key_rope == 0;
  return std::max({int8_dot ? int8_dot_row_tolerance(spec) : 0.0,
                   bf16_dot ? kBf16DotRowTolerance : 0.0, f16_dot ? kF16DotRowTolerance : 0.0});
}

RowTolerance tolerance_for(const CaseSpec& spec, const CpuFeatures& used, DotProducts allowed) {
  const double dot = dot_row_tolerance(spec, used, allowed);
  return {output_row_tolerance(spec.o_dtype) + dot, dot > 0.0 ? dot : kFp32LseTolerance};
}

RowError row_error(const std::vector<float>& want, const std::vector<float>& got, std::size_t row,
                   std::size_t dim) {
  RowError e;
  for (std::size_t i = row * dim; i < (row + 1) * dim; ++i) {
    e.err = std::max(e.err, double(std::fabs(got[i] - want[i])));
    e.scale = std::max(e.scale, double(std::fabs(want[i])));
  }
  return e;
}

double largest_row_error(const std::vector<float>& want, const std::vector<float>& got,
                         std::size_t dim) {
  double worst = 0.0;
  for (std::size_t row = 0; row * dim < want.size(); ++row) {
    const RowError e = row_error(want, got, row, dim);
    if (e.scale > 0.0) worst = std::max(worst, e.err / e.scale);
  }
  return worst;
}

namespace {

std::size_t output_dim(const CaseSpec& spec) {
  return static_cast<std::size_t>(spec.v_head_dim ? spec.v_head_dim : spec.head_dim);
}

}  // namespace

double largest_row_error(const AttentionCase& c) {
  return largest_row_error(c.output(0), c.output(1), output_dim(c.spec()));
}

void expect_rows_close(const AttentionCase& c, const RowTolerance& tol, const std::string& what) {
  const std::vector<float> want = c.output(0), got = c.output(1);
  const std::size_t dim = output_dim(c.spec());
  int reported = 0;
  for (std::size_t row = 0; row * dim < want.size(); ++row) {
    for (std::size_t i = row * dim; i < (row + 1) * dim; ++i)
      ASSERT_TRUE(std::isfinite(got[i])) << what << " output " << i << " is " << got[i];
    const auto [err, scale] = row_error(want, got, row, dim);
    if (err > tol.row * scale + 1e-6 && reported++ < 3)
      ADD_FAILURE() << what << " row " << row << ": max error " << err << " against row maximum "
                    << scale << " (tolerance " << tol.row << " of it)";
  }
  if (!c.spec().with_lse) return;
  for (std::size_t i = 0; i < c.lse(0).size(); ++i) {
    const float a = c.lse(0)[i], b = c.lse(1)[i];
    if (std::isinf(a)) {
      EXPECT_EQ(a, b) << what << " lse " << i;
    } else if (std::fabs(a - b) > tol.lse * std::max(1.0f, std::fabs(a)) && reported++ < 3) {
      ADD_FAILURE() << what << " lse " << i << ": reference " << a << ", kernel " << b;
    }
  }
}

void expect_close(const AttentionCase& c, const std::string& what) {
  const std::vector<float> want = c.output(0), got = c.output(1);
  const Tolerance tol = output_tolerance(c.spec().o_dtype);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " output " << i << " is " << got[i];
    if (std::fabs(want[i] - got[i]) > tol.abs + tol.rel * std::fabs(want[i]) && bad++ < 5)
      ADD_FAILURE() << what << " output " << i << ": reference " << want[i] << ", kernel "
                    << got[i];
  }
  if (!c.spec().with_lse) return;
  for (std::size_t i = 0; i < c.lse(0).size(); ++i) {
    const float a = c.lse(0)[i], b = c.lse(1)[i];
    if (std::isinf(a)) {
      EXPECT_EQ(a, b) << what << " lse " << i;
    } else if (std::fabs(a - b) > kLseTolerance * std::max(1.0f, std::fabs(a)) && bad++ < 5) {
      ADD_FAILURE() << what << " lse " << i << ": reference " << a << ", kernel " << b;
    }
  }
}

void for_each_highway_target(const std::function<void(std::int64_t)>& body) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  struct Reset {
    ~Reset() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    body(target);
  }
}

std::string describe_case(const CaseSpec& s) {
  std::ostringstream os;
  os << "seed " << s.seed << " heads (" << s.num_qo_heads << "," << s.num_kv_heads << ") dims ("
     << s.head_dim << "," << s.v_head_dim << ") page " << s.page_size << " q/o/kv "
     << dtype_name(s.q_dtype) << "/" << dtype_name(s.o_dtype) << "/" << dtype_name(s.kv_dtype)
     << (s.layout == KVLayout::kHND ? " HND" : " NHD") << " causal " << s.options.causal
     << " window " << s.options.window_left << " softcap " << s.options.softcap << " scale "
     << s.options.scale.value_or(0.0f) << " alibi " << s.alibi << " sinks " << s.sinks
     << " key_rope " << s.key_rope << " q/kv lens";
  for (std::size_t b = 0; b < s.kv_lens.size(); ++b)
    os << " " << s.q_lens[b] << "/" << s.kv_lens[b];
  return os.str();
}

}  // namespace pagedattn::testing
