// An e4m3 cache decides per page and layer, when the page is written, whether
// it may hold a NaN code (PagedKVStorage::page_may_hold_nan), and attention
// trusts that flag instead of looking at the bytes it reads. Every way bytes
// reach the cache's pages must therefore flag a NaN code: append inside a
// step, a caller's own write declared by mark_layer_appended, debug_set_kv,
// copy-on-write after a fork, swap out and in, and a transfer's
// commit_incoming. Each test writes one NaN into one sequence and layer by
// one of them, then decodes: that sequence's rows in that layer must be NaN
// (a K NaN reaches every query row of its KV head), every other row finite.
// A missed flag shows as finite rows (the NaN-free decode reads the code as
// a number).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn {
namespace {

constexpr std::int32_t kLayers = 2, kQoHeads = 4, kKvHeads = 2, kDim = 16, kPageSize = 4;

KVCacheConfig e4m3_config() {
  KVCacheConfig c;
  c.num_layers = kLayers;
  c.num_qo_heads = kQoHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kDim;
  c.page_size = kPageSize;
  c.num_pages = 64;
  c.host_num_pages = 32;
  c.kv_dtype = DType::kFP8E4M3;
  return c;
}

HeadTensor tensor(std::vector<float>& x, std::int32_t heads) {
  return {x.data(), DType::kF32, std::int64_t{heads} * kDim, kDim};
}

// Whether each sequence's output rows hold a NaN, per layer: [layer][seq].
using NanRows = std::vector<std::vector<bool>>;

// Where the step writes a NaN K element: sequence, layer; none by default.
struct Poison {
  SeqId seq = -1;
  std::int32_t layer = -1;
};

class E4M3NanFlags : public ::testing::Test {
 protected:
  // One step appending lens[i] tokens to ids[i] (random finite values, or one
  // NaN K element where `poison` says), attending in every layer.
  NanRows step(PagedKVCache& kv, const std::vector<SeqId>& ids,
               const std::vector<std::int64_t>& lens, Poison poison = {}) {
    const BatchPlan& plan = kv.begin_forward(ids, lens);
    const std::int32_t tokens = plan.num_tokens();
    NanRows nan(kLayers, std::vector<bool>(ids.size(), false));
    for (std::int32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<float> q = random(tokens * kQoHeads), k = random(tokens * kKvHeads),
                         v = random(tokens * kKvHeads), out(q.size());
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == poison.seq && layer == poison.layer)
          k[std::size_t(plan.qo_indptr[i]) * kKvHeads * kDim + 3] = NAN;
      kv.attention(layer, tensor(q, kQoHeads), tensor(k, kKvHeads), tensor(v, kKvHeads),
                   tensor(out, kQoHeads));
      for (std::size_t i = 0; i < ids.size(); ++i)
        for (std::int32_t t = plan.qo_indptr[i]; t < plan.qo_indptr[i + 1]; ++t)
          for (std::int32_t e = 0; e < kQoHeads * kDim; ++e)
            if (std::isnan(out[std::size_t(t) * kQoHeads * kDim + std::size_t(e)]))
              nan[std::size_t(layer)][i] = true;
    }
    kv.end_forward();
    return nan;
  }

  // Decodes one token of each sequence and expects NaN rows exactly for the
  // poisoned sequences in `layer`.
  void expect_nan_only_in(PagedKVCache& kv, const std::vector<SeqId>& ids,
                          const std::vector<SeqId>& poisoned, std::int32_t layer) {
    const NanRows nan = step(kv, ids, std::vector<std::int64_t>(ids.size(), 1));
    for (std::int32_t l = 0; l < kLayers; ++l)
      for (std::size_t i = 0; i < ids.size(); ++i)
        EXPECT_EQ(nan[std::size_t(l)][i], l == layer && std::ranges::count(poisoned, ids[i]) > 0)
            << "seq " << ids[i] << " layer " << l;
  }

  std::vector<float> random(std::int32_t rows) {
    std::vector<float> x(std::size_t(rows) * kDim);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& e : x) e = u(rng_);
    return x;
  }

  // Two sequences of 6 tokens (a full page and half of the next).
  PagedKVCache two_sequences() {
    PagedKVCache kv(e4m3_config());
    kv.add_sequence(1);
    kv.add_sequence(2);
    step(kv, {1, 2}, {6, 6});
    return kv;
  }

  std::mt19937 rng_{11};
};

