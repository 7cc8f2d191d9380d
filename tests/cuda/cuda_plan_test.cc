// plan_cuda_attention and the run's checks on the host: these need no GPU and
// run in CI. Work items must cover every (sequence, query head, token) row
// exactly once per visible key, within the kernels' row limits, with the
// partial slots and merge tasks that put split rows back together.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <tuple>

#include "attention_case.h"
#include "kernels/cuda/device_args.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::testing {
namespace {

using cuda::CudaAttentionPlan;
using cuda::CudaPlanOptions;
using cuda::CudaWorkItem;

CudaPlanOptions h200_like() {
  CudaPlanOptions o;
  o.num_sms = 132;
  o.max_shared_bytes = 227 * 1024;
  return o;
}

CaseSpec spec_with(std::vector<std::int32_t> q_lens, std::vector<std::int32_t> kv_lens,
                   std::int32_t qo_heads, std::int32_t kv_heads) {
  CaseSpec s;
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.num_qo_heads = qo_heads;
  s.num_kv_heads = kv_heads;
  s.kv_dtype = DType::kBF16;
  s.q_dtype = s.o_dtype = DType::kBF16;
  return s;
}

std::int32_t rows_of(const CudaWorkItem& w) {
  return (w.q_end - w.q_begin) * (w.qo_head_end - w.qo_head_begin);
}

// Every row (b, head, token) gets keys [0, kv_len) clipped by causality
// exactly once, each item stays within one KV head and the kernel's rows,
// and split items are exactly the merges' partial slots.
void expect_covering(const CudaAttentionPlan& plan, const CaseSpec& s) {
  const std::int32_t group = s.num_qo_heads / s.num_kv_heads;
  std::map<std::tuple<int, int, int>, std::int64_t> keys_of_row;
  std::vector<int> partial_seen(static_cast<std::size_t>(plan.num_partials), 0);
  const auto visit = [&](const std::vector<CudaWorkItem>& items, std::int32_t max_rows) {
    for (const CudaWorkItem& w : items) {
      EXPECT_LE(rows_of(w), max_rows);
      EXPECT_EQ(w.qo_head_begin / group, (w.qo_head_end - 1) / group) << "one KV head per item";
      EXPECT_LE(w.kv_begin, w.kv_end);
      if (w.partial >= 0) ++partial_seen[static_cast<std::size_t>(w.partial)];
      for (int h = w.qo_head_begin; h < w.qo_head_end; ++h)
        for (int t = w.q_begin; t < w.q_end; ++t)
          keys_of_row[{w.batch, h, t}] += w.kv_end - w.kv_begin;
    }
  };
  visit(plan.decode_items, cuda::detail::kDecodeMaxRows);
  visit(plan.prefill_items, cuda::detail::kPrefillRows);
  for (int v : partial_seen) EXPECT_EQ(v, 1) << "every partial slot is written once";
  std::int32_t merged = 0;
  for (const auto& m : plan.merges) merged += m.num_partials;
  EXPECT_EQ(merged, plan.num_partials);
  for (std::size_t b = 0; b < s.q_lens.size(); ++b)
    for (int h = 0; h < s.num_qo_heads; ++h)
      for (int t = 0; t < s.q_lens[b]; ++t) {
        // The tile of a row sees the keys of its whole token range: at
        // least the row's own causal keys, at most every key.
        const auto it = keys_of_row.find({static_cast<int>(b), h, t});
        ASSERT_NE(it, keys_of_row.end()) << "row (" << b << "," << h << "," << t << ") missing";
        EXPECT_GE(it->second, s.kv_lens[b] - s.q_lens[b] + t + 1);
        EXPECT_LE(it->second, s.kv_lens[b]);
      }
}

TEST(CudaPlan, DecodeBatchPacksEachGroupIntoOneItem) {
  CaseSpec s = spec_with({1, 1, 1, 1}, {100, 1000, 5, 0}, 32, 8);
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  EXPECT_TRUE(plan.prefill_items.empty());
  for (const CudaWorkItem& w : plan.decode_items) EXPECT_EQ(w.qo_head_end - w.qo_head_begin, 4);
  expect_covering(plan, s);
  EXPECT_EQ(plan.decode.grid, plan.decode_items.size());
  EXPECT_GT(plan.decode.threads, 0u);
}

TEST(CudaPlan, LongPromptsGoToPrefillTilesOfAtMostSixtyFourRows) {
  CaseSpec s = spec_with({300, 1, 7}, {300, 4000, 7}, 32, 8);
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  EXPECT_FALSE(plan.prefill_items.empty());
  EXPECT_FALSE(plan.decode_items.empty());
  expect_covering(plan, s);
}

TEST(CudaPlan, LatentGroupsLargerThanATileSplitTheirHeads) {
  CaseSpec s = spec_with({1, 3}, {50, 60}, 128, 1);
  s.head_dim = 576;
  s.v_head_dim = 512;
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  EXPECT_TRUE(plan.decode_items.empty());
  for (const CudaWorkItem& w : plan.prefill_items) EXPECT_EQ(w.q_end - w.q_begin, 1);
  expect_covering(plan, s);
}

TEST(CudaPlan, FewLongSequencesAreSplitToFillTheSms) {
  CaseSpec s = spec_with({1, 1}, {32768, 9000}, 32, 8);
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  EXPECT_GE(plan.decode_items.size(), 132u);
  EXPECT_EQ(plan.merges.size(), 16u);  // 2 sequences x 8 KV heads, all split
  expect_covering(plan, s);
  for (std::size_t i = 1; i < plan.decode_items.size(); ++i)
    EXPECT_GE(plan.decode_items[i - 1].kv_end - plan.decode_items[i - 1].kv_begin,
              plan.decode_items[i].kv_end - plan.decode_items[i].kv_begin)
        << "longest first";
}

TEST(CudaPlan, FixedChunksDoNotDependOnTheBatch) {
  CaseSpec s = spec_with({1}, {1000}, 8, 8);
  AttentionCase alone(s);
  CudaPlanOptions o = h200_like();
  o.fixed_kv_chunk = 256;
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(alone.params(1), o);
  for (const CudaWorkItem& w : plan.decode_items) {
    EXPECT_EQ(w.kv_begin % 256, 0);
    EXPECT_LE(w.kv_end - w.kv_begin, 256);
  }
  EXPECT_EQ(plan.decode_items.size(), 8u * 4u);
}

TEST(CudaPlan, WorkspaceHoldsTheItemsAtAlignedOffsets) {
  CaseSpec s = spec_with({1, 100}, {5000, 100}, 16, 4);
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  for (std::size_t offset : {plan.decode_items_offset, plan.prefill_items_offset,
                             plan.merges_offset, plan.partial_out_offset, plan.partial_lse_offset})
    EXPECT_EQ(offset % 256, 0u);
  ASSERT_EQ(plan.host_image.size(), plan.partial_out_offset);
  ASSERT_FALSE(plan.decode_items.empty());
  CudaWorkItem first;
  std::memcpy(&first, plan.host_image.data() + plan.decode_items_offset, sizeof first);
  EXPECT_EQ(first.kv_end, plan.decode_items[0].kv_end);
  EXPECT_GE(plan.workspace_bytes, plan.partial_lse_offset + sizeof(float) * plan.num_partials *
                                                                std::size_t(plan.max_rows));
  EXPECT_EQ(plan.merge.grid, plan.merges.size() * std::size_t(plan.max_rows));
}

TEST(CudaPlan, RefusesWhatTheKernelsDoNotServeByName) {
  CaseSpec s = spec_with({1}, {10}, 8, 8);
  s.kv_dtype = DType::kF32;
  AttentionCase f32(s);
  EXPECT_THROW(cuda::plan_cuda_attention(f32.params(1), h200_like()), Unsupported);
  s.kv_dtype = DType::kF16;
  s.key_rope = 1;
  AttentionCase rope(s);
  EXPECT_THROW(cuda::plan_cuda_attention(rope.params(1), h200_like()), Unsupported);
  s.key_rope = 0;
  AttentionCase ok(s);
  AttentionParams p = ok.params(1);
  std::int32_t bad_index = 99999;
  p.table.kv_indices = &bad_index;
  EXPECT_THROW(cuda::plan_cuda_attention(p, h200_like()), InvalidArgument);
  CudaPlanOptions tiny = h200_like();
  tiny.max_shared_bytes = 256;
  try {
    cuda::plan_cuda_attention(ok.params(1), tiny);
    FAIL() << "a tile larger than the shared memory was planned";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
  }
}

TEST(CudaPlan, PlanningWithoutADeviceNeedsTheSmCount) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a device is present";
  AttentionCase c(spec_with({1}, {10}, 8, 8));
  EXPECT_THROW(cuda::plan_cuda_attention(c.params(1)), Unsupported);
  EXPECT_FALSE(cuda::no_device_reason().empty());
}

