// torch_xla ragged paged attention: parity with the scalar reference on
// torch_xla's test matrix (seq_lens (1,1328) (5,18) (500,563), heads (32,8)
// (8,1), page 16, window None/128, soft_cap None/10, sm_scale 1.0/0.5, fp8
// pages with scale 0.5, padded num_seqs), combined and split pages, and its
// validation rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "ops_test_support.h"
#include "pagedattn/ops/torch_xla.h"

namespace pagedattn::ops::test {
namespace {

using Params = torch_xla::RaggedPagedAttentionParams;

struct XlaSpec {
  std::vector<std::pair<std::int32_t, std::int32_t>> seqs;  // (q_len, kv_len)
  std::int32_t hq = 8, hkv = 1, head_dim = 128, page_size = 16;
  std::int32_t padding_seqs = 0, padding_tokens = 0;
  bool combined = true;
  DType q_dtype = DType::kF32, page_dtype = DType::kF32;
  float sm_scale = 1.0f;
  std::optional<float> kv_scale;
  std::optional<std::int32_t> sliding_window;
  std::optional<float> soft_cap;
  std::uint32_t seed = 1;
};

class XlaCase {
 public:
  explicit XlaCase(const XlaSpec& spec) : spec_(spec), rng_(spec.seed) {
    const auto live = static_cast<std::int32_t>(spec.seqs.size());
    max_seqs_ = live + spec.padding_seqs;
    const std::int32_t ps = spec.page_size;
    std::int32_t used = 0;
    for (const auto& [q, kv] : spec.seqs) {
      pages_per_seq_ = std::max(pages_per_seq_, (kv + ps - 1) / ps + 1);
      used += (kv + ps - 1) / ps;
    }
    num_pages_ = used + 2;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    // Padding rows and columns hold values that would fault if read.
    page_indices_.assign(std::size_t(max_seqs_) * pages_per_seq_, -99);
    kv_lens_.assign(std::size_t(max_seqs_), 1 << 30);
    cu_q_lens_.assign(std::size_t(max_seqs_) + 1, -5);
    cu_q_lens_[0] = 0;
    std::size_t next = 0;
    for (std::int32_t b = 0; b < live; ++b) {
      const auto [q, kv] = spec.seqs[std::size_t(b)];
      for (std::int32_t i = 0; i < (kv + ps - 1) / ps; ++i)
        page_indices_[std::size_t(b) * pages_per_seq_ + i] = ids[next++];
      kv_lens_[std::size_t(b)] = kv;
      cu_q_lens_[std::size_t(b) + 1] = cu_q_lens_[std::size_t(b)] + q;
    }
    num_seqs_ = {live};
    live_tokens_ = cu_q_lens_[std::size_t(live)];
    tokens_ = live_tokens_ + spec.padding_tokens;
    fill_pages();
    const std::vector<float> q =
        randn(rng_, std::size_t(tokens_) * spec.hq * spec.head_dim, spec.q_dtype);
    logical_.q.assign(q.begin(), q.begin() + std::size_t(live_tokens_) * spec.hq * spec.head_dim);
    q_.resize(q.size() * dtype_size(spec.q_dtype));
    for (std::size_t i = 0; i < q.size(); ++i) store_from_float(q_.data(), spec.q_dtype, i, q[i]);
    out_.assign(q_.size(), 0xcd);
  }

  Params params() {
    const std::int32_t hkv = spec_.hkv, d = spec_.head_dim, ps = spec_.page_size;
    Params p;
    p.q = TensorView::dense(q_.data(), spec_.q_dtype, {tokens_, spec_.hq, d});
    if (spec_.combined) {
      p.kv_pages = TensorView::dense(k_.data(), spec_.page_dtype, {num_pages_, ps, 2 * hkv, d});
    } else {
      p.k_pages =
          TensorView::dense(k_.data(), spec_.page_dtype, {num_pages_, ps, std::int64_t{hkv} * d});
      p.v_pages =
          TensorView::dense(v_.data(), spec_.page_dtype, {num_pages_, ps, std::int64_t{hkv} * d});
    }
    p.kv_lens = IndexView::dense(kv_lens_.data(), {max_seqs_});
    p.page_indices = IndexView::dense(page_indices_.data(), {max_seqs_, pages_per_seq_});
    p.cu_q_lens = IndexView::dense(cu_q_lens_.data(), {max_seqs_ + 1});
    p.num_seqs = IndexView::dense(num_seqs_.data(), {1});
    p.sm_scale = spec_.sm_scale;
    p.sliding_window = spec_.sliding_window;
    p.soft_cap = spec_.soft_cap;
    p.k_scale = p.v_scale = spec_.kv_scale;
    p.output = TensorView::dense(out_.data(), spec_.q_dtype, {tokens_, spec_.hq, d});
    return p;
  }

