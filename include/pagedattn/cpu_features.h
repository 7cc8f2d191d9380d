// Which SIMD code the CPU kernels run: the CPU's ISA extensions, the Highway
// target that dynamic dispatch picks, and a cap on that target.
//
// The cap comes from the environment variable PAGEDATTN_MAX_TARGET, read once
// when the library is loaded (before any kernel runs), or from
// set_max_target(). Its value names a Highway target, case-insensitive; every
// dynamically dispatched kernel of the library then runs at most that target.
// On x86-64, best first:
//   avx3_dl  AVX-512 with VNNI, VBMI2, VPCLMULQDQ, VAES, BITALG (Ice Lake, Zen 4)
//   avx3     AVX-512 F/BW/DQ/VL, 16 fp32 lanes
//   avx2     AVX2 + FMA + F16C, 8 fp32 lanes
//   sse4     SSE4.2, 4 fp32 lanes
//   ssse3    SSSE3
//   emu128, scalar  Highway's portable C++ fallbacks: a build compiles one of
//            them (scalar with GCC before 12.3), and a cap at either runs it
// (a newer Highway knows more names, e.g. avx3_zen4: known_target_names()
// lists what this build accepts). A cap above what the CPU or the build offers
// changes nothing. An unknown value is an error, not a warning: the variable
// is then ignored and every attention call throws InvalidArgument naming
// PAGEDATTN_MAX_TARGET and its value, so a benchmark or test run never
// silently measures a target other than the one asked for.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

// The environment variable that caps dispatch.
inline constexpr const char* kMaxTargetVariable = "PAGEDATTN_MAX_TARGET";

// x86 ISA extensions that the CPU and the operating system both support
// (cpuid, and xgetbv for the AVX / AVX-512 register state). All false on
// other architectures.
struct CpuFeatures {
  bool sse4_2 = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_vnni = false;  // vpdpbusd: int8 x uint8 dot products into int32
  // AVX-VNNI: vpdpbusd on 256-bit vectors with a VEX encoding, on CPUs
  // without AVX-512 too (Intel's Alder Lake and later client cores, Sierra
  // Forest).
  bool avx_vnni = false;
  bool avx512_bf16 = false;  // vdpbf16ps: bf16 pair dot products into fp32
  // AMX tiles with bf16 tile products (tdpbf16ps: 16 x 16 fp32 += 16 x 32
  // bf16 times 32 x 16 bf16): cpuid's AMX-TILE and AMX-BF16, the tile state
  // enabled by the OS (XCR0) and, on Linux, the process's permission to use
  // it (arch_prctl ARCH_REQ_XCOMP_PERM, requested when detecting).
  bool amx_bf16 = false;
  // AMX tiles with int8 tile products (tdpbsud and kin: 16 x 16 int32 +=
  // 16 x 64 int8 times 64 x 16 int8), under the same conditions as amx_bf16
  // with cpuid's AMX-INT8 in place of AMX-BF16.
  bool amx_int8 = false;
  bool avx512_fp16 =
      false;  // f16 arithmetic on 32 lanes (vfmadd...ph; Intel from Sapphire Rapids on)
  // vpermb / vpermi2b: byte permutes over 64 / 128 entries (Ice Lake, Zen 4 on;
  // the bf16 decode path's fp8 -> bf16 byte tables need it).
  bool avx512_vbmi = false;
};

// The CPU's features (detected once).
CpuFeatures cpu_features();

// The features the dispatched kernels may use: those the dispatched target
// requires, plus avx_vnni when the target is avx2 or better and
// avx512_vnni, avx512_bf16, amx_bf16, amx_int8, avx512_fp16 and avx512_vbmi when it is
// avx3 or better, each where the CPU has it (the kernels' dot-product paths
// run only in code of those widths and only when cpu_features() reports the
// extension), less the extensions switched off (set_disabled_features).
CpuFeatures dispatched_features();

// The environment variable that switches dot-product extensions off.
inline constexpr const char* kDisableFeaturesVariable = "PAGEDATTN_DISABLE_FEATURES";

// Switches off the kernels' use of optional extensions, so that one machine
// runs and measures the paths without them: a comma- or space-separated list
// of avx512_vnni, avx_vnni, avx512_bf16, amx_bf16, amx_int8, avx512_fp16, avx512_vbmi
// (case-insensitive; "" switches none off), replacing the previous list. PAGEDATTN_DISABLE_FEATURES
// gives the same list when the library loads (an unknown name there makes every attention call
// throw InvalidArgument naming the variable, as an unknown PAGEDATTN_MAX_TARGET does). Throws
// InvalidArgument for an unknown name, leaving the list unchanged. Not to be called while kernels
// run.
void set_disabled_features(std::string_view names);

// The extensions switched off now, as feature_names() writes them ("none").
std::string disabled_features();

// Re-reads PAGEDATTN_DISABLE_FEATURES (unset or empty: none off) as at load
// time. Throws InvalidArgument naming the variable, the value and the
// unknown name, leaving nothing switched off; every attention call then
// throws too until the list is set again.
void apply_disabled_features_from_environment();

// Space-separated names of the features set in `f`, e.g. "avx2 fma f16c";
// "none" when none is.
std::string feature_names(const CpuFeatures& f);

// The Highway target that the library's kernels dispatch to now, lower-case
// (e.g. "avx3", "avx2", "emu128").
std::string dispatched_target_name();

// Every target name PAGEDATTN_MAX_TARGET and set_max_target accept, best first.
std::vector<std::string> known_target_names();

// The cap in effect (a known_target_names() entry), or "" when there is none.
std::string max_target();

// Caps dispatch at `name` (case-insensitive; "" removes the cap), replacing
// the environment's value and any error it caused. Throws InvalidArgument for
// an unknown name, leaving the cap unchanged. Not to be called while kernels
// run on other threads.
void set_max_target(std::string_view name);

// Re-reads PAGEDATTN_MAX_TARGET (unset or empty: no cap) as at load time.
// Throws InvalidArgument naming the variable and value when the value is
// unknown, leaving no cap in place; every attention call then throws too
// until the cap is set again. Programs call it first to fail at once.
void apply_max_target_from_environment();

}  // namespace pagedattn
