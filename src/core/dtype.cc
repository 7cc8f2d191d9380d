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
    case DType::kFP8E4M3:
      return "float8_e4m3fn";
    case DType::kFP8E5M2:
      return "float8_e5m2";
    case DType::kINT8:
      return "int8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32") return DType::kF32;
  if (name == "float16" || name == "f16") return DType::kF16;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float8_e4m3fn" || name == "fp8_e4m3") return DType::kFP8E4M3;
  if (name == "float8_e5m2" || name == "fp8_e5m2") return DType::kFP8E5M2;
  if (name == "int8") return DType::kINT8;
  throw InvalidArgument(detail::concat(
      "dtype name '", std::string(name),
      "' is not one of float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8"));
}

}  // namespace pagedattn
