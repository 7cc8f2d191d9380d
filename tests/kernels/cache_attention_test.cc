// Cache-level attention over multi-step scenarios (prefill, decode, fork,
// pop_n, sliding window) in every RoPE mode and several KV dtypes. Each
// step's output is checked against attention computed in double from what
// debug_get_kv returns - independent of the kernels and the page layout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "pagedattn/kv_cache.h"
#include "pagedattn/rope.h"
#include "support/random_floats.h"

namespace pagedattn {
namespace {

struct CacheSetup {
  DType kv_dtype = DType::kF16;
  RopeMode rope_mode = RopeMode::kNone;
  std::int32_t page_size = 4;
  bool mla = false;  // AttentionKind::kMLA: one [latent | rope] row per token, V = latent
};

KVCacheConfig make_config(const CacheSetup& s) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.page_size = s.page_size;
  c.num_pages = 256;
  c.kv_dtype = s.kv_dtype;
  c.k_scale = 0.05f;
  c.v_scale = 0.04f;
  c.support_sliding_window = true;
  c.rope_mode = s.rope_mode;
  c.rope.theta = 10000.0f;
  c.rope.style = RopeStyle::kNeox;
  // The f32 products, which `check` holds to a double reference over the
  // stored K/V; fp8's default fast products have product_paths_test.cc.
  c.attention_plan.fp8_fast_products = false;
  c.attention_plan.fast_prefill_products = false;
  if (s.mla) {
    c.attention_kind = AttentionKind::kMLA;
    c.num_kv_heads = 1;
    c.v_head_dim = 24;
    c.v_scale = c.k_scale;
  }
  return c;
}

// Rotates row x[dim] at position p in double (SEMANTICS.md, neox style).
void rotate(double* x, std::int32_t dim, std::int64_t p, const RopeConfig& rope) {
  for (std::int32_t i = 0; i < dim / 2; ++i) {
    const double angle = double(p) * rope_inv_freq(rope, dim, i);
    const double a = x[i], b = x[i + dim / 2];
    x[i] = a * std::cos(angle) - b * std::sin(angle);
    x[i + dim / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

class Scenario {
 public:
  explicit Scenario(const CacheSetup& s) : setup_(s), cache_(make_config(s)), rng_(7) {}

  PagedKVCache& cache() { return cache_; }

  // One step: append lens[i] tokens to ids[i] with random q/k/v, attend in
  // every layer, and compare each output with the reference.
  void step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens) {
    const BatchPlan& plan = cache_.begin_forward(ids, lens);
    const KVCacheConfig& c = cache_.config();
    const std::int32_t tokens = plan.num_tokens();
    for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
      std::vector<float> q = random(tokens * c.num_qo_heads * c.head_dim);
      std::vector<float> k = random(tokens * c.num_kv_heads * c.head_dim);
      std::vector<float> v = random(tokens * c.num_kv_heads * c.v_head_dim);
      std::vector<float> out(tokens * c.num_qo_heads * c.v_head_dim, -1.0f);
      const std::vector<float> q_copy = q, k_copy = k;
      const bool mla = c.attention_kind == AttentionKind::kMLA;  // V is k's head: none given
      cache_.attention(layer, tensor(q, c.num_qo_heads), tensor(k, c.num_kv_heads),
                       mla ? HeadTensor{} : tensor(v, c.num_kv_heads, c.v_head_dim),
                       tensor(out, c.num_qo_heads, c.v_head_dim));
      EXPECT_EQ(q, q_copy) << "attention modified the caller's q";
      EXPECT_EQ(k, k_copy) << "attention modified the caller's k";
      check(plan, layer, q, out);
    }
    cache_.end_forward();
    cache_.check_invariants();
  }

 private:
  HeadTensor tensor(std::vector<float>& x, std::int32_t heads, std::int32_t d = 0) {
    if (d == 0) d = cache_.config().head_dim;
    return {x.data(), DType::kF32, std::int64_t{heads} * d, d};
  }
  std::vector<float> random(std::size_t n) {
    pagedattn::test::NormalFloats normal;
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng_);
    return x;
  }

  void check(const BatchPlan& plan, std::int32_t layer, const std::vector<float>& q,
             const std::vector<float>& out) {
    const KVCacheConfig& c = cache_.config();
    const std::int32_t d = c.head_dim, dv = c.v_head_dim, group = c.num_qo_heads / c.num_kv_heads;
    const double tol = is_quantized(c.kv_dtype) ? 2e-4 : 2e-5;
    for (std::int32_t b = 0; b < plan.batch_size(); ++b) {
      const std::int64_t kv_len = plan.kv_lens[b];
      const std::int64_t per_layer = kv_len * c.num_kv_heads * d;
      const std::int64_t v_per_layer = kv_len * c.num_kv_heads * dv;
      std::vector<float> k(per_layer * c.num_layers), v(v_per_layer * c.num_layers);
      cache_.debug_get_kv(plan.seq_ids[b], 0, kv_len, k, v);
      for (std::int32_t i = plan.qo_indptr[b]; i < plan.qo_indptr[b + 1]; ++i) {
        const std::int64_t pos =
            kv_len - (plan.qo_indptr[b + 1] - plan.qo_indptr[b]) + (i - plan.qo_indptr[b]);
        EXPECT_EQ(plan.positions[i], pos);
        for (std::int32_t h = 0; h < c.num_qo_heads; ++h) {
          std::vector<double> qd(q.begin() + (std::int64_t{i} * c.num_qo_heads + h) * d,
                                 q.begin() + (std::int64_t{i} * c.num_qo_heads + h + 1) * d);
          if (c.rope_mode != RopeMode::kNone) rotate(qd.data(), d, pos, c.rope);
          std::vector<double> logits;
          double m = -INFINITY;
          for (std::int64_t j = 0; j <= pos; ++j) {
            std::vector<double> kj(d);
            for (std::int32_t e = 0; e < d; ++e)
              kj[e] = k[layer * per_layer + (j * c.num_kv_heads + h / group) * d + e];
            if (c.rope_mode == RopeMode::kInline) rotate(kj.data(), d, j, c.rope);
            double dot = 0;
            for (std::int32_t e = 0; e < d; ++e) dot += qd[e] * kj[e];
            logits.push_back(dot / std::sqrt(double(d)));
            m = std::max(m, logits.back());
          }
          double denom = 0;
          std::vector<double> o(dv, 0.0);
          for (std::int64_t j = 0; j <= pos; ++j) {
            const double w = std::exp(logits[j] - m);
            denom += w;
            for (std::int32_t e = 0; e < dv; ++e)
              o[e] += w * v[layer * v_per_layer + (j * c.num_kv_heads + h / group) * dv + e];
          }
          for (std::int32_t e = 0; e < dv; ++e)
            ASSERT_NEAR(out[(std::int64_t{i} * c.num_qo_heads + h) * dv + e], o[e] / denom, tol)
                << "layer " << layer << " seq " << plan.seq_ids[b] << " token " << i << " head "
                << h << " dim " << e;
        }
      }
    }
  }

  CacheSetup setup_;
  PagedKVCache cache_;
  std::mt19937 rng_;
};

class CacheAttention : public ::testing::TestWithParam<CacheSetup> {};

//   0 ──prefill 13── decode ×4 ──fork@17──> 3 ── decode ×3 (with 0, 1)
//   1 ──prefill 5─── decode ×4 ──pop 2───── decode ×3
//   2 ──prefill 9─── (window 8, sink 2) decode ×12
TEST_P(CacheAttention, PrefillDecodeForkPopAndWindowMatchReference) {
  Scenario s(GetParam());
  PagedKVCache& kv = s.cache();
  for (SeqId id : {0, 1, 2}) kv.add_sequence(id);
  s.step({0, 1, 2}, {13, 5, 9});
  for (int i = 0; i < 4; ++i) s.step({0, 1}, {1, 1});
  kv.fork_sequence(0, 3, 15);
  kv.pop_n(1, 2);
  for (int i = 0; i < 3; ++i) s.step({3, 0, 1}, {1, 2, 1});
  kv.enable_sliding_window(2, 8, 2);
  for (int i = 0; i < 12; ++i) s.step({2}, {1});
  EXPECT_EQ(kv.sequence_length(2), 8);
  s.step({0, 2, 3}, {6, 3, 0});  // chunked prefill beside a window and an empty append
}

INSTANTIATE_TEST_SUITE_P(ModesAndDtypes, CacheAttention,
                         ::testing::Values(CacheSetup{DType::kF16, RopeMode::kNone, 4},
                                           CacheSetup{DType::kF32, RopeMode::kNormal, 4},
                                           CacheSetup{DType::kBF16, RopeMode::kInline, 3},
                                           CacheSetup{DType::kF16, RopeMode::kInline, 16},
                                           CacheSetup{DType::kINT8, RopeMode::kNormal, 4},
                                           CacheSetup{DType::kFP8E4M3, RopeMode::kNone, 5},
                                           CacheSetup{DType::kFP8E5M2, RopeMode::kInline, 4},
                                           CacheSetup{DType::kBF16, RopeMode::kNone, 3, true},
                                           CacheSetup{DType::kINT8, RopeMode::kNone, 4, true},
                                           CacheSetup{DType::kFP8E4M3, RopeMode::kNone, 16, true}));

TEST(CacheAttentionErrors, ValidatesBeforeTouchingTheCacheAndKeepsTheStepUsable) {
  PagedKVCache kv(make_config(CacheSetup{}));
  kv.add_sequence(1);
  std::vector<float> q(3 * 8 * 32, 0.5f), k(3 * 2 * 32, 0.25f), v(k.size(), 1.0f), out(q.size());
  const HeadTensor tq{q.data(), DType::kF32, 8 * 32, 32}, tk{k.data(), DType::kF32, 2 * 32, 32},
      tv{v.data(), DType::kF32, 2 * 32, 32}, to{out.data(), DType::kF32, 8 * 32, 32};
  EXPECT_THROW(kv.attention(0, tq, tk, tv, to), InvalidState);  // no forward yet
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {3};
  kv.begin_forward(ids, lens);
  const std::uint64_t before = kv.state_digest();
  EXPECT_THROW(kv.attention(2, tq, tk, tv, to), InvalidArgument);
  HeadTensor bad = tk;
  bad.dtype = DType::kINT8;
  EXPECT_THROW(kv.attention(0, tq, bad, tv, to), InvalidArgument);
  bad = tq;
  bad.data = nullptr;
  EXPECT_THROW(kv.attention(0, bad, tk, tv, to), InvalidArgument);
  AttentionOptions opt;
  opt.window_left = -5;
  try {
    kv.attention(0, tq, tk, tv, to, opt);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("window_left = -5"));
  }
  EXPECT_EQ(kv.state_digest(), before);
  kv.attention(0, tq, tk, tv, to);  // still usable
  for (std::int32_t layer = 1; layer < kv.config().num_layers; ++layer)
    kv.attention(layer, tq, tk, tv, to);
  kv.end_forward();
  for (float x : out) EXPECT_NEAR(x, 1.0f, 1e-6f);
}

