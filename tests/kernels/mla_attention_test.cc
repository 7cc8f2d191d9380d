// Multi-head latent attention (DeepSeek-V2/V3) through paged_attention over
// latent storage (PagedKVStorage::latent: one [latent | rope key] row per
// token, V = the latent), checked against a float64 reference of the
// UNABSORBED formula: per-head keys [W_UK_h c | k_pe] and values W_UV_h c
// materialised from the stored latent, scores with [q_nope | q_pe]. The
// kernel sees absorbed queries [W_UK_h^T q_nope | q_pe] and returns outputs
// in the latent space, which W_UV_h maps back.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/sanitizers.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn {
namespace {

struct MlaSpec {
  std::int32_t heads = 16;
  std::int32_t latent = 512;  // kv_lora_rank
  std::int32_t rope = 64;     // qk_rope_head_dim
  std::int32_t nope = 128;    // qk_nope_head_dim
  std::int32_t v_dim = 128;   // v_head_dim (after W_UV)
  std::int32_t page_size = 16;
  std::vector<std::int32_t> q_lens, kv_lens;
  DType kv_dtype = DType::kBF16;
  AttentionPlanOptions plan{
      .fp8_fast_products = false, .fast_prefill_products = false, .measured_products = false};
  std::uint32_t seed = 1;
};

// [rows][cols] row-major, N(0, 1) / sqrt(cols): products keep unit scale.
std::vector<double> random_matrix(std::mt19937& rng, std::int64_t rows, std::int64_t cols) {
  std::normal_distribution<double> normal(0.0, 1.0 / std::sqrt(double(cols)));
  std::vector<double> m(static_cast<std::size_t>(rows * cols));
  for (double& x : m) x = normal(rng);
  return m;
}

class MlaCase {
 public:
  explicit MlaCase(const MlaSpec& s) : s_(s), rng_(s.seed) {
    const std::int32_t batch = std::int32_t(s.kv_lens.size());
    std::vector<std::int32_t> kv_indptr{0}, qo_indptr{0};
    for (std::int32_t b = 0; b < batch; ++b) {
      kv_indptr.push_back(kv_indptr.back() + (s.kv_lens[b] + s.page_size - 1) / s.page_size);
      qo_indptr.push_back(qo_indptr.back() + s.q_lens[b]);
    }
    num_pages_ = kv_indptr.back() + 3;  // spare pages nobody uses
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);  // pages out of order
    kv_indices_.assign(ids.begin(), ids.begin() + kv_indptr.back());
    kv_indptr_ = kv_indptr;
    qo_indptr_ = qo_indptr;
    for (std::int32_t b = 0; b < batch; ++b)
      last_page_len_.push_back((s.kv_lens[b] - 1) % s.page_size + 1);
    store_latent_rows();
    w_uk_ = random_matrix(rng_, std::int64_t{s.heads} * s.nope, s.latent);   // [h][nope][latent]
    w_uv_ = random_matrix(rng_, std::int64_t{s.heads} * s.v_dim, s.latent);  // [h][v][latent]
    const std::int64_t tokens = qo_indptr_.back();
    q_nope_ = random_matrix(rng_, tokens * s.heads, s.nope);
    q_pe_ = random_matrix(rng_, tokens * s.heads, s.rope);
    for (double& x : q_nope_) x *= std::sqrt(double(s.nope));  // unit-variance queries
    for (double& x : q_pe_) x *= std::sqrt(double(s.rope));
  }

  double scale() const { return 1.0 / std::sqrt(double(s_.nope + s_.rope)); }
  std::int32_t row_dim() const { return s_.latent + s_.rope; }

