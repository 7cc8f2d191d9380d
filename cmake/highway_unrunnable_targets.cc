// Prints the HWY_DISABLED_TARGETS mask of the Highway targets compiled by
// default (HWY_TARGETS) that this machine cannot run.
#include <hwy/targets.h>

#include <cstdio>

int main() {
  const long long unrunnable = HWY_TARGETS & ~hwy::SupportedTargets() & ~HWY_STATIC_TARGET;
  std::printf("%lld\n", unrunnable);
  return 0;
}