TEST(CacheAttentionErrors, FusedQkvMatchesSeparateTensors) {
  KVCacheConfig c = make_config(CacheSetup{DType::kF32, RopeMode::kNormal, 4});
  PagedKVCache a(c), b(c);
  const std::int32_t t = 5, hq = 8, hkv = 2, d = 32, width = (hq + 2 * hkv) * d;
  std::vector<float> qkv(t * width);
  std::mt19937 rng(1);
  pagedattn::test::NormalFloats normal;
  for (float& x : qkv) x = normal(rng);
  std::vector<float> q, k, v;
  for (int i = 0; i < t; ++i) {
    q.insert(q.end(), qkv.begin() + i * width, qkv.begin() + i * width + hq * d);
    k.insert(k.end(), qkv.begin() + i * width + hq * d, qkv.begin() + i * width + (hq + hkv) * d);
    v.insert(v.end(), qkv.begin() + i * width + (hq + hkv) * d, qkv.begin() + (i + 1) * width);
  }
  std::vector<float> out_a(t * hq * d), out_b(out_a.size());
  const std::vector<SeqId> ids = {4};
  const std::vector<std::int64_t> lens = {t};
  for (PagedKVCache* kv : {&a, &b}) {
    kv->add_sequence(4);
    kv->begin_forward(ids, lens);
  }
  a.attention_with_fused_qkv(1, {qkv.data(), DType::kF32, width, d},
                             {out_a.data(), DType::kF32, hq * d, d});
  b.attention(1, {q.data(), DType::kF32, hq * d, d}, {k.data(), DType::kF32, hkv * d, d},
              {v.data(), DType::kF32, hkv * d, d}, {out_b.data(), DType::kF32, hq * d, d});
  EXPECT_EQ(out_a, out_b);
}

}  // namespace
}  // namespace pagedattn

