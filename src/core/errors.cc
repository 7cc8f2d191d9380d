#include "pagedattn/errors.h"

namespace pagedattn {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kOutOfPages:
      return "out_of_pages";
    case ErrorCode::kInvalidState:
      return "invalid_state";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace pagedattn