  // Kernel path: absorbed queries, latent outputs, W_UV applied in double.
  // [tokens][heads][v_dim], and the LSE [tokens][heads].
  std::vector<double> absorbed(std::vector<float>& lse) {
    const std::int64_t tokens = qo_indptr_.back(), d = row_dim();
    std::vector<float> q(static_cast<std::size_t>(tokens * s_.heads * d));
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int32_t h = 0; h < s_.heads; ++h) {
        float* row = q.data() + (t * s_.heads + h) * d;
        const double* qn = q_nope_.data() + (t * s_.heads + h) * s_.nope;
        for (std::int32_t l = 0; l < s_.latent; ++l) {
          double acc = 0.0;
          for (std::int32_t n = 0; n < s_.nope; ++n)
            acc += qn[n] * w_uk_[(std::size_t(h) * s_.nope + n) * s_.latent + l];
          row[l] = float(acc);
        }
        for (std::int32_t r = 0; r < s_.rope; ++r)
          row[s_.latent + r] = float(q_pe_[(t * s_.heads + h) * s_.rope + r]);
      }
    std::vector<float> o(static_cast<std::size_t>(tokens * s_.heads * s_.latent));
    lse.assign(std::size_t(tokens * s_.heads), 0.0f);
    AttentionParams p;
    p.q = {q.data(), DType::kF32, s_.heads * d, d};
    p.o = {o.data(), DType::kF32, std::int64_t{s_.heads} * s_.latent, s_.latent};
    p.lse = lse.data();
    p.num_qo_heads = s_.heads;
    p.table = table();
    p.kv = storage();
    p.options.scale = float(scale());
    AttentionRunner(s_.plan).run(p);
    std::vector<double> out(static_cast<std::size_t>(tokens * s_.heads * s_.v_dim));
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int32_t h = 0; h < s_.heads; ++h)
        for (std::int32_t v = 0; v < s_.v_dim; ++v) {
          const float* oh = o.data() + (t * s_.heads + h) * s_.latent;
          const double* w = w_uv_.data() + (std::size_t(h) * s_.v_dim + v) * s_.latent;
          double acc = 0.0;
          for (std::int32_t l = 0; l < s_.latent; ++l) acc += w[l] * oh[l];
          out[std::size_t((t * s_.heads + h) * s_.v_dim + v)] = acc;
        }
    return out;
  }

  // The unabsorbed formula in double over the stored (rounded) latent rows.
  std::vector<double> reference(std::vector<double>& lse) const {
    const std::int64_t tokens = qo_indptr_.back();
    std::vector<double> out(static_cast<std::size_t>(tokens * s_.heads * s_.v_dim));
    lse.assign(std::size_t(tokens * s_.heads), 0.0);
    for (std::size_t b = 0; b < s_.kv_lens.size(); ++b) {
      const std::int32_t kv_len = s_.kv_lens[b], q_len = s_.q_lens[b];
      std::vector<std::vector<double>> rows(static_cast<std::size_t>(kv_len));
      for (std::int32_t j = 0; j < kv_len; ++j) rows[std::size_t(j)] = stored_row(b, j);
      for (std::int32_t h = 0; h < s_.heads; ++h) {
        std::vector<std::vector<double>> k(static_cast<std::size_t>(kv_len)),
            v(static_cast<std::size_t>(kv_len));
        for (std::int32_t j = 0; j < kv_len; ++j) {  // materialised per-head K and V
          const std::vector<double>& c = rows[std::size_t(j)];
          for (std::int32_t n = 0; n < s_.nope; ++n)
            k[std::size_t(j)].push_back(
                dot(&w_uk_[(std::size_t(h) * s_.nope + n) * s_.latent], c.data(), s_.latent));
          k[std::size_t(j)].insert(k[std::size_t(j)].end(), c.begin() + s_.latent, c.end());
          for (std::int32_t e = 0; e < s_.v_dim; ++e)
            v[std::size_t(j)].push_back(
                dot(&w_uv_[(std::size_t(h) * s_.v_dim + e) * s_.latent], c.data(), s_.latent));
        }
        for (std::int32_t i = 0; i < q_len; ++i) {
          const std::int64_t t = qo_indptr_[b] + i;
          std::vector<double> q(q_nope_.begin() + (t * s_.heads + h) * s_.nope,
                                q_nope_.begin() + (t * s_.heads + h + 1) * s_.nope);
          q.insert(q.end(), q_pe_.begin() + (t * s_.heads + h) * s_.rope,
                   q_pe_.begin() + (t * s_.heads + h + 1) * s_.rope);
          const std::int32_t visible = kv_len - q_len + i + 1;  // causal, bottom-right
          std::vector<double> score(static_cast<std::size_t>(visible));
          double top = -INFINITY;
          for (std::int32_t j = 0; j < visible; ++j) {
            score[std::size_t(j)] = scale() * dot(q.data(), k[std::size_t(j)].data(), q.size());
            top = std::max(top, score[std::size_t(j)]);
          }
          double sum = 0.0;
          for (double& x : score) sum += (x = std::exp(x - top));
          double* o = &out[std::size_t((t * s_.heads + h) * s_.v_dim)];
          for (std::int32_t j = 0; j < visible; ++j)
            for (std::int32_t e = 0; e < s_.v_dim; ++e)
              o[e] += score[std::size_t(j)] / sum * v[std::size_t(j)][std::size_t(e)];
          lse[std::size_t(t * s_.heads + h)] = top + std::log(sum);
        }
      }
    }
    return out;
  }

 private:
  static double dot(const double* a, const double* b, std::size_t n) {
    double acc = 0.0;
    for (std::size_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
  }

  PagedKVTable table() const {
    PagedKVTable t;
    t.batch_size = std::int32_t(s_.kv_lens.size());
    t.page_size = s_.page_size;
    t.qo_indptr = qo_indptr_.data();
    t.kv_indptr = kv_indptr_.data();
    t.kv_indices = kv_indices_.data();
    t.kv_last_page_len = last_page_len_.data();
    t.kv_lens = s_.kv_lens.data();
    return t;
  }

  PagedKVStorage storage() {
    PagedKVStorage st = PagedKVStorage::latent(kv_.data(), s_.kv_dtype, KVLayout::kHND,
                                               s_.page_size, row_dim(), s_.latent, num_pages_);
    if (s_.kv_dtype == DType::kINT8) st.k_token_scales = token_scales_.data();
    if (is_fp8(s_.kv_dtype)) st.k_scale = 0.05f;
    st.share_k_scales_with_v();
    return st;
  }

  // Writes every key's [latent | rope] row through append_paged_kv, as the
  // cache does; unused slots hold NaN so a stray read shows.
  void store_latent_rows() {
    const std::int64_t slots = num_pages_ * s_.page_size, d = row_dim();
    kv_.assign(std::size_t(slots * d * dtype_size(s_.kv_dtype)), 0);
    token_scales_.assign(std::size_t(slots), 1.0f);
    PagedKVStorage st = storage();
    std::vector<float> nan_row(static_cast<std::size_t>(d), NAN);
    std::vector<std::int64_t> nan_slots(static_cast<std::size_t>(slots));
    std::iota(nan_slots.begin(), nan_slots.end(), 0);
    if (!is_quantized(s_.kv_dtype))  // quantised codes of NaN are not NaN: leave zeros
      for (std::int64_t slot : nan_slots)
        append_paged_kv({{nan_row.data(), DType::kF32, 0, d}, {}, &slot, 1, st});
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t b = 0; b < s_.kv_lens.size(); ++b) {
      const std::int32_t n = s_.kv_lens[b];
      std::vector<float> rows(static_cast<std::size_t>(n * d));
      for (float& x : rows) x = normal(rng_);
      std::vector<std::int64_t> slot(static_cast<std::size_t>(n));
      for (std::int32_t j = 0; j < n; ++j)
        slot[std::size_t(j)] =
            std::int64_t{kv_indices_[kv_indptr_[b] + j / s_.page_size]} * s_.page_size +
            j % s_.page_size;
      append_paged_kv({{rows.data(), DType::kF32, d, d}, {}, slot.data(), n, st});
    }
  }

  // Key j of sequence b as stored (dequantised), [latent | rope].
  std::vector<double> stored_row(std::size_t b, std::int32_t j) const {
    PagedKVStorage st = const_cast<MlaCase*>(this)->storage();
    const std::int64_t page = kv_indices_[kv_indptr_[b] + j / s_.page_size];
    const std::int64_t off = j % s_.page_size, base = st.k_offset(page, 0, off);
    const double scale = st.k_dequant(page, 0, off);
    std::vector<double> row(static_cast<std::size_t>(row_dim()));
    for (std::int32_t e = 0; e < row_dim(); ++e)
      row[std::size_t(e)] = scale * load_as_float(st.k_data, st.dtype, std::size_t(base + e));
    return row;
  }

  MlaSpec s_;
  std::mt19937 rng_;
  std::int64_t num_pages_ = 0;
  std::vector<std::int32_t> kv_indptr_, qo_indptr_, kv_indices_, last_page_len_;
  std::vector<unsigned char> kv_;
  std::vector<float> token_scales_;
  std::vector<double> w_uk_, w_uv_, q_nope_, q_pe_;
};

