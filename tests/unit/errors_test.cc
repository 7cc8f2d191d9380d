// Error types, codes and error_code_name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

TEST(Errors, CodeNames) {
  EXPECT_STREQ(error_code_name(ErrorCode::kOk), "ok");
  EXPECT_STREQ(error_code_name(ErrorCode::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(error_code_name(ErrorCode::kOutOfPages), "out_of_pages");
  EXPECT_STREQ(error_code_name(ErrorCode::kInvalidState), "invalid_state");
  EXPECT_STREQ(error_code_name(ErrorCode::kUnsupported), "unsupported");
  EXPECT_STREQ(error_code_name(ErrorCode::kInternal), "internal");
  EXPECT_STREQ(error_code_name(static_cast<ErrorCode>(99)), "unknown");
}

TEST(Errors, StableNumericCodes) {  // shared with the C ABI
  EXPECT_EQ(static_cast<int>(ErrorCode::kOk), 0);
  EXPECT_EQ(static_cast<int>(ErrorCode::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(ErrorCode::kOutOfPages), 2);
  EXPECT_EQ(static_cast<int>(ErrorCode::kInvalidState), 3);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnsupported), 4);
  EXPECT_EQ(static_cast<int>(ErrorCode::kInternal), 5);
}

template <typename E>
void expect_error_type(ErrorCode code) {
  try {
    throw E("the message");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_STREQ(e.what(), "the message");
    EXPECT_NE(dynamic_cast<const std::runtime_error*>(&e), nullptr);
    return;
  }
  ADD_FAILURE() << "not caught as pagedattn::Error";
}

TEST(Errors, EachTypeCarriesItsCode) {
  expect_error_type<InvalidArgument>(ErrorCode::kInvalidArgument);
  expect_error_type<OutOfPages>(ErrorCode::kOutOfPages);
  expect_error_type<InvalidState>(ErrorCode::kInvalidState);
  expect_error_type<Unsupported>(ErrorCode::kUnsupported);
  expect_error_type<InternalError>(ErrorCode::kInternal);
}

TEST(Errors, RequireThrowsTheGivenTypeWithTheConcatenatedMessage) {
  EXPECT_NO_THROW(require(true, "never"));
  try {
    require(false, "x = ", 42, ", y = ", 1.5, " bad");
    ADD_FAILURE() << "did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "x = 42, y = 1.5 bad");
  }
  EXPECT_THROW(require<InvalidState>(false, "state"), InvalidState);
  EXPECT_THROW(require<OutOfPages>(false, "pages"), OutOfPages);
  EXPECT_EQ(detail::concat("a", 1, 'b', std::string("c")), "a1bc");
}

}  // namespace
}  // namespace pagedattn