  void run_and_check() {
    torch_xla::ragged_paged_attention(params());
    AttentionOptions options;
    options.scale = spec_.sm_scale;  // torch_xla: sm_scale as given (default 1.0)
    if (spec_.sliding_window) options.window_left = *spec_.sliding_window - 1;  // W keys
    if (spec_.soft_cap) options.softcap = std::fabs(*spec_.soft_cap);
    std::vector<float> expected = reference_output(logical_, options);
    expected.resize(std::size_t(tokens_) * spec_.hq * spec_.head_dim, 0.0f);  // padding rows: zeros
    const float tol = spec_.q_dtype == DType::kF32 ? 3e-4f : 3e-2f;
    expect_close(decode(out_.data(), spec_.q_dtype, expected.size()), expected, tol, tol,
                 describe());
  }

  std::string describe() const {
    std::ostringstream os;
    os << "seed " << spec_.seed << " heads (" << spec_.hq << "," << spec_.hkv << ") "
       << (spec_.combined ? "kv_pages" : "k/v_pages") << " " << dtype_name(spec_.page_dtype)
       << " sm_scale " << spec_.sm_scale << " window " << spec_.sliding_window.value_or(0)
       << " soft_cap " << spec_.soft_cap.value_or(0) << " padding " << spec_.padding_seqs;
    return os.str();
  }

  std::vector<unsigned char> k_, v_;  // combined pages live in k_
  std::vector<std::int32_t> kv_lens_, page_indices_, cu_q_lens_, num_seqs_;

 private:
  // Writes every sequence's keys at their pages; logical K/V are the stored,
  // dequantised values.
  void fill_pages() {
    const std::int32_t hkv = spec_.hkv, d = spec_.head_dim, ps = spec_.page_size;
    const std::size_t page_elems = std::size_t(ps) * hkv * d;
    k_ = poisoned_buffer(page_elems * num_pages_ * (spec_.combined ? 2 : 1), spec_.page_dtype);
    if (!spec_.combined) v_ = poisoned_buffer(page_elems * num_pages_, spec_.page_dtype);
    const float scale = spec_.kv_scale.value_or(1.0f);
    logical_ = {spec_.hq, hkv, d, {}, {}, {}, {}};
    for (std::size_t b = 0; b < spec_.seqs.size(); ++b) {
      const auto [q_len, kv_len] = spec_.seqs[b];
      logical_.q_lens.push_back(q_len);
      std::vector<float> k = randn(rng_, std::size_t(kv_len) * hkv * d), v = randn(rng_, k.size());
      for (std::int32_t j = 0; j < kv_len; ++j) {
        const std::int64_t page = page_indices_[b * pages_per_seq_ + j / ps], slot = j % ps;
        for (std::int32_t h = 0; h < hkv; ++h)
          for (std::int32_t e = 0; e < d; ++e) {
            const std::size_t at = (std::size_t(j) * hkv + h) * d + e;
            std::size_t k_at, v_at;
            if (spec_.combined) {  // [page][slot][2 hkv][d], K at even heads
              k_at = std::size_t(((page * ps + slot) * 2 * hkv + 2 * h) * d + e);
              v_at = k_at + std::size_t(d);
            } else {
              k_at = v_at = std::size_t(((page * ps + slot) * hkv + h) * d + e);
            }
            auto& v_buf = spec_.combined ? k_ : v_;
            store_from_float(k_.data(), spec_.page_dtype, k_at, k[at] / scale);
            store_from_float(v_buf.data(), spec_.page_dtype, v_at, v[at] / scale);
            k[at] = load_as_float(k_.data(), spec_.page_dtype, k_at) * scale;
            v[at] = load_as_float(v_buf.data(), spec_.page_dtype, v_at) * scale;
          }
      }
      logical_.k.push_back(std::move(k));
      logical_.v.push_back(std::move(v));
    }
  }

