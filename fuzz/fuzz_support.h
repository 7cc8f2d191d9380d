// Helpers shared by the libFuzzer harnesses: a loud failure that libFuzzer
// records as a crash, and the "a failed call leaves the state unchanged" check.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "pagedattn/errors.h"

namespace pagedattn::fuzz {

[[noreturn]] inline void fail(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz invariant broken: %s %s\n", what, detail);
  std::abort();
}

// Runs `call`; a pagedattn::Error is an accepted outcome (bad input), after
// which `digest()` must equal its value before the call. Any other exception
// escapes and libFuzzer reports it. Returns whether the call succeeded.
template <typename Call, typename Digest>
bool call_checked(const char* name, Call&& call, Digest&& digest) {
  const auto before = digest();
  try {
    call();
    return true;
  } catch (const Error& e) {
    if (digest() != before) fail(name, e.what());
    return false;
  }
}

}  // namespace pagedattn::fuzz