TEST_F(E4M3NanFlags, AppendInAStepFlagsItsPage) {
  PagedKVCache kv(e4m3_config());
  kv.add_sequence(1);
  kv.add_sequence(2);
  const NanRows prefill = step(kv, {1, 2}, {6, 6}, {.seq = 2, .layer = 1});
  EXPECT_EQ(prefill, (NanRows{{false, false}, {false, true}}));
  expect_nan_only_in(kv, {1, 2}, {2}, 1);
  expect_nan_only_in(kv, {1, 2}, {2}, 1);  // once flagged, it stays
}

TEST_F(E4M3NanFlags, ACallersOwnWriteIsFlaggedByMarkLayerAppended) {
  PagedKVCache kv = two_sequences();
  const std::vector<SeqId> ids = {1, 2};
  const std::vector<std::int64_t> lens = {1, 1};
  const BatchPlan& plan = kv.begin_forward(ids, lens);
  for (std::int32_t layer = 0; layer < kLayers; ++layer) {
    // As a caller's own kernel would: every new row written, one of them a
    // NaN code (K of sequence 1, layer 0).
    const PagedKVStorage s = kv.layer_storage(layer);
    for (std::size_t t = 0; t < plan.slot_mapping.size(); ++t) {
      const std::int64_t page = plan.slot_mapping[t] / kPageSize,
                         slot = plan.slot_mapping[t] % kPageSize;
      for (std::int32_t h = 0; h < kKvHeads; ++h) {
        auto* k = static_cast<std::uint8_t*>(s.k_data) + s.k_offset(page, h, slot);
        auto* v = static_cast<std::uint8_t*>(s.v_data) + s.v_offset(page, h, slot);
        std::memset(k, 0x30, kDim);
        std::memset(v, 0x30, kDim);
        if (t == 0 && h == 1 && layer == 0) k[5] = 0x7f;
      }
    }
    kv.mark_layer_appended(layer);
  }
  kv.end_forward();
  expect_nan_only_in(kv, {1, 2}, {1}, 0);
}

TEST_F(E4M3NanFlags, DebugSetKvFlagsWhatItWrites) {
  PagedKVCache kv = two_sequences();
  std::vector<float> k(std::size_t(kLayers) * kKvHeads * kDim, 0.5f), v = k;
  k[std::size_t(kKvHeads) * kDim + 2] = NAN;  // layer 1, head 0 of token 4 of sequence 2
  kv.debug_set_kv(2, 4, 5, k, v);
  expect_nan_only_in(kv, {1, 2}, {2}, 1);
}

TEST_F(E4M3NanFlags, CopyOnWriteAfterAForkKeepsTheFlag) {
  PagedKVCache kv(e4m3_config());
  kv.add_sequence(1);
  kv.add_sequence(2);
  step(kv, {1, 2}, {5, 5});
  step(kv, {1}, {1}, {.seq = 1, .layer = 0});  // token 5: page 1, slot 1
  kv.fork_sequence(1, 3);
  // Each appends into the shared half-full page 1: copy-on-write copies it.
  expect_nan_only_in(kv, {1, 2, 3}, {1, 3}, 0);
}

TEST_F(E4M3NanFlags, SwapOutAndInCarriesTheFlag) {
  PagedKVCache kv(e4m3_config());
  kv.add_sequence(1);
  kv.add_sequence(2);
  step(kv, {1, 2}, {6, 6}, {.seq = 1, .layer = 1});
  kv.swap_out(std::vector<SeqId>{1});
  kv.add_sequence(3);  // takes device pages the swapped sequence left
  step(kv, {3}, {8});
  kv.swap_in(std::vector<SeqId>{1});
  expect_nan_only_in(kv, {1, 2, 3}, {1}, 1);
}

TEST_F(E4M3NanFlags, CommitIncomingFlagsTheBytesThatLanded) {
  PagedKVCache sender(e4m3_config());
  sender.add_sequence(1);
  step(sender, {1}, {6}, {.seq = 1, .layer = 1});
  PagedKVCache receiver = two_sequences();
  const OutgoingKV out = sender.outgoing_pages(1);
  const KVPageRuns in = receiver.reserve_incoming(7, out.runs.num_tokens);
  ASSERT_EQ(in.layer_bytes, out.runs.layer_bytes);
  for (std::size_t layer = 0; layer < in.layers.size(); ++layer) {
    std::vector<std::byte> stream;
    for (const auto& run : out.runs.layers[layer])
      stream.insert(stream.end(), run.begin(), run.end());
    std::size_t at = 0;
    for (const auto& run : in.layers[layer]) {
      std::memcpy(run.data(), stream.data() + at, run.size());
      at += run.size();
    }
  }
  receiver.commit_incoming(7);
  sender.release_outgoing(out.id);
  expect_nan_only_in(receiver, {1, 2, 7}, {7}, 1);
}

}  // namespace
}  // namespace pagedattn
