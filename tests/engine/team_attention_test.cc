// engine::TeamAttention: a step's attention run by a team's threads writes
// the K/V the cache's own call writes (state_digest equal) and gives bitwise
// its outputs where the two plan alike, for teams of 1-4 threads, windows,
// prefill and decode rows, int8 and fp8 pages; it refuses what the cache's
// call would refuse, before any thread starts. The kernel inside a team
// gives bitwise what it gives in its own region, also for a team larger
// than its plan.
#include "engine/team_attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/team.h"
#include "kernels/cpu/attention_cpu.h"
#include "pagedattn/errors.h"
#include "support/omp_threads.h"

namespace pagedattn {
namespace {

using Threads = test::OmpThreads;

constexpr std::int32_t kLayers = 3, kQoHeads = 6, kKvHeads = 2, kDim = 64;
constexpr std::int32_t kQkvWidth = (kQoHeads + 2 * kKvHeads) * kDim;

KVCacheConfig config(DType kv_dtype) {
  KVCacheConfig c;
  c.num_layers = kLayers;
  c.num_qo_heads = kQoHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kDim;
  c.page_size = 16;
  c.num_pages = 256;
  c.kv_dtype = kv_dtype;
  return c;
}

// Layer 1 has a window; the others attend to every key. A softcap on layer 2.
std::vector<AttentionOptions> layer_options() {
  std::vector<AttentionOptions> o(kLayers);
  o[1].window_left = 40;
  o[2].softcap = 30.0f;
  return o;
}

// Per step and layer, qkv [tokens][kQkvWidth] drawn from `rng`.
std::vector<float> draw(std::int64_t tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(std::size_t(tokens) * kQkvWidth);
  for (float& x : v) x = normal(rng);
  return v;
}

struct StepsResult {
  std::vector<float> outputs;  // every step's and layer's out, in order
  std::uint64_t digest = 0;
};

// Three steps on a fresh cache: prompts of 700 (KV split across threads),
// 30 and 5 tokens, then one decode row each, then a decode of two with a
// chunk of 9 for the third. `in_team`: engine::TeamAttention inside a team;
// else the cache's attention_with_fused_qkv per layer.
StepsResult steps(DType kv_dtype, bool in_team) {
  PagedKVCache cache(config(kv_dtype));
  const std::vector<AttentionOptions> options = layer_options();
  std::mt19937 rng(7);
  StepsResult run;
  engine::TeamAttention team;
  for (SeqId s : {0, 1, 2}) cache.add_sequence(s);
  const auto step = [&](const std::vector<std::int64_t>& lens) {
    std::int64_t tokens = 0;
    for (std::int64_t n : lens) tokens += n;
    const StepId id = cache.begin_forward(std::vector<SeqId>{0, 1, 2}, lens).step_id;
    std::vector<std::vector<float>> qkv;
    for (std::int32_t l = 0; l < kLayers; ++l) qkv.push_back(draw(tokens, rng));
    std::vector<float> buffer(std::size_t(tokens) * kQkvWidth);
    std::vector<float> out(std::size_t(tokens) * kQoHeads * kDim);
    const auto keep = [&] { run.outputs.insert(run.outputs.end(), out.begin(), out.end()); };
    if (in_team) {
      team.prepare(cache, options, buffer.data(), out.data(), omp_get_max_threads());
      core::run_in_team(true, [&] {
        for (std::int32_t l = 0; l < kLayers; ++l) {
          core::on_one_thread([&] { buffer = qkv[std::size_t(l)]; });
          core::for_row_ranges(std::int32_t(tokens), kQkvWidth,
                               [&](std::int32_t b, std::int32_t e) { team.append(l, b, e); });
          team.attend(l);
          core::on_one_thread(keep);
        }
      });
      team.finish(cache);
    } else {
      for (std::int32_t l = 0; l < kLayers; ++l) {
        cache.attention_with_fused_qkv(l,
                                       {qkv[std::size_t(l)].data(), DType::kF32, kQkvWidth, kDim},
                                       {out.data(), DType::kF32, kQoHeads * kDim, kDim},
                                       options[std::size_t(l)], nullptr, -1, id);
        keep();
      }
    }
    cache.end_forward(id);
  };
  step({700, 30, 5});
  step({1, 1, 1});
  step({1, 1, 9});
  run.digest = cache.state_digest();
  return run;
}

TEST(TeamAttention, WritesTheCachesKVAndGivesItsOutputsForEveryTeamSize) {
  for (const DType kv : {DType::kF32, DType::kF16, DType::kINT8, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(kv));
    for (const int n : {1, 2, 3, 4}) {  // more than the machine may have is fine
      SCOPED_TRACE(n);
      const Threads threads(n);
      // Both plan for n threads: every step here costs more than the
      // planner's one-thread bar, so their items and splits agree.
      const StepsResult cache = steps(kv, false), team = steps(kv, true);
      EXPECT_EQ(team.digest, cache.digest);
      ASSERT_EQ(team.outputs.size(), cache.outputs.size());
      EXPECT_EQ(std::memcmp(team.outputs.data(), cache.outputs.data(),
                            team.outputs.size() * sizeof(float)),
                0);
    }
  }
}

TEST(TeamAttention, RefusesBeforeAnyThreadStarts) {
  std::vector<float> qkv(8 * kQkvWidth), out(8 * kQoHeads * kDim);
  const std::vector<AttentionOptions> options = layer_options();
  engine::TeamAttention team;
  {
    PagedKVCache cache(config(DType::kF16));
    cache.add_sequence(0);
    // No step open.
    EXPECT_THROW(team.prepare(cache, options, qkv.data(), out.data(), 2), InvalidState);
    cache.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{8});
    const std::uint64_t before = cache.state_digest();
    EXPECT_THROW(team.prepare(cache, std::span(options).first(2), qkv.data(), out.data(), 2),
                 InvalidArgument);
    EXPECT_THROW(team.prepare(cache, options, qkv.data(), out.data(), 0), InvalidArgument);
    EXPECT_THROW(team.prepare(cache, options, nullptr, out.data(), 2), InvalidArgument);
    std::vector<AttentionOptions> bad = options;
    bad[2].window_left = -5;
    EXPECT_THROW(team.prepare(cache, bad, qkv.data(), out.data(), 2), InvalidArgument);
    EXPECT_EQ(cache.state_digest(), before);
    // Prepared but not finished: the step's K/V are not declared written.
    team.prepare(cache, options, qkv.data(), out.data(), 2);
    EXPECT_THROW(cache.end_forward(), InvalidState);
    team.finish(cache);
    cache.end_forward();
  }
  // Caches whose attention does more than this runs: RoPE applied by the
  // cache, latent attention.
  KVCacheConfig rope = config(DType::kF16);
  rope.rope_mode = RopeMode::kNormal;
  PagedKVCache rotating(rope);
  EXPECT_FALSE(engine::TeamAttention::supports(rotating));
  rotating.add_sequence(0);
  rotating.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{8});
  EXPECT_THROW(team.prepare(rotating, options, qkv.data(), out.data(), 2), InvalidArgument);
  KVCacheConfig latent = config(DType::kF16);
  latent.attention_kind = AttentionKind::kMLA;
  latent.num_qo_heads = 4;
  latent.num_kv_heads = 1;
  latent.head_dim = 96;
  latent.v_head_dim = 64;
  EXPECT_FALSE(engine::TeamAttention::supports(PagedKVCache(latent)));
  EXPECT_TRUE(engine::TeamAttention::supports(PagedKVCache(config(DType::kF16))));
}

