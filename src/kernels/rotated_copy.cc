#include "rotated_copy.h"

#include <cstddef>

#include "cpu/convert.h"

namespace pagedattn::kernels {

HeadTensor rotated_copy(const HeadTensor& x, std::int32_t tokens, std::int32_t heads,
                        std::int32_t dim, const std::int32_t* positions, const RopeConfig& rope,
                        std::vector<float>& out) {
  out.resize(std::size_t(tokens) * heads * dim);
  const auto es = static_cast<std::int64_t>(dtype_size(x.dtype));
  for (std::int32_t t = 0; t < tokens; ++t)
    for (std::int32_t h = 0; h < heads; ++h)
      convert_row(
          static_cast<const std::byte*>(x.data) + (t * x.token_stride + h * x.head_stride) * es,
          x.dtype, out.data() + (std::size_t(t) * heads + h) * dim, DType::kF32, dim, 1.0f);
  HeadTensor r{out.data(), DType::kF32, std::int64_t{heads} * dim, dim};
  apply_rope(r, tokens, heads, dim, positions, rope);
  return r;
}

}  // namespace pagedattn::kernels
