// PAGEDATTN_MAX_TARGET / set_max_target: the cap reaches Highway's dynamic
// dispatch (here, a function exported by this file like the library's
// kernels), unknown names fail loudly, and removing the cap restores the
// CPU's best target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "unit/cpu_dispatch_test.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::testing::HWY_NAMESPACE {
std::int64_t CompiledTarget() {
  return HWY_TARGET;
}
}  // namespace pagedattn::testing::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::testing {
HWY_EXPORT(CompiledTarget);

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The target a HWY_DYNAMIC_DISPATCH call runs now.
std::string dispatch_now() {
  return lower(hwy::TargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)()));
}

// Removes any cap and the variable when a test ends, however it ends.
struct NoCapAfter {
  ~NoCapAfter() {
    unsetenv(kMaxTargetVariable);
    unsetenv(kDisableFeaturesVariable);
    set_max_target("");
    set_disabled_features("");
  }
};

bool cpu_supports(const std::string& name) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets())
    if (lower(hwy::TargetName(t)) == name) return true;
  return false;
}

// Run by ctest with PAGEDATTN_MAX_TARGET set (tests/unit/CMakeLists.txt): the
// value was applied while the library loaded, before main.
TEST(CpuDispatch, LoadTimeCapMatchesEnvironment) {
  const char* env = std::getenv(kMaxTargetVariable);
  if (!env || !*env) GTEST_SKIP() << kMaxTargetVariable << " is not set";
  EXPECT_EQ(max_target(), lower(env));
  EXPECT_EQ(dispatch_now(), dispatched_target_name());
  const std::vector<std::string> names = known_target_names();
  const auto rank = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) - names.begin();
  };
  // A cap below every compiled target leaves the lowest: the static target.
  const std::string lowest = lower(hwy::TargetName(HWY_STATIC_TARGET));
  EXPECT_TRUE(rank(dispatch_now()) >= rank(lower(env)) || dispatch_now() == lowest)
      << "dispatch runs " << dispatch_now() << ", above the cap and the lowest target " << lowest;
}

