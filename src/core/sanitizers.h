#pragma once

namespace pagedattn::core {

// Whether this build runs under AddressSanitizer (GCC defines
// __SANITIZE_ADDRESS__, clang answers __has_feature): tests scale their work
// down under it, and skip what its allocator changes by design; timings
// that choose a path measure its instrumentation, so they shrink too.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace pagedattn::core
