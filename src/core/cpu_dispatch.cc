// PAGEDATTN_MAX_TARGET and the dispatched target: the cap is Highway's
// DisableTargets mask, which every HWY_DYNAMIC_DISPATCH in the library (and in
// anything else in the process using Highway) consults.
#include "core/cpu_dispatch.h"

#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

#if HWY_ARCH_X86
#include <cpuid.h>
#endif

namespace pagedattn {
namespace {

struct KnownTarget {
  std::string name;  // lower-case hwy::TargetName
  std::int64_t bit;
};

// Every target Highway can name on this architecture, best (lowest bit) first.
const std::vector<KnownTarget>& known_targets() {
  static const std::vector<KnownTarget> targets = [] {
    std::vector<KnownTarget> out;
    for (int i = 0; i < 63; ++i) {
      const std::int64_t bit = std::int64_t{1} << i;
      std::string name = hwy::TargetName(bit);
      if (name == "Unknown") continue;
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      out.push_back({name, bit});
    }
    return out;
  }();
  return targets;
}

const KnownTarget* find_target(std::string_view name) {
  for (const KnownTarget& t : known_targets())
    if (t.name.size() == name.size() &&
        std::equal(name.begin(), name.end(), t.name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        }))
      return &t;
  return nullptr;
}

std::string unknown_target_message(std::string_view what, std::string_view value) {
  std::string names;
  for (const std::string& n : known_target_names()) {
    if (!names.empty()) names += ", ";
    names += n;
  }
  return detail::concat(what, " = '", value, "' is not a Highway target this build knows; expected one of ",
                        names, " (case-insensitive), or empty for no cap");
}

// The cap and the error an unknown environment value left, under one mutex.
struct CapState {
  std::mutex mutex;
  std::string cap;                          // "" = none
  std::string env_error;                    // "" = none
  std::atomic<bool> env_invalid{false};     // env_error is set (read without the mutex)
};

CapState& cap_state() {
  static CapState state;
  return state;
}

// hwy::SupportedTargets() with the dispatch choice kept in step: Highway
// 1.0.3's SupportedTargets re-initialises the chosen target with every
// detected target, ignoring DisableTargets, so a caller that asks must then
// choose again from the capped set (what HWY_DYNAMIC_DISPATCH does itself on
// its first call).
std::int64_t supported_targets() {
  const std::int64_t targets = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(targets);
  return targets;
}

// Caller holds the mutex. Disabling every target better than the cap's leaves
// the best supported one at or below it.
void apply_cap(CapState& s, const KnownTarget* target) {
  hwy::DisableTargets(target ? target->bit - 1 : 0);
  supported_targets();
  s.cap = target ? target->name : "";
}

#if HWY_ARCH_X86
CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return f;
  f.sse4_2 = c & (1u << 20);
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  unsigned xcr0 = 0, xcr0_high = 0;
  if (osxsave) asm volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  const bool ymm_state = (xcr0 & 0x6) == 0x6;            // SSE + AVX registers saved
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM upper halves
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const unsigned leaf7_ebx = b, leaf7_ecx = c;
  f.avx2 = avx && ymm_state && (leaf7_ebx & (1u << 5));
  f.fma = avx && ymm_state && fma;
  f.f16c = avx && ymm_state && f16c;
  f.avx512f = zmm_state && (leaf7_ebx & (1u << 16));
  f.avx512dq = f.avx512f && (leaf7_ebx & (1u << 17));
  f.avx512bw = f.avx512f && (leaf7_ebx & (1u << 30));
  f.avx512vl = f.avx512f && (leaf7_ebx & (1u << 31));
  f.avx512_vnni = f.avx512f && (leaf7_ecx & (1u << 11));
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.avx512f && (a & (1u << 5));
  return f;
}
#else
CpuFeatures detect_cpu_features() { return {}; }
#endif

// The target HWY_DYNAMIC_DISPATCH picks in a translation unit compiled with
// this one's HWY_TARGETS (the library compiles all its kernels alike).
std::int64_t dispatched_target() {
  std::int64_t targets = supported_targets() & HWY_TARGETS;
  if (targets == 0) targets = HWY_STATIC_TARGET;
  return targets & -targets;
}

// Reads PAGEDATTN_MAX_TARGET and applies it, or records why it cannot;
// returns whether the value was usable. Never throws (it runs at load time).
bool load_environment_cap() {
  const char* env = std::getenv(kMaxTargetVariable);
  const std::string_view value = env ? env : "";
  const KnownTarget* target = value.empty() ? nullptr : find_target(value);
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  apply_cap(s, target);
  s.env_error = value.empty() || target ? "" : unknown_target_message(kMaxTargetVariable, value);
  s.env_invalid = !s.env_error.empty();
  return s.env_error.empty();
}

// Applied while the library is loaded, before main and before any kernel.
[[maybe_unused]] const bool g_environment_applied = load_environment_cap();

}  // namespace

CpuFeatures cpu_features() {
  static const CpuFeatures f = detect_cpu_features();
  return f;
}

CpuFeatures dispatched_features() {
  CpuFeatures out;
#if HWY_ARCH_X86
  const CpuFeatures cpu = cpu_features();
  const std::int64_t t = dispatched_target();
  if (t <= HWY_SSE4) out.sse4_2 = true;
  if (t <= HWY_AVX2) out.avx2 = out.fma = out.f16c = true;
  if (t <= HWY_AVX3) {
    out.avx512f = out.avx512bw = out.avx512dq = out.avx512vl = true;
    out.avx512_vnni = cpu.avx512_vnni;
    out.avx512_bf16 = cpu.avx512_bf16;
  }
#endif
  return out;
}

std::string feature_names(const CpuFeatures& f) {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(f.sse4_2, "sse4_2");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  return out.empty() ? "none" : out;
}

std::string dispatched_target_name() {
  const std::int64_t t = dispatched_target();
  for (const KnownTarget& k : known_targets())
    if (k.bit == t) return k.name;
  return hwy::TargetName(t);
}

std::vector<std::string> known_target_names() {
  std::vector<std::string> names;
  for (const KnownTarget& t : known_targets()) names.push_back(t.name);
  return names;
}

std::string max_target() {
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  return s.cap;
}

void set_max_target(std::string_view name) {
  const KnownTarget* target = name.empty() ? nullptr : find_target(name);
  require(name.empty() || target, unknown_target_message("set_max_target: name", name));
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  apply_cap(s, target);
  s.env_error.clear();
  s.env_invalid = false;
}

void apply_max_target_from_environment() {
  if (load_environment_cap()) return;
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  throw InvalidArgument(s.env_error);
}

namespace core {

void require_valid_max_target(const char* call) {
  CapState& s = cap_state();
  if (!s.env_invalid) return;  // every call but the failing ones stops here
  const std::lock_guard lock(s.mutex);
  require(s.env_error.empty(), call, ": ", s.env_error);
}

}  // namespace core
}  // namespace pagedattn