namespace pagedattn {
namespace {

// MLA stores one row per token: a page costs K's bytes only, and every
// call that would store or take a separate V refuses, naming it.
TEST(CacheAttentionErrors, MlaStoresNoVAndRefusesWhatWouldNeedOne) {
  KVCacheConfig c = make_config(CacheSetup{DType::kBF16, RopeMode::kNone, 4, true});
  KVCacheConfig mha = c;
  mha.attention_kind = AttentionKind::kMHA;
  PagedKVCache kv(c);
  EXPECT_EQ(kv.bytes_per_page(), std::int64_t{c.num_layers} * c.page_size * c.head_dim * 2);
  EXPECT_EQ(PagedKVCache(mha).bytes_per_page(),
            std::int64_t{c.num_layers} * c.page_size * (c.head_dim + c.v_head_dim) * 2);
  EXPECT_TRUE(kv.layer_storage(1).v_in_k);
  EXPECT_EQ(kv.layer_storage(1).v_data, kv.layer_storage(1).k_data);

  auto refuses = [](KVCacheConfig bad, const char* what) {
    try {
      PagedKVCache cache(bad);
      ADD_FAILURE() << "accepted " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(what));
    }
  };
  KVCacheConfig bad = c;
  bad.num_kv_heads = 2;
  refuses(bad, "num_kv_heads = 2");
  bad = c;
  bad.v_head_dim = c.head_dim + 1;
  refuses(bad, "v_head_dim = 33");
  bad = c;
  bad.rope_mode = RopeMode::kNormal;
  refuses(bad, "rope_mode = 1");
  bad = c;
  bad.v_scale = 2.0f;
  refuses(bad, "v_scale = 2");

