// engine::TeamAttention: a step's attention run by a team's threads writes
// the K/V the cache's own call writes (state_digest equal) and gives bitwise
// its outputs where the two plan alike, for teams of 1-4 threads, windows,
// prefill and decode rows, int8 and fp8 pages, and latent attention's
// layout (one row per token, its latent the value); it refuses what the
// cache's call would refuse, before any thread starts. The kernel inside a team
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
// Latent attention: one KV head of a 64-wide latent and 32 RoPE dims, the
// latent its value.
constexpr std::int32_t kLatent = 64, kLatentRow = kLatent + 32;

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

KVCacheConfig latent_config(DType kv_dtype) {
  KVCacheConfig c = config(kv_dtype);
  c.attention_kind = AttentionKind::kMLA;
  c.num_kv_heads = 1;
  c.head_dim = kLatentRow;
  c.v_head_dim = kLatent;
  return c;
}

// A layer's inputs side by side in each token's row of one buffer: q, k and
// v heads (as a fused projection writes them), or for a latent layout the
// query heads, then the cache row.
std::int32_t row_width(const KVCacheConfig& c) {
  const bool latent = c.attention_kind == AttentionKind::kMLA;
  return (c.num_qo_heads + c.num_kv_heads) * c.head_dim +
         (latent ? 0 : c.num_kv_heads * c.v_head_dim);
}
engine::TeamAttention::Tensors views(const KVCacheConfig& c, float* rows, float* out) {
  if (c.attention_kind != AttentionKind::kMLA)
    return engine::TeamAttention::fused_qkv(c, rows, out);
  const std::int32_t width = row_width(c), q_width = c.num_qo_heads * c.head_dim;
  return {{rows, DType::kF32, width, c.head_dim},
          {rows + q_width, DType::kF32, width, c.head_dim},
          {},
          {out, DType::kF32, std::int64_t{c.num_qo_heads} * c.v_head_dim, c.v_head_dim}};
}

// Layer 1 has a window; the others attend to every key. A softcap on layer 2.
std::vector<AttentionOptions> layer_options() {
  std::vector<AttentionOptions> o(kLayers);
  o[1].window_left = 40;
  o[2].softcap = 30.0f;
  return o;
}