// Largest |kernel - reference| over every output, against the outputs' scale.
void expect_matches(MlaCase& c, double rel_tol) {
  std::vector<float> lse;
  std::vector<double> ref_lse;
  const std::vector<double> got = c.absorbed(lse), want = c.reference(ref_lse);
  double worst = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i;
    worst = std::max(worst, std::abs(got[i] - want[i]));
    largest = std::max(largest, std::abs(want[i]));
  }
  EXPECT_LE(worst, rel_tol * largest) << "largest output " << largest;
  for (std::size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lse[i], ref_lse[i], 1e-3 * (1.0 + std::abs(ref_lse[i]))) << "lse " << i;
}

// The case of `spec` stored as each of `dtypes`.
void expect_matches_in_each(MlaSpec spec, const std::vector<DType>& dtypes) {
  for (DType t : dtypes) {
    SCOPED_TRACE(dtype_name(t));
    spec.kv_dtype = t;
    MlaCase c(spec);
    expect_matches(c, 2e-5);
  }
}

TEST(MlaAttention, DeepSeekV2LiteDecodeAndPrefillMatchTheUnabsorbedFormula) {
  MlaSpec s;  // 16 heads, kv_lora_rank 512, rope 64, nope 128, v 128
  s.q_lens = {1, 1, 7, 1};
  s.kv_lens = {1, 21, 33, 70};
  // The double reference materialises every head's keys: ASan runs one dtype.
  const std::vector<DType> dtypes =
      core::kAddressSanitizer ? std::vector<DType>{DType::kBF16}
                              : std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16};
  expect_matches_in_each(s, dtypes);
}

