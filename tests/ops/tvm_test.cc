// TVM-named cache entry points: the same cache as the C++ names, fused-QKV
// attention against the reference over the cache's own K/V, and the checks.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_test_support.h"
#include "pagedattn/ops/tvm.h"
#include "support/expect_error.h"

namespace pagedattn::ops::test {
namespace {

KVCacheConfig small_config() {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.page_size = 8;
  c.num_pages = 40;
  c.kv_dtype = DType::kF32;
  return c;
}

TEST(TvmNames, FusedQkvAttentionMatchesReferenceOverTwoSteps) {
  PagedKVCache cache(small_config());
  tvm::kv_state_add_sequence(cache, 1);
  tvm::kv_state_add_sequence(cache, 2);
  std::mt19937 rng(3);
  const std::int32_t hq = 6, hkv = 2, d = 32, row = (hq + 2 * hkv) * d;
  std::vector<std::vector<float>> k_seen(2), v_seen(2);
  for (const std::vector<std::int64_t>& lens : {std::vector<std::int64_t>{13, 4}, {1, 9}}) {
    const std::vector<std::int64_t> ids = {1, 2};
    tvm::kv_state_begin_forward(cache, ids, lens);
    const std::int64_t tokens = lens[0] + lens[1];
    std::vector<float> qkv = randn(rng, std::size_t(tokens) * row),
                       out(std::size_t(tokens) * hq * d);
    const float sm_scale = 1.0f / std::sqrt(float(d));
    tvm::attention_kv_cache_attention_with_fused_qkv(
        cache, {1, sm_scale, TensorView::dense(qkv.data(), DType::kF32, {tokens, hq + 2 * hkv, d}),
                TensorView::dense(out.data(), DType::kF32, {tokens, hq, d})});
    // The logical batch: every key so far, taken from qkv as it arrived.
    LogicalBatch logical{hq, hkv, d, {}, {}, {}, {}};
    std::int64_t t0 = 0;
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::int64_t t = t0; t < t0 + lens[b]; ++t) {
        logical.q.insert(logical.q.end(), qkv.begin() + t * row, qkv.begin() + t * row + hq * d);
        k_seen[b].insert(k_seen[b].end(), qkv.begin() + t * row + hq * d,
                         qkv.begin() + t * row + (hq + hkv) * d);
        v_seen[b].insert(v_seen[b].end(), qkv.begin() + t * row + (hq + hkv) * d,
                         qkv.begin() + (t + 1) * row);
      }
      logical.q_lens.push_back(static_cast<std::int32_t>(lens[b]));
      t0 += lens[b];
    }
    logical.k = k_seen;
    logical.v = v_seen;
    AttentionOptions options;
    options.scale = sm_scale;
    expect_close(out, reference_output(logical, options), 2e-4f, 2e-4f, "tvm fused qkv");
    // end_forward needs every layer's K/V of the step: layer 0 too.
    std::vector<float> layer0_out(out.size());
    tvm::attention_kv_cache_attention_with_fused_qkv(
        cache, {0, sm_scale, TensorView::dense(qkv.data(), DType::kF32, {tokens, hq + 2 * hkv, d}),
                TensorView::dense(layer0_out.data(), DType::kF32, {tokens, hq, d})});
    tvm::kv_state_end_forward(cache);
  }
  EXPECT_EQ(tvm::attention_kv_cache_get_total_sequence_length(cache), 27);
  tvm::kv_state_fork_sequence(cache, 1, 3, 5);
  tvm::kv_state_popn(cache, 3, 2);
  EXPECT_EQ(cache.sequence_length(3), 3);
  tvm::kv_state_remove_sequence(cache, 3);
  EXPECT_EQ(tvm::attention_kv_cache_get_num_available_pages(cache), cache.num_free_pages());
  cache.check_invariants();
}

TEST(TvmNames, SlidingWindowIsRetention) {
  KVCacheConfig c = small_config();
  c.support_sliding_window = true;
  PagedKVCache cache(c);
  tvm::kv_state_add_sequence(cache, 1);
  tvm::attention_kv_cache_enable_sliding_window_for_seq(cache, 1, 16, 4);
  const std::vector<std::int64_t> ids = {1}, lens = {40};
  tvm::kv_state_begin_forward(cache, ids, lens);
  for (std::int32_t l = 0; l < c.num_layers; ++l) cache.mark_layer_appended(l);  // no K/V needed
  tvm::kv_state_end_forward(cache);
  EXPECT_EQ(cache.sequence_length(1), 16);  // 4 sinks + the 12 most recent tokens
}

TEST(TvmNamesValidation, FusedQkvChecksShapesScaleAndStep) {
  PagedKVCache cache(small_config());
  tvm::kv_state_add_sequence(cache, 1);
  std::vector<float> qkv(5 * 10 * 32), out(5 * 6 * 32);
  auto params = [&] {
    return tvm::AttentionWithFusedQKVParams{0, 0.2f,
                                            TensorView::dense(qkv.data(), DType::kF32, {5, 10, 32}),
                                            TensorView::dense(out.data(), DType::kF32, {5, 6, 32})};
  };
  using pagedattn::test::expect_rejected;
  expect_rejected<InvalidState>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, params()); },
      {"tvm::attention_kv_cache_attention_with_fused_qkv: no forward is in progress"});
  const std::vector<std::int64_t> ids = {1}, lens = {5};
  tvm::kv_state_begin_forward(cache, ids, lens);
  auto p = params();
  p.qkv.shape[1] = 8;
  expect_rejected<InvalidArgument>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); },
      {"tvm::attention_kv_cache_attention_with_fused_qkv: qkv has shape [5, 8, 32], expected [5, "
       "10, 32]"});
  p = params();
  p.o.shape[0] = 4;
  expect_rejected<InvalidArgument>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); },
      {"o has shape [4, 6, 32], expected [5, 6, 32]"});
  p = params();
  p.sm_scale = NAN;
  expect_rejected<InvalidArgument>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); },
      {"sm_scale = nan must be finite"});
  p = params();
  p.layer_id = 2;
  expect_rejected<InvalidArgument>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); }, {"layer = 2"});
  p = params();
  p.o.dtype = DType::kFP8E4M3;
  expect_rejected<InvalidArgument>(
      cache, [&] { tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); },
      {"o has dtype float8_e4m3fn"});
  EXPECT_NO_THROW(tvm::attention_kv_cache_attention_with_fused_qkv(cache, params()));
}

}  // namespace
}  // namespace pagedattn::ops::test
