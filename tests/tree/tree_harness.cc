#include "tree_harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>

#include "pagedattn/rope.h"
#include "support/random_floats.h"

namespace pagedattn::test {
namespace {

// Node `k` is `q` or one of its ancestors (walks q's parent links).
bool is_ancestor_or_self(const std::vector<std::int64_t>& parents, std::int64_t k, std::int64_t q) {
  for (std::int64_t n = q; n >= 0; n = parents[static_cast<std::size_t>(n)])
    if (n == k) return true;
  return false;
}

std::int64_t depth_of(const std::vector<std::int64_t>& parents, std::int64_t node) {
  std::int64_t depth = 0;
  for (std::int64_t n = parents[static_cast<std::size_t>(node)]; n >= 0;
       n = parents[static_cast<std::size_t>(n)])
    ++depth;
  return depth;
}

// Rotates x[dim] (neox halves) at position p, in double.
void rotate(std::vector<double>& x, std::int64_t p, const RopeConfig& rope) {
  const auto dim = static_cast<std::int32_t>(x.size()), half = dim / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const std::complex<double> z = std::complex<double>(x[i], x[i + half]) *
                                   std::polar(1.0, double(p) * rope_inv_freq(rope, dim, i));
    x[i] = z.real();
    x[i + half] = z.imag();
  }
}

// One [tokens][heads][dim] row of debug_get_kv output (all layers).
std::vector<double> kv_row(const std::vector<float>& all, std::int64_t tokens, std::int32_t layer,
                           std::int64_t token, std::int32_t head, std::int32_t heads,
                           std::int32_t dim) {
  const auto* row = all.data() + ((layer * tokens + token) * heads + head) * dim;
  return {row, row + dim};
}

}  // namespace

// GQA 12:4 (group 3), head_dim 48: shapes the other cache tests do not use.
KVCacheConfig tree_config(const TreeSetup& s) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 12;
  c.num_kv_heads = 4;
  c.head_dim = 48;
  c.kv_dtype = s.kv_dtype;
  c.page_size = s.page_size;
  c.num_pages = 4096 / s.page_size + 64;
  c.support_sliding_window = true;
  c.rope_mode = s.rope_mode;
  c.rope.theta = 10000.0f;
  c.rope.style = RopeStyle::kNeox;
  // f32 products: the harness checks the tree masks at f32's tolerance
  // (a tree's nodes are prefill rows, which by default may take bf16 tiles).
  c.attention_plan.fast_prefill_products = false;
  if (s.mla) {  // v_head_dim = head_dim keeps the harness's shapes; V still lives in K
    c.attention_kind = AttentionKind::kMLA;
    c.num_kv_heads = 1;
  }
  return c;
}

TreeHarness::TreeHarness(const TreeSetup& setup) : setup_(setup), cache_(tree_config(setup)) {}

void TreeHarness::add(SeqId id) {
  cache_.add_sequence(id);
  seqs_[id] = {};
}

std::vector<float> TreeHarness::random(std::size_t n) {
  pagedattn::test::NormalFloats normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng_);
  return x;
}

void TreeHarness::step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens) {
  const BatchPlan& plan = cache_.begin_forward(ids, lens);
  for (std::size_t i = 0; i < ids.size(); ++i) seqs_[ids[i]].committed += lens[i];
  EXPECT_FALSE(plan.has_tree);
  run_layers(plan);
}

void TreeHarness::tree_step(const std::vector<SeqId>& ids,
                            const std::vector<std::vector<std::int64_t>>& parents) {
  std::vector<std::int64_t> lens, flat;
  for (const auto& p : parents) {
    lens.push_back(std::ssize(p));
    flat.insert(flat.end(), p.begin(), p.end());
  }
  const BatchPlan& plan = cache_.begin_forward(ids, lens, flat);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto& mirror = seqs_[ids[i]].parents;
    mirror.insert(mirror.end(), parents[i].begin(), parents[i].end());
  }
  run_layers(plan);
}

void TreeHarness::run_layers(const BatchPlan& plan) {
  const KVCacheConfig& c = cache_.config();
  const std::int32_t tokens = plan.num_tokens(), d = c.head_dim;
  auto tensor = [&](std::vector<float>& x, std::int32_t heads) {
    return HeadTensor{x.data(), DType::kF32, std::int64_t{heads} * d, d};
  };
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<float> q = random(std::size_t(tokens) * c.num_qo_heads * d);
    std::vector<float> k = random(std::size_t(tokens) * c.num_kv_heads * d);
    std::vector<float> v = random(k.size()), out(q.size(), -1.0f);
    const bool mla = c.attention_kind == AttentionKind::kMLA;
    cache_.attention(layer, tensor(q, c.num_qo_heads), tensor(k, c.num_kv_heads),
                     mla ? HeadTensor{} : tensor(v, c.num_kv_heads), tensor(out, c.num_qo_heads));
    for (std::int32_t b = 0; b < plan.batch_size(); ++b) check_sequence(plan, b, layer, q, out);
  }
  cache_.end_forward();
  cache_.check_invariants();
}