// The run checks its params against the plan before any CUDA call, so these
// run without a GPU (the pointers are never read).
TEST(CudaPlan, RunRejectsParamsOfAnotherPlanBeforeTouchingTheDevice) {
  AttentionCase c(spec_with({1}, {40}, 8, 8));
  const AttentionParams p = c.params(1);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(p, h200_like());
  alignas(256) static std::byte workspace[256];
  AttentionParams other = p;
  other.num_qo_heads = 16;
  EXPECT_THROW(cuda::cuda_paged_attention(other, plan, workspace), InvalidArgument);
  other = p;
  other.kv.dtype = DType::kF16;
  EXPECT_THROW(cuda::cuda_paged_attention(other, plan, workspace), InvalidArgument);
  other = p;
  other.table.batch_size = 2;
  EXPECT_THROW(cuda::cuda_paged_attention(other, plan, workspace), InvalidArgument);
  EXPECT_THROW(cuda::cuda_paged_attention(p, plan, workspace + 8), InvalidArgument);
}

TEST(CudaPlan, AnEmptyBatchLaunchesNothing) {
  CaseSpec s = spec_with({0}, {0}, 8, 8);
  AttentionCase c(s);
  const CudaAttentionPlan plan = cuda::plan_cuda_attention(c.params(1), h200_like());
  EXPECT_TRUE(plan.decode_items.empty() && plan.prefill_items.empty() && plan.merges.empty());
  EXPECT_NO_THROW(cuda::cuda_paged_attention(c.params(1), plan, nullptr));
}

}  // namespace
}  // namespace pagedattn::testing
