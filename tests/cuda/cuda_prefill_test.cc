// Launch shapes of the prefill (tensor-core) kernel, host only: the planner
// serves a shape only when prefill_launch's shared memory fits the device,
// so every head dim up to 256 must fit in 100 KiB (room for two CTAs per SM
// on an A100 or H100) and MLA's 576 / 512 within an A100's 163 KiB opt-in
// limit (H100 / H200: 227 KiB). The kernel's results are checked against the
// CPU reference through cuda_paged_attention (cuda_attention_test.cc).
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/cuda/device_args.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda::detail {
namespace {

constexpr std::uint32_t kKiB = 1024;
constexpr DType kServedKV[] = {DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                               DType::kINT8};

void expect_valid_shape(const LaunchConfig& launch, std::int32_t head_dim,
                        std::int32_t v_head_dim) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << ", v_head_dim " << v_head_dim);
  EXPECT_GT(launch.threads, 0u);
  EXPECT_EQ(launch.threads % 32, 0u);  // whole warps
  EXPECT_LE(launch.threads, 1024u);
  EXPECT_GT(launch.shared_bytes, 0u);
}

TEST(CudaPrefillLaunch, HeadDimsUpTo256FitIn100KiB) {
  for (const DType dtype : kServedKV) {
    for (const std::int32_t head_dim : {1, 3, 16, 64, 72, 80, 96, 100, 128, 192, 200, 256}) {
      for (const std::int32_t v_head_dim : {head_dim, 1, 64, 128, 256}) {
        const LaunchConfig launch = prefill_launch(head_dim, v_head_dim, dtype);
        expect_valid_shape(launch, head_dim, v_head_dim);
        EXPECT_LE(launch.shared_bytes, 100 * kKiB)
            << dtype_name(dtype) << " head_dim " << head_dim << " v_head_dim " << v_head_dim;
      }
    }
  }
}

TEST(CudaPrefillLaunch, LatentAttentionFitsAnA100) {
  // DeepSeek MLA: K = [512 latent | 64 rope], V = the latent.
  for (const DType dtype : kServedKV) {
    const LaunchConfig launch = prefill_launch(576, 512, dtype);
    expect_valid_shape(launch, 576, 512);
    EXPECT_LE(launch.shared_bytes, 163 * kKiB) << dtype_name(dtype);
  }
}

TEST(CudaPrefillLaunch, RejectsEmptyHeads) {
  EXPECT_THROW(prefill_launch(0, 64, DType::kF16), InvalidArgument);
  EXPECT_THROW(prefill_launch(64, 0, DType::kF16), InvalidArgument);
}

}  // namespace
}  // namespace pagedattn::cuda::detail
