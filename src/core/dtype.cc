#include "pagedattn/dtype.h"

#include <string>

#include "pagedattn/errors.h"

namespace pagedattn {

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32") return DType::kF32;
  if (name == "float16" || name == "f16") return DType::kF16;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  throw InvalidArgument(detail::concat("dtype name '", std::string(name),
                                       "' is not one of float32, float16, bfloat16"));
}

}  // namespace pagedattn
