// Prints the HWY_DISABLED_TARGETS mask for a sanitizer build: of the Highway
// targets compiled by default (HWY_TARGETS), those this machine cannot run
// (sanitizers only see code that runs), and SSSE3 where SSE4 is compiled and
// runs (the same kernel source at the same 128-bit width, so it adds compile
// time and no new bounds; the Release build still tests it). The static
// target is never in the mask.
#include <hwy/targets.h>

#include <cstdio>

int main() {
  const long long runnable = hwy::SupportedTargets();
  long long disabled = HWY_TARGETS & ~runnable;
  if ((HWY_TARGETS & runnable & HWY_SSE4) != 0) disabled |= HWY_TARGETS & HWY_SSSE3;
  std::printf("%lld\n", disabled & ~static_cast<long long>(HWY_STATIC_TARGET));
  return 0;
}
