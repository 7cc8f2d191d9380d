// rms_norm_rows with Highway (dispatched once per call, at the top). A
// scalar sum of squares is a chain of dependent adds, one per value: on a
// 32-row decode step the norms took longer than the gated activation.
#include "engine/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "core/row_parallel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/rms_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Sum of squares on two vector accumulators (the adds of one do not wait
// for the other's), then the lanes; the tail through a zero-padded copy
// (Highway 1.0 has no partial loads).
float SumOfSquares(const float* HWY_RESTRICT row, std::size_t width) {
  const DF d;
  const std::size_t n = hn::Lanes(d);
  VF even = hn::Zero(d), odd = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * n <= width; i += 2 * n) {
    const VF a = hn::LoadU(d, row + i), b = hn::LoadU(d, row + i + n);
    even = hn::MulAdd(a, a, even);
    odd = hn::MulAdd(b, b, odd);
  }
  for (; i + n <= width; i += n) {
    const VF a = hn::LoadU(d, row + i);
    even = hn::MulAdd(a, a, even);
  }
  if (i < width) {
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    std::copy(row + i, row + width, tail);
    const VF a = hn::Load(d, tail);
    odd = hn::MulAdd(a, a, odd);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(even, odd)));
}

// row and out may be the same (not restrict).
void NormRow(const float* row, std::size_t width, const float* HWY_RESTRICT weight, float eps,
             float* out) {
  const float inv = 1.0f / std::sqrt(SumOfSquares(row, width) / static_cast<float>(width) + eps);
  const DF d;
  const std::size_t n = hn::Lanes(d);
  const VF scale = hn::Set(d, inv);
  std::size_t i = 0;
  // (x * inv) * weight, the order of the reference (and of Hugging Face's
  // LlamaRMSNorm); out may be row, so each vector is read before written.
  for (; i + n <= width; i += n)
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, row + i), scale), hn::LoadU(d, weight + i)), d,
               out + i);
  for (; i < width; ++i) out[i] = row[i] * inv * weight[i];
}

void RmsNormRows(const float* x, std::int32_t rows, std::int32_t width, const float* weight,
                 float eps, float* out) {
  const std::size_t w = std::size_t(width);
#pragma omp parallel for schedule(static) if (std::int64_t{rows} * width >= \
                                              core::kRowParallelElements)
  for (std::int32_t r = 0; r < rows; ++r) NormRow(x + r * w, w, weight, eps, out + r * w);
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {

HWY_EXPORT(RmsNormRows);

void rms_norm_rows(const float* x, std::int32_t rows, std::int32_t width, const float* weight,
                   float eps, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormRows)(x, rows, width, weight, eps, out);
}

}  // namespace pagedattn::engine
#endif  // HWY_ONCE
