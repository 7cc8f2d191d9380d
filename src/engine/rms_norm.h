// RMSNorm over rows, vectorised: the model's input, post, final and q/k
// norms and latent attention's norms.
#pragma once

#include <cstdint>

namespace pagedattn::engine {

// out[r][i] = x[r][i] / rms(x[r]) * weight[i] for each of `rows` rows of
// `width` values, rms(v) = sqrt(mean(v^2) + eps). out may equal x. The
// squares are summed on vector lanes, in an order fixed by width and the
// CPU's vector width alone, so a row's result does not depend on the other
// rows or on the thread count. Rows spread over OpenMP threads from
// core::kRowParallelElements values.
void rms_norm_rows(const float* x, std::int32_t rows, std::int32_t width, const float* weight,
                   float eps, float* out);

}  // namespace pagedattn::engine
