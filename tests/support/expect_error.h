// expect_rejected<E>(kv, call, substrings...): `call` must throw exactly the
// pagedattn error type E (with the matching code()), its message must contain
// every substring, and kv.state_digest() must be unchanged.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <typeinfo>

#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::test {

template <typename E>
constexpr ErrorCode expected_code() {
  if constexpr (std::is_same_v<E, InvalidArgument>) return ErrorCode::kInvalidArgument;
  if constexpr (std::is_same_v<E, OutOfPages>) return ErrorCode::kOutOfPages;
  if constexpr (std::is_same_v<E, InvalidState>) return ErrorCode::kInvalidState;
  if constexpr (std::is_same_v<E, Unsupported>) return ErrorCode::kUnsupported;
  return ErrorCode::kInternal;
}

// Runs `call` and checks it throws E whose message holds every substring.
// Returns the message ("" when nothing or something else was thrown).
template <typename E, typename Call>
std::string expect_throws(Call&& call, std::initializer_list<std::string_view> substrings = {}) {
  try {
    call();
  } catch (const E& e) {
    if (typeid(e) != typeid(E)) {
      ADD_FAILURE() << "threw a subclass of the expected type: " << e.what();
      return {};
    }
    EXPECT_EQ(e.code(), expected_code<E>()) << e.what();
    for (std::string_view s : substrings)
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string(s)));
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type (" << typeid(e).name() << "): " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

// expect_throws plus: the cache's state digest is unchanged by the failed call.
template <typename E, typename Call>
std::string expect_rejected(const PagedKVCache& kv, Call&& call,
                            std::initializer_list<std::string_view> substrings = {}) {
  const std::uint64_t before = kv.state_digest();
  std::string message = expect_throws<E>(std::forward<Call>(call), substrings);
  EXPECT_EQ(kv.state_digest(), before) << "a failed call changed the cache: " << message;
  return message;
}

}  // namespace pagedattn::test
