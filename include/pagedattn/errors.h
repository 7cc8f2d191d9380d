// Typed errors. Every public call validates its input before touching state
// and reports failures with one of these; the message names the call, the
// argument and the offending value.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace pagedattn {

// Stable numeric codes, shared with the C ABI.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a bad value, size, id or combination of arguments
  kOutOfPages = 2,       // the page pool cannot satisfy the request
  kInvalidState = 3,     // the call is not allowed in the object's current state
  kUnsupported = 4,      // valid request that this build / configuration cannot serve
  kInternal = 5,         // a broken invariant: a bug in pagedattn
};

const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(ErrorCode::kInvalidArgument, m) {}
};

class OutOfPages : public Error {
 public:
  explicit OutOfPages(const std::string& m) : Error(ErrorCode::kOutOfPages, m) {}
};

class InvalidState : public Error {
 public:
  explicit InvalidState(const std::string& m) : Error(ErrorCode::kInvalidState, m) {}
};

class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& m) : Error(ErrorCode::kUnsupported, m) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& m) : Error(ErrorCode::kInternal, m) {}
};

namespace detail {
// Concatenates any streamable values into one message string.
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

// Throws ErrorT(concat(parts...)) when `condition` is false.
template <typename ErrorT = InvalidArgument, typename... Parts>
void require(bool condition, const Parts&... parts) {
  if (!condition) throw ErrorT(detail::concat(parts...));
}

}  // namespace pagedattn