  XlaSpec spec_;
  std::mt19937 rng_;
  std::int32_t max_seqs_ = 0, pages_per_seq_ = 0, tokens_ = 0, live_tokens_ = 0;
  std::int64_t num_pages_ = 0;
  LogicalBatch logical_;
  std::vector<unsigned char> q_, out_;
};

// The full matrix with seq_lens scaled by 1/10 (the double reference is
// slow); FullSizeSeqLens runs them as torch_xla does.
TEST(TorchXlaRaggedPagedAttention, MatchesReferenceOnTorchXlaMatrix) {
  for (std::uint32_t i = 0; i < 32; ++i) {
    XlaSpec s;
    s.seed = 500 + i;
    s.seqs = {{1, 133}, {5, 18}, {50, 56}};
    s.hq = i % 2 ? 32 : 8;
    s.hkv = i % 2 ? 8 : 1;
    s.head_dim = i % 2 ? 64 : 128;
    if ((i >> 1) & 1) s.sliding_window = 12;
    if ((i >> 2) & 1) s.soft_cap = i % 3 ? 10.0f : -10.0f;
    if ((i >> 3) & 1) s.sm_scale = 0.5f;
    if ((i >> 4) & 1) s.page_dtype = DType::kFP8E4M3, s.kv_scale = 0.5f;
    s.combined = i % 3 != 2;
    s.padding_seqs = i % 4;
    s.padding_tokens = i % 5;
    s.q_dtype = i % 7 == 3 ? DType::kBF16 : DType::kF32;
    XlaCase(s).run_and_check();
  }
}

TEST(TorchXlaRaggedPagedAttention, FullSizeSeqLens) {
  XlaSpec s;
  s.seqs = {{1, 1328}, {5, 18}, {500, 563}};
  s.hq = 8;
  s.hkv = 1;
  s.head_dim = 64;
  s.sliding_window = 128;
  s.soft_cap = 10.0f;
  s.padding_seqs = 2;
  s.padding_tokens = 3;
  XlaCase(s).run_and_check();
}

// sm_scale defaults to 1.0 (not 1/sqrt(D)): the default equals an explicit 1.0
// and differs from 1/sqrt(D).
TEST(TorchXlaRaggedPagedAttention, SmScaleDefaultsToOne) {
  Params defaults;
  EXPECT_EQ(defaults.sm_scale, 1.0f);
  XlaSpec s;
  s.seqs = {{3, 9}};
  XlaCase(s).run_and_check();  // the reference is given scale 1.0 explicitly
}

// --- validation ------------------------------------------------------------------

void expect_rejected(const std::function<void(Params&, XlaCase&)>& mutate,
                     const std::vector<std::string_view>& parts) {
  XlaSpec s;
  s.seqs = {{3, 20}, {1, 5}};
  s.hq = 4;
  s.hkv = 2;
  s.head_dim = 32;
  s.padding_seqs = 1;
  XlaCase c(s);
  Params p = c.params();
  mutate(p, c);
  expect_invalid([&] { torch_xla::ragged_paged_attention(p); }, parts, {&c.k_});
}

TEST(TorchXlaValidation, TorchXlaRulesWithTheirMessages) {
  expect_rejected([](Params& p, XlaCase&) { p.kv_pages->shape[3] = 16; },
                  {"Q head_dim 32 must be the same as that of K/V 16"});
  expect_rejected([](Params& p, XlaCase&) { p.kv_pages->shape[2] = 3; },
                  {"num_combined_kv_heads = 3", "must be even"});
  expect_rejected(
      [](Params& p, XlaCase&) {
        p.q.shape[1] = 3;
        p.output.shape[1] = 3;
      },
      {"num_q_heads=3 must be divisible by num_kv_heads=2"});
  expect_rejected([](Params& p, XlaCase&) { p.kv_lens.type = IndexType::kInt64; },
                  {"kv_lens has dtype int64, expected int32"});
  expect_rejected([](Params& p, XlaCase&) { p.cu_q_lens.type = IndexType::kInt64; },
                  {"cu_q_lens has dtype int64, expected int32"});
  expect_rejected([](Params& p, XlaCase&) { p.sliding_window = 0; },
                  {"sliding_window=0 must be positive."});
  expect_rejected([](Params& p, XlaCase&) { p.soft_cap = 0.0f; }, {"soft_cap=0 must not be 0.0."});
  expect_rejected([](Params&, XlaCase& c) { c.num_seqs_[0] = 4; },
                  {"num_seqs[0]=4 must be less or equal to max_num_seqs=3"});
  expect_rejected([](Params&, XlaCase& c) { c.kv_lens_[1] = 60; },
                  {"pages_per_seq=3 must be greater or equal to min_pages_per_seq=4 given "
                   "max_kv_len=60 and page_size=16."});
  expect_rejected([](Params&, XlaCase& c) { c.kv_lens_[1] = 0; },
                  {"q_len=1 must be less or equal to kv_len=0 at sequence 1."});
  expect_rejected([](Params& p, XlaCase&) { p.num_seqs.shape[0] = 2; },
                  {"num_seqs has shape [2], expected [1]"});
  expect_rejected([](Params& p, XlaCase&) { p.kv_lens.shape[0] = 2; },
                  {"kv_lens has shape [2], expected [3]"});
}

TEST(TorchXlaValidation, BoundsTorchXlaLeavesUnchecked) {
  expect_rejected([](Params&, XlaCase& c) { c.page_indices_[1] = 7; },
                  {"page_indices[0][1] = 7 is outside [0, 5)"});
  expect_rejected([](Params&, XlaCase& c) { c.page_indices_[3] = -1; },
                  {"page_indices[1][0] = -1"});
  expect_rejected(
      [](Params&, XlaCase& c) {
        c.cu_q_lens_[1] = 5;
        c.cu_q_lens_[2] = 4;
      },
      {"cu_q_lens[2] = 4 is less than cu_q_lens[1] = 5"});
  expect_rejected([](Params&, XlaCase& c) { c.cu_q_lens_[0] = 1; }, {"cu_q_lens[0] = 1 must be 0"});
  expect_rejected([](Params&, XlaCase& c) { c.cu_q_lens_[2] = 5; },
                  {"cu_q_lens[2] = 5 exceeds the token count 4"});
  expect_rejected([](Params&, XlaCase& c) { c.kv_lens_[0] = -3; }, {"kv_lens[0] = -3"});
  expect_rejected([](Params& p, XlaCase&) { p.output.dtype = DType::kF16; },
                  {"output has dtype float16, expected float32"});
  expect_rejected([](Params& p, XlaCase&) { p.q.strides[2] = 2; },
                  {"q must have a contiguous last axis"});
  expect_rejected([](Params& p, XlaCase&) { p.k_scale = 0.5f; },
                  {"k_scale is only supported with float8 pages"});
  expect_rejected([](Params& p, XlaCase&) { p.k_pages = p.kv_pages; },
                  {"give either kv_pages or both k_pages and v_pages"});
  expect_rejected([](Params& p, XlaCase&) { p.kv_pages->dtype = DType::kINT8; },
                  {"kv_pages has dtype int8"});
  expect_rejected([](Params& p, XlaCase&) { p.sm_scale = NAN; }, {"sm_scale = nan must be finite"});
  expect_rejected([](Params& p, XlaCase&) { p.page_indices.shape[1] = 1 << 30; },
                  {"num_seqs * pages_per_seq = 2 x 1073741824 overflows int32"});
}

TEST(TorchXlaValidation, PaddingEntriesAreIgnored) {
  XlaSpec s;
  s.seqs = {{3, 20}};
  s.padding_seqs = 3;  // their kv_lens are 2^30 and page ids -99
  s.padding_tokens = 2;
  XlaCase(s).run_and_check();
}

}  // namespace
}  // namespace pagedattn::ops::test