  kv.add_sequence(1);
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {2};
  kv.begin_forward(ids, lens);
  const std::uint64_t before = kv.state_digest();
  std::vector<float> q(2 * 8 * 32, 0.5f), k(2 * 32, 0.25f), v(2 * 24, 1.0f), out(2 * 8 * 24);
  const HeadTensor tq{q.data(), DType::kF32, 8 * 32, 32}, tk{k.data(), DType::kF32, 32, 32},
      tv{v.data(), DType::kF32, 24, 24}, to{out.data(), DType::kF32, 8 * 24, 24};
  try {
    kv.attention(0, tq, tk, tv, to);
    ADD_FAILURE() << "accepted a v";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("v.data must be null"));
  }
  EXPECT_EQ(kv.state_digest(), before);
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) kv.attention(layer, tq, tk, {}, to);
  kv.end_forward();
  // Every key is k's row, so every output is the latent: k's first 24 values.
  for (float x : out) EXPECT_NEAR(x, 0.25f, 1e-6f);
  std::vector<float> k_back(2 * 2 * 32), v_back(2 * 2 * 24);
  kv.debug_get_kv(1, 0, 2, k_back, v_back);
  for (float x : v_back) EXPECT_EQ(x, 0.25f);
  EXPECT_THROW(kv.debug_set_kv(1, 0, 2, k_back, v_back), InvalidArgument);
  kv.debug_set_kv(1, 0, 2, k_back, {});
}

}  // namespace
}  // namespace pagedattn