TEST(TeamAttention, KernelInATeamGivesItsOwnRegionsBitsAlsoWithMoreThreadsThanItsPlan) {
  PagedKVCache cache(config(DType::kF16));
  for (SeqId s : {0, 1}) cache.add_sequence(s);
  const BatchPlan& step =
      cache.begin_forward(std::vector<SeqId>{0, 1}, std::vector<std::int64_t>{600, 3});
  std::mt19937 rng(3);
  std::vector<float> qkv = draw(603, rng);
  std::vector<float> out(std::size_t(603) * kQoHeads * kDim);
  cache.attention_with_fused_qkv(0, {qkv.data(), DType::kF32, kQkvWidth, kDim},
                                 {out.data(), DType::kF32, kQoHeads * kDim, kDim}, {});
  AttentionParams p;
  p.q = {qkv.data(), DType::kF32, kQkvWidth, kDim};
  p.num_qo_heads = kQoHeads;
  p.table = step.table();
  p.kv = cache.layer_storage(0);
  const AttentionShape shape{kQoHeads, kKvHeads, kDim, kDim};
  for (const int planned : {1, 2, 3}) {
    SCOPED_TRACE(planned);
    AttentionPlanOptions o;
    o.num_threads = planned;
    const AttentionPlan plan = plan_attention(p.table, shape, {}, o);
    std::vector<std::byte> workspace(plan.workspace_bytes + 64);
    std::byte* aligned =
        workspace.data() + (64 - reinterpret_cast<std::uintptr_t>(workspace.data()) % 64) % 64;
    std::vector<float> own(out.size()), team(out.size());
    p.o = {own.data(), DType::kF32, kQoHeads * kDim, kDim};
    kernels::run_attention_cpu(p, plan, aligned);
    for (const int n : {1, 2, 4}) {
      SCOPED_TRACE(n);
      const Threads threads(n);
      std::fill(team.begin(), team.end(), 0.0f);
      p.o = {team.data(), DType::kF32, kQoHeads * kDim, kDim};
      core::run_in_team(true, [&] { kernels::run_attention_cpu(p, plan, aligned); });
      EXPECT_EQ(std::memcmp(team.data(), own.data(), own.size() * sizeof(float)), 0);
    }
  }
  cache.cancel_forward();
}

}  // namespace
}  // namespace pagedattn