TEST(MlaAttention, QuantisedRowsMatchTheUnabsorbedFormulaOverWhatIsStored) {
  MlaSpec s;
  s.q_lens = {1, 3};
  s.kv_lens = {70, 19};
  expect_matches_in_each(s, {DType::kINT8, DType::kFP8E4M3});
}

TEST(MlaAttention, DeepSeekV3HeadsWithSplitKv) {
  MlaSpec s;
  s.heads = 128;
  s.q_lens = {1, 1};
  s.kv_lens =
      core::kAddressSanitizer ? std::vector<std::int32_t>{20, 3} : std::vector<std::int32_t>{80, 9};
  s.plan.fixed_kv_chunk = core::kAddressSanitizer ? 8 : 16;  // partial states merged by LSE
  MlaCase c(s);
  expect_matches(c, 2e-5);
}

TEST(MlaAttention, RandomShapesWithTails) {
  std::mt19937 rng(7);
  auto pick = [&](std::int32_t lo, std::int32_t hi) {
    return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 12; ++trial) {
    MlaSpec s;
    s.heads = pick(1, 20);
    s.latent = pick(1, 80);
    s.rope = 2 * pick(1, 12);
    s.nope = pick(1, 40);
    s.v_dim = pick(1, 40);
    s.page_size = pick(1, 17);
    s.kv_dtype = std::array{DType::kF32, DType::kF16, DType::kBF16, DType::kINT8}[trial % 4];
    s.plan.fixed_kv_chunk = trial % 3 == 0 ? pick(1, 40) : 0;
    s.seed = std::uint32_t(trial + 100);
    for (std::int32_t b = pick(1, 4); b > 0; --b) {
      s.kv_lens.push_back(pick(1, 90));
      s.q_lens.push_back(pick(1, std::min(9, s.kv_lens.back())));
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": heads " << s.heads << ", latent "
                                      << s.latent << ", rope " << s.rope << ", page " << s.page_size
                                      << ", " << dtype_name(s.kv_dtype));
    MlaCase c(s);
    expect_matches(c, 5e-5);
  }
}

}  // namespace
}  // namespace pagedattn