TEST(CpuDispatch, KnownTargetsAreListedBestFirst) {
  const std::vector<std::string> names = known_target_names();
  ASSERT_FALSE(names.empty());
#if HWY_ARCH_X86
  auto at = [&](const char* n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  EXPECT_LT(at("avx3"), at("avx2"));
  EXPECT_LT(at("avx2"), at("sse4"));
  EXPECT_LT(at("sse4"), at("emu128"));
  EXPECT_LT(at("emu128"), at("scalar"));
  EXPECT_LT(at("scalar"), static_cast<std::ptrdiff_t>(names.size()));
#endif
}

TEST(CpuDispatch, CapLowersEveryDispatchAndLiftingItRestoresTheBest) {
  NoCapAfter reset;
  set_max_target("");
  const std::string best = dispatched_target_name();
  EXPECT_EQ(dispatch_now(), best);
  EXPECT_EQ(max_target(), "");
  for (const char* cap : {"avx2", "sse4", "emu128"}) {
    if (!cpu_supports(cap)) continue;
    set_max_target(lower(cap) == "avx2" ? "AvX2" : cap);  // case-insensitive
    EXPECT_EQ(max_target(), cap);
    EXPECT_EQ(dispatched_target_name(), cap);
    EXPECT_EQ(dispatch_now(), cap);
    EXPECT_FALSE(dispatched_features().avx512f) << cap;
  }
  set_max_target("scalar");  // below the fallback: the fallback
  EXPECT_EQ(dispatch_now(), dispatched_target_name());
  set_max_target("");
  EXPECT_EQ(dispatched_target_name(), best);
  EXPECT_EQ(dispatch_now(), best);
}

// dispatched_target_name() is cached (cpuid is slow under a hypervisor), but
// keyed on Highway's choice: Highway 1.0.3's SupportedTargets(), called by
// anyone, re-chooses from every target and drops the cap; the next question
// must see that, put the cap back, and answer what dispatch then runs.
TEST(CpuDispatch, CachedAnswerFollowsHighwaysChoiceAfterAForeignRedetect) {
  NoCapAfter reset;
  set_max_target("");
  const std::string best = dispatched_target_name();
  if (!cpu_supports("avx2") || best == "avx2") GTEST_SKIP() << "needs a target above AVX2";
  set_max_target("avx2");
  EXPECT_EQ(dispatched_target_name(), "avx2");  // now cached
  hwy::SupportedTargets();
  EXPECT_EQ(dispatched_target_name(), "avx2");
  EXPECT_EQ(dispatch_now(), "avx2");
  EXPECT_FALSE(dispatched_features().avx512f);
  set_max_target("");
  EXPECT_EQ(dispatched_target_name(), best);
  EXPECT_EQ(dispatch_now(), best);
}

TEST(CpuDispatch, UnknownNameThrowsAndKeepsTheCap) {
  NoCapAfter reset;
  if (!cpu_supports("avx2")) GTEST_SKIP() << "no AVX2";
  set_max_target("avx2");
  try {
    set_max_target("avx9");
    FAIL() << "set_max_target(\"avx9\") did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("set_max_target: name = 'avx9' is not a Highway target"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("avx2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(max_target(), "avx2");
  EXPECT_EQ(dispatch_now(), "avx2");
}

TEST(CpuDispatch, EnvironmentCapsDispatch) {
  NoCapAfter reset;
  if (!cpu_supports("sse4")) GTEST_SKIP() << "no SSE4";
  setenv(kMaxTargetVariable, "SSE4", 1);
  apply_max_target_from_environment();
  EXPECT_EQ(max_target(), "sse4");
  EXPECT_EQ(dispatch_now(), "sse4");
  unsetenv(kMaxTargetVariable);
  apply_max_target_from_environment();
  EXPECT_EQ(max_target(), "");
}

// An unknown value fails every attention call, naming the variable and value,
// before the call reads its arguments.
TEST(CpuDispatch, UnknownEnvironmentValueFailsAttentionCalls) {
  NoCapAfter reset;
  setenv(kMaxTargetVariable, "avx3_zen9", 1);
  try {
    apply_max_target_from_environment();
    FAIL() << "apply_max_target_from_environment accepted avx3_zen9";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("PAGEDATTN_MAX_TARGET = 'avx3_zen9'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(max_target(), "");
  AttentionParams empty;
  try {
    AttentionRunner().run(empty);
    FAIL() << "AttentionRunner::run ran under PAGEDATTN_MAX_TARGET=avx3_zen9";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "AttentionRunner::run: PAGEDATTN_MAX_TARGET = 'avx3_zen9' is not a Highway target"),
        std::string::npos)
        << e.what();
  }
  set_max_target("");  // an explicit choice clears the environment's error
  EXPECT_THROW(AttentionRunner().run(empty), InvalidArgument);  // now for the empty params
  try {
    AttentionRunner().run(empty);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("PAGEDATTN_MAX_TARGET"), std::string::npos) << e.what();
  }
}

TEST(CpuDispatch, FeaturesFollowTheTarget) {
  NoCapAfter reset;
  const CpuFeatures cpu = cpu_features();
  EXPECT_FALSE(feature_names(cpu).empty());
  EXPECT_EQ(feature_names(CpuFeatures{}), "none");
  const CpuFeatures used = dispatched_features();
  // Nothing in use that the CPU lacks.
  EXPECT_TRUE(!used.avx2 || cpu.avx2);
  EXPECT_TRUE(!used.avx512f || cpu.avx512f);
  EXPECT_TRUE(!used.avx512_bf16 || cpu.avx512_bf16);
  EXPECT_TRUE(!used.avx512_vnni || cpu.avx512_vnni);
  EXPECT_TRUE(!used.avx512_fp16 || cpu.avx512_fp16);
  EXPECT_TRUE(!used.avx512_vbmi || cpu.avx512_vbmi);
  EXPECT_TRUE(!cpu.avx512_vbmi || cpu.avx512bw);
  EXPECT_TRUE(!used.avx_vnni || cpu.avx_vnni);
  EXPECT_TRUE(!cpu.avx_vnni || cpu.avx2);
  if (cpu_supports("avx2")) {
    set_max_target("avx2");
    EXPECT_EQ(feature_names(dispatched_features()),
              cpu.avx_vnni ? "sse4_2 avx2 fma f16c avx_vnni" : "sse4_2 avx2 fma f16c");
  }
}

// PAGEDATTN_DISABLE_FEATURES / set_disabled_features: the named dot-product
// extensions leave dispatched_features() (the kernels' choice) but not
// cpu_features(); unknown names fail loudly, naming the value.
TEST(CpuDispatch, DisabledFeaturesLeaveTheKernelsChoice) {
  NoCapAfter reset;
  set_disabled_features("AMX_BF16, avx512_vnni");
  EXPECT_EQ(disabled_features(), "avx512_vnni amx_bf16");
  const CpuFeatures cpu = cpu_features(), used = dispatched_features();
  EXPECT_FALSE(used.amx_bf16);
  EXPECT_FALSE(used.avx512_vnni);
  EXPECT_EQ(used.avx512_bf16, cpu.avx512_bf16 && used.avx512f);
  set_disabled_features("avx512_bf16");
  EXPECT_FALSE(dispatched_features().avx512_bf16);
  EXPECT_EQ(dispatched_features().avx512_vnni, cpu.avx512_vnni && used.avx512f);
  set_disabled_features("avx512_fp16 avx512_bf16");
  EXPECT_FALSE(dispatched_features().avx512_fp16);
  EXPECT_EQ(disabled_features(), "avx512_bf16 avx512_fp16");
  set_disabled_features("avx512_bf16");
  EXPECT_EQ(dispatched_features().avx512_fp16, cpu.avx512_fp16 && used.avx512f);
  set_disabled_features("avx512_vbmi");
  EXPECT_FALSE(dispatched_features().avx512_vbmi);
  EXPECT_EQ(disabled_features(), "avx512_vbmi");
  set_disabled_features("avx512_bf16");
  EXPECT_EQ(dispatched_features().avx512_vbmi, cpu.avx512_vbmi && used.avx512f);
  set_disabled_features("amx_int8");
  EXPECT_FALSE(dispatched_features().amx_int8);
  EXPECT_EQ(dispatched_features().amx_bf16, cpu.amx_bf16 && used.avx512f);
  EXPECT_EQ(disabled_features(), "amx_int8");
  set_disabled_features("avx_vnni");
  EXPECT_FALSE(dispatched_features().avx_vnni);
  EXPECT_EQ(disabled_features(), "avx_vnni");
  set_disabled_features("avx512_bf16");
  EXPECT_EQ(dispatched_features().avx_vnni, cpu.avx_vnni && used.avx2);
  try {
    set_disabled_features("amx_bf16,amx_fp16");
    FAIL() << "set_disabled_features accepted amx_fp16";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("names 'amx_fp16'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(disabled_features(), "avx512_bf16");  // unchanged by the failed call
  set_disabled_features("");
  EXPECT_EQ(disabled_features(), "none");
  EXPECT_EQ(dispatched_features().amx_bf16, cpu.amx_bf16 && used.avx512f);
  EXPECT_EQ(dispatched_features().amx_int8, cpu.amx_int8 && used.avx512f);
}

TEST(CpuDispatch, UnknownDisabledFeatureInEnvironmentFailsAttentionCalls) {
  NoCapAfter reset;
  setenv(kDisableFeaturesVariable, "amx_fp16", 1);
  EXPECT_THROW(apply_disabled_features_from_environment(), InvalidArgument);
  AttentionParams empty;
  try {
    AttentionRunner().run(empty);
    FAIL() << "AttentionRunner::run ran under PAGEDATTN_DISABLE_FEATURES=amx_fp16";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("PAGEDATTN_DISABLE_FEATURES = 'amx_fp16'"),
              std::string::npos)
        << e.what();
  }
  setenv(kDisableFeaturesVariable, "amx_bf16", 1);
  apply_disabled_features_from_environment();
  EXPECT_EQ(disabled_features(), "amx_bf16");
  unsetenv(kDisableFeaturesVariable);
  apply_disabled_features_from_environment();
  EXPECT_EQ(disabled_features(), "none");
}

}  // namespace
}  // namespace pagedattn::testing
#endif  // HWY_ONCE