// Per step and layer, rows [tokens][width] drawn from `rng`.
std::vector<float> draw(std::int64_t tokens, std::int32_t width, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(std::size_t(tokens) * std::size_t(width));
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
// else the cache's attention per layer (attention_with_fused_qkv where the
// rows are a fused projection's).
StepsResult steps(const KVCacheConfig& requested, bool in_team) {
  PagedKVCache cache(requested);
  const KVCacheConfig& config = cache.config();  // v_head_dim resolved
  const std::vector<AttentionOptions> options = layer_options();
  const bool latent = config.attention_kind == AttentionKind::kMLA;
  const std::int32_t width = row_width(config);
  std::mt19937 rng(7);
  StepsResult run;
  engine::TeamAttention team;
  for (SeqId s : {0, 1, 2}) cache.add_sequence(s);
  const auto step = [&](const std::vector<std::int64_t>& lens) {
    std::int64_t tokens = 0;
    for (std::int64_t n : lens) tokens += n;
    const StepId id = cache.begin_forward(std::vector<SeqId>{0, 1, 2}, lens).step_id;
    std::vector<std::vector<float>> rows;
    for (std::int32_t l = 0; l < kLayers; ++l) rows.push_back(draw(tokens, width, rng));
    std::vector<float> buffer(std::size_t(tokens) * std::size_t(width));
    std::vector<float> out(std::size_t(tokens) * std::size_t(config.num_qo_heads) *
                           std::size_t(config.v_head_dim));
    const auto keep = [&] { run.outputs.insert(run.outputs.end(), out.begin(), out.end()); };
    if (in_team) {
      team.prepare(cache, options, views(config, buffer.data(), out.data()), omp_get_max_threads());
      core::run_in_team(true, [&] {
        for (std::int32_t l = 0; l < kLayers; ++l) {
          core::on_one_thread([&] { buffer = rows[std::size_t(l)]; });
          core::for_row_ranges(std::int32_t(tokens), width,
                               [&](std::int32_t b, std::int32_t e) { team.append(l, b, e); });
          team.attend(l);
          core::on_one_thread(keep);
        }
      });
      team.finish(cache);
    } else {
      for (std::int32_t l = 0; l < kLayers; ++l) {
        const engine::TeamAttention::Tensors t =
            views(config, rows[std::size_t(l)].data(), out.data());
        if (latent)
          cache.attention(l, t.q, t.k, {}, t.out, options[std::size_t(l)], nullptr, -1, id);
        else
          cache.attention_with_fused_qkv(l, {rows[std::size_t(l)].data(), DType::kF32, width, kDim},
                                         t.out, options[std::size_t(l)], nullptr, -1, id);
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

void expect_team_gives_the_caches_call(const KVCacheConfig& config) {
  for (const int n : {1, 2, 3, 4}) {  // more than the machine may have is fine
    SCOPED_TRACE(n);
    const Threads threads(n);
    // Both plan for n threads: every step here costs more than the
    // planner's one-thread bar, so their items and splits agree.
    const StepsResult cache = steps(config, false), team = steps(config, true);
    EXPECT_EQ(team.digest, cache.digest);
    ASSERT_EQ(team.outputs.size(), cache.outputs.size());
    EXPECT_EQ(
        std::memcmp(team.outputs.data(), cache.outputs.data(), team.outputs.size() * sizeof(float)),
        0);
  }
}

TEST(TeamAttention, WritesTheCachesKVAndGivesItsOutputsForEveryTeamSize) {
  for (const DType kv : {DType::kF32, DType::kF16, DType::kINT8, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(kv));
    expect_team_gives_the_caches_call(config(kv));
  }
}

// Latent attention's layout (kMLA): one cache row per token, its latent the
// value, no V passed.
TEST(TeamAttention, LatentLayoutGivesTheCachesOwnCall) {
  for (const DType kv : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(kv));
    expect_team_gives_the_caches_call(latent_config(kv));
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
    EXPECT_THROW(team.prepare(cache, options, views(cache.config(), qkv.data(), out.data()), 2),
                 InvalidState);
    cache.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{8});
    const std::uint64_t before = cache.state_digest();
    EXPECT_THROW(team.prepare(cache, std::span(options).first(2),
                              views(cache.config(), qkv.data(), out.data()), 2),
                 InvalidArgument);
    EXPECT_THROW(team.prepare(cache, options, views(cache.config(), qkv.data(), out.data()), 0),
                 InvalidArgument);
    EXPECT_THROW(team.prepare(cache, options, views(cache.config(), nullptr, out.data()), 2),
                 InvalidArgument);
    std::vector<AttentionOptions> bad = options;
    bad[2].window_left = -5;
    EXPECT_THROW(team.prepare(cache, bad, views(cache.config(), qkv.data(), out.data()), 2),
                 InvalidArgument);
    EXPECT_EQ(cache.state_digest(), before);
    // Prepared but not finished: the step's K/V are not declared written.
    team.prepare(cache, options, views(cache.config(), qkv.data(), out.data()), 2);
    EXPECT_THROW(cache.end_forward(), InvalidState);
    team.finish(cache);
    cache.end_forward();
  }
  // Caches whose attention does more than this runs: RoPE applied by the
  // cache.
  KVCacheConfig rope = config(DType::kF16);
  rope.rope_mode = RopeMode::kNormal;
  PagedKVCache rotating(rope);
  EXPECT_FALSE(engine::TeamAttention::supports(rotating));
  rotating.add_sequence(0);
  rotating.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{8});
  EXPECT_THROW(team.prepare(rotating, options, views(rotating.config(), qkv.data(), out.data()), 2),
               InvalidArgument);
  EXPECT_TRUE(engine::TeamAttention::supports(PagedKVCache(latent_config(DType::kF16))));
  // A latent layout takes no V.
  PagedKVCache latent(latent_config(DType::kF16));
  latent.add_sequence(0);
  latent.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{8});
  std::vector<float> rows(8 * std::size_t(row_width(latent.config())));
  engine::TeamAttention::Tensors with_v = views(latent.config(), rows.data(), out.data());
  with_v.v = with_v.k;
  EXPECT_THROW(team.prepare(latent, options, with_v, 2), InvalidArgument);
  team.prepare(latent, options, views(latent.config(), rows.data(), out.data()), 2);
  team.finish(latent);
  latent.cancel_forward();
  EXPECT_TRUE(engine::TeamAttention::supports(PagedKVCache(config(DType::kF16))));
}

TEST(TeamAttention, KernelInATeamGivesItsOwnRegionsBitsAlsoWithMoreThreadsThanItsPlan) {
  PagedKVCache cache(config(DType::kF16));
  for (SeqId s : {0, 1}) cache.add_sequence(s);
  const BatchPlan& step =
      cache.begin_forward(std::vector<SeqId>{0, 1}, std::vector<std::int64_t>{600, 3});
  std::mt19937 rng(3);
  std::vector<float> qkv = draw(603, kQkvWidth, rng);
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