// Dense attention in double over the keys the tree lets each query see.
void TreeHarness::check_sequence(const BatchPlan& plan, std::int32_t b, std::int32_t layer,
                                 const std::vector<float>& q, const std::vector<float>& out) {
  const KVCacheConfig& c = cache_.config();
  const Mirror& m = seqs_[plan.seq_ids[b]];
  const std::int64_t kv_len = plan.kv_lens[b];
  ASSERT_EQ(kv_len, m.committed + std::ssize(m.parents));
  const std::int32_t d = c.head_dim, hkv = c.num_kv_heads, group = c.num_qo_heads / hkv;
  std::vector<float> k(std::size_t(c.num_layers * kv_len) * hkv * d), v(k.size());
  cache_.debug_get_kv(plan.seq_ids[b], 0, kv_len, k, v);
  auto position = [&](std::int64_t j) {
    return j < m.committed ? j : m.committed + depth_of(m.parents, j - m.committed);
  };
  auto visible = [&](std::int64_t j, std::int64_t qi) {
    return j <= qi &&
           (j < m.committed || is_ancestor_or_self(m.parents, j - m.committed, qi - m.committed));
  };
  const double tol = is_quantized(c.kv_dtype) ? 2e-4 : 2e-5;
  const std::int32_t q_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
  for (std::int32_t i = plan.qo_indptr[b]; i < plan.qo_indptr[b + 1]; ++i) {
    const std::int64_t qi = kv_len - q_len + (i - plan.qo_indptr[b]);
    ASSERT_EQ(plan.positions[i], position(qi)) << "token " << i;
    for (std::int32_t h = 0; h < c.num_qo_heads; ++h) {
      const auto* qrow = q.data() + (std::int64_t{i} * c.num_qo_heads + h) * d;
      std::vector<double> qd(qrow, qrow + d);
      if (c.rope_mode != RopeMode::kNone) rotate(qd, position(qi), c.rope);
      std::vector<double> logits(std::size_t(kv_len), -INFINITY);
      double mx = -INFINITY;
      for (std::int64_t j = 0; j < kv_len; ++j) {
        if (!visible(j, qi)) continue;
        std::vector<double> kj = kv_row(k, kv_len, layer, j, h / group, hkv, d);
        if (c.rope_mode == RopeMode::kInline) rotate(kj, position(j), c.rope);
        double dot = 0;
        for (std::int32_t e = 0; e < d; ++e) dot += qd[e] * kj[e];
        logits[j] = dot / std::sqrt(double(d));
        mx = std::max(mx, logits[j]);
      }
      double denom = 0;
      std::vector<double> o(d, 0.0);
      for (std::int64_t j = 0; j < kv_len; ++j) {
        if (!visible(j, qi)) continue;
        const double w = std::exp(logits[j] - mx);
        denom += w;
        const std::vector<double> vj = kv_row(v, kv_len, layer, j, h / group, hkv, d);
        for (std::int32_t e = 0; e < d; ++e) o[e] += w * vj[e];
      }
      for (std::int32_t e = 0; e < d; ++e)
        ASSERT_NEAR(out[(std::int64_t{i} * c.num_qo_heads + h) * d + e], o[e] / denom, tol)
            << "layer " << layer << " seq " << plan.seq_ids[b] << " key index " << qi << " head "
            << h << " dim " << e;
    }
  }
}

void TreeHarness::commit(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& leaves) {
  const KVCacheConfig& c = cache_.config();
  const std::int64_t row = std::int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<std::vector<float>> before_k(ids.size()), before_v(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t len = cache_.sequence_length(ids[i]);
    before_k[i].resize(std::size_t(c.num_layers * len * row));
    before_v[i].resize(before_k[i].size());
    cache_.debug_get_kv(ids[i], 0, len, before_k[i], before_v[i]);
  }
  cache_.commit_accepted_token_tree_nodes(ids, leaves);
  cache_.check_invariants();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    Mirror& m = seqs_[ids[i]];
    const std::int64_t old_len = m.committed + std::ssize(m.parents);
    std::vector<std::int64_t> source;  // old token index of each kept token
    for (std::int64_t t = 0; t < m.committed; ++t) source.push_back(t);
    std::vector<std::int64_t> path;
    for (std::int64_t n = leaves[i]; n >= 0; n = m.parents[static_cast<std::size_t>(n)])
      path.insert(path.begin(), m.committed + n);
    source.insert(source.end(), path.begin(), path.end());
    const std::int64_t len = std::ssize(source);
    ASSERT_EQ(cache_.sequence_length(ids[i]), len);
    EXPECT_FALSE(cache_.has_open_token_tree(ids[i]));
    std::vector<float> k(std::size_t(c.num_layers * len * row)), v(k.size());
    cache_.debug_get_kv(ids[i], 0, len, k, v);
    for (std::int32_t layer = 0; layer < c.num_layers; ++layer)
      for (std::int64_t t = 0; t < len; ++t)
        for (std::int64_t e = 0; e < row; ++e) {
          const std::size_t now = std::size_t((layer * len + t) * row + e);
          const std::size_t was = std::size_t((layer * old_len + source[t]) * row + e);
          ASSERT_EQ(k[now], before_k[i][was])
              << "seq " << ids[i] << " layer " << layer << " token " << t;
          ASSERT_EQ(v[now], before_v[i][was])
              << "seq " << ids[i] << " layer " << layer << " token " << t;
        }
    m.committed = len;
    m.parents.clear();
  }
}

}  // namespace pagedattn::test
