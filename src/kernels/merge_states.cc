#include <algorithm>

#include "pagedattn/attention.h"
#include "pagedattn/errors.h"
#include "softmax_state.h"

namespace pagedattn {

void merge_states(std::span<const float> v_a, std::span<const float> s_a,
                  std::span<const float> v_b, std::span<const float> s_b, std::span<float> v_out,
                  std::span<float> s_out, std::int32_t dim) {
  require(dim >= 1, "merge_states: dim = ", dim, " must be >= 1");
  const std::size_t rows = s_a.size();
  require(s_b.size() == rows && s_out.size() == rows, "merge_states: s_a, s_b, s_out have ",
          s_a.size(), ", ", s_b.size(), ", ", s_out.size(), " rows; they must match");
  const std::size_t n = rows * static_cast<std::size_t>(dim);
  require(v_a.size() == n && v_b.size() == n && v_out.size() == n,
          "merge_states: v_a, v_b, v_out have ", v_a.size(), ", ", v_b.size(), ", ", v_out.size(),
          " elements; expected rows x dim = ", n);
  for (std::size_t r = 0; r < rows; ++r) {
    float* out = v_out.data() + r * dim;
    float lse = s_a[r];
    if (out != v_a.data() + r * dim) std::copy_n(v_a.data() + r * dim, dim, out);
    kernels::merge_into(out, lse, v_b.data() + r * dim, s_b[r], dim);
    s_out[r] = lse;
  }
}

}  // namespace pagedattn
