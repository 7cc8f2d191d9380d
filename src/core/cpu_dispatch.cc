// PAGEDATTN_MAX_TARGET and the dispatched target: the cap is Highway's
// DisableTargets mask, which every HWY_DYNAMIC_DISPATCH in the library (and in
// anything else in the process using Highway) consults.
#include "core/cpu_dispatch.h"

#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <bit>
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
#if HWY_ARCH_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
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
        std::equal(name.begin(), name.end(), t.name.begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; }))
      return &t;
  return nullptr;
}

std::string unknown_target_message(std::string_view what, std::string_view value) {
  std::string names;
  for (const std::string& n : known_target_names()) {
    if (!names.empty()) names += ", ";
    names += n;
  }
  return detail::concat(what, " = '", value,
                        "' is not a Highway target this build knows; expected one of ", names,
                        " (case-insensitive), or empty for no cap");
}

// The cap, the switched-off extensions and the errors unknown environment
// values left, under one mutex.
struct CapState {
  std::mutex mutex;
  std::string cap;                       // "" = none
  std::string env_error;                 // "" = none
  std::atomic<bool> env_invalid{false};  // env_error is set (read without the mutex)
  CpuFeatures disabled;                  // only the optional extensions' fields are used
  std::string features_env_error;        // "" = none
  std::atomic<bool> features_env_invalid{false};
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
// Linux enables the 8 KiB tile state per process, on request: without it the
// first tile instruction faults.
bool amx_permitted() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return f;
  f.sse4_2 = c & (1u << 20);
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  unsigned xcr0 = 0, xcr0_high = 0;
  if (osxsave) asm volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  const bool ymm_state = (xcr0 & 0x6) == 0x6;                 // SSE + AVX registers saved
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
  f.avx512_vbmi = f.avx512bw && (leaf7_ecx & (1u << 1));
  const unsigned leaf7_edx = d;
  f.avx512_fp16 = f.avx512bw && (leaf7_edx & (1u << 23));
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx_vnni = f.avx2 && (a & (1u << 4));
    f.avx512_bf16 = f.avx512f && (a & (1u << 5));
  }
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  const bool amx_tiles = f.avx512f && tile_state && (leaf7_edx & (1u << 24));  // AMX-TILE
  const bool amx_bf16 = amx_tiles && (leaf7_edx & (1u << 22)),
             amx_int8 = amx_tiles && (leaf7_edx & (1u << 25));
  const bool permitted = (amx_bf16 || amx_int8) && amx_permitted();
  f.amx_bf16 = amx_bf16 && permitted;
  f.amx_int8 = amx_int8 && permitted;
  return f;
}
#else
CpuFeatures detect_cpu_features() {
  return {};
}
#endif

// The target HWY_DYNAMIC_DISPATCH picks in a translation unit compiled with
// this one's HWY_TARGETS (the library compiles all its kernels alike).
// Asking Highway runs cpuid several times, and under a hypervisor every
// cpuid exits to it, microseconds that every attention call would pay
// uncached. The cache is keyed on Highway's chosen dispatch-table index,
// which a cap (or anyone's hwy::DisableTargets or SupportedTargets) changes;
// one atomic word holds key and answer, so a reader never mixes two answers.
std::int64_t dispatched_target() {
  static std::atomic<std::uint64_t> cache{0};  // (table index + 1) << 8 | target bit; 0 = empty
  const hwy::ChosenTarget& chosen = hwy::GetChosenTarget();
  if (chosen.IsInitialized()) {
    const std::uint64_t cached = cache.load(std::memory_order_acquire);
    if (cached >> 8 == chosen.GetIndex() + 1) return std::int64_t{1} << (cached & 0xff);
  }
  std::int64_t targets = supported_targets() & HWY_TARGETS;
  if (targets == 0) targets = HWY_STATIC_TARGET;
  const std::int64_t target = targets & -targets;
  cache.store((std::uint64_t{chosen.GetIndex()} + 1) << 8 |
                  std::uint64_t(std::countr_zero(std::uint64_t(target))),
              std::memory_order_release);
  return target;
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

// The optional extensions set_disabled_features may name, as feature_names()
// writes them.
struct OptionalFeature {
  const char* name;
  bool CpuFeatures::*field;
};
constexpr OptionalFeature kOptionalFeatures[] = {
    {"avx512_vnni", &CpuFeatures::avx512_vnni}, {"avx_vnni", &CpuFeatures::avx_vnni},
    {"avx512_bf16", &CpuFeatures::avx512_bf16}, {"amx_bf16", &CpuFeatures::amx_bf16},
    {"amx_int8", &CpuFeatures::amx_int8},       {"avx512_fp16", &CpuFeatures::avx512_fp16},
    {"avx512_vbmi", &CpuFeatures::avx512_vbmi}};

// kOptionalFeatures' names, comma-separated.
std::string optional_feature_list() {
  std::string out;
  for (const OptionalFeature& f : kOptionalFeatures)
    out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

// Parses a comma- or space-separated list of kOptionalFeatures names into
// `out`; returns "" or what is wrong, naming `what` and the value.
std::string parse_disabled(std::string_view what, std::string_view names, CpuFeatures& out) {
  out = {};
  std::size_t i = 0;
  while (i < names.size()) {
    if (names[i] == ',' || names[i] == ' ') {
      ++i;
      continue;
    }
    const std::size_t end = std::min(names.find_first_of(", ", i), names.size());
    const std::string_view name = names.substr(i, end - i);
    const auto same = [&](const char* known) {
      const std::string_view k(known);
      return k.size() == name.size() &&
             std::equal(name.begin(), name.end(), k.begin(), [](char a, char b) {
               return std::tolower(static_cast<unsigned char>(a)) == b;
             });
    };
    const OptionalFeature* hit = nullptr;
    for (const OptionalFeature& f : kOptionalFeatures)
      if (same(f.name)) hit = &f;
    if (hit == nullptr)
      return detail::concat(what, " = '", names, "' names '", name,
                            "', not an extension that can be switched off; expected ",
                            optional_feature_list(),
                            " (comma- or space-separated, case-insensitive), or empty");
    out.*(hit->field) = true;
    i = end;
  }
  return "";
}

// Reads PAGEDATTN_DISABLE_FEATURES and applies it, or records why it cannot;
// returns whether the value was usable. Never throws.
bool load_environment_disabled() {
  const char* env = std::getenv(kDisableFeaturesVariable);
  CpuFeatures disabled;
  std::string error = parse_disabled(kDisableFeaturesVariable, env ? env : "", disabled);
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  s.disabled = error.empty() ? disabled : CpuFeatures{};
  s.features_env_error = std::move(error);
  s.features_env_invalid = !s.features_env_error.empty();
  return s.features_env_error.empty();
}

// Throws the error an environment value left in `error`.
[[noreturn]] void throw_environment_error(std::string CapState::*error) {
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  throw InvalidArgument(s.*error);
}

// Applied while the library is loaded, before main and before any kernel.
[[maybe_unused]] const bool g_environment_applied = load_environment_cap();
[[maybe_unused]] const bool g_environment_disabled_applied = load_environment_disabled();

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
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  if (t <= HWY_AVX2) {
    out.avx2 = out.fma = out.f16c = true;
    out.avx_vnni = cpu.avx_vnni && !s.disabled.avx_vnni;
  }
  if (t <= HWY_AVX3) {
    out.avx512f = out.avx512bw = out.avx512dq = out.avx512vl = true;
    out.avx512_vnni = cpu.avx512_vnni && !s.disabled.avx512_vnni;
    out.avx512_bf16 = cpu.avx512_bf16 && !s.disabled.avx512_bf16;
    out.amx_bf16 = cpu.amx_bf16 && !s.disabled.amx_bf16;
    out.amx_int8 = cpu.amx_int8 && !s.disabled.amx_int8;
    out.avx512_fp16 = cpu.avx512_fp16 && !s.disabled.avx512_fp16;
    out.avx512_vbmi = cpu.avx512_vbmi && !s.disabled.avx512_vbmi;
  }
#endif
  return out;
}

void set_disabled_features(std::string_view names) {
  CpuFeatures disabled;
  const std::string error = parse_disabled("set_disabled_features: names", names, disabled);
  require(error.empty(), error);
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  s.disabled = disabled;
  s.features_env_error.clear();
  s.features_env_invalid = false;
}

void apply_disabled_features_from_environment() {
  if (!load_environment_disabled()) throw_environment_error(&CapState::features_env_error);
}

std::string disabled_features() {
  CapState& s = cap_state();
  const std::lock_guard lock(s.mutex);
  return feature_names(s.disabled);
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
  add(f.avx_vnni, "avx_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_int8, "amx_int8");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.avx512_vbmi, "avx512_vbmi");
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
  if (!load_environment_cap()) throw_environment_error(&CapState::env_error);
}

namespace core {

void require_valid_dispatch_environment(const char* call) {
  CapState& s = cap_state();
  if (!s.env_invalid && !s.features_env_invalid)
    return;  // every call but the failing ones stops here
  const std::lock_guard lock(s.mutex);
  require(s.env_error.empty(), call, ": ", s.env_error);
  require(s.features_env_error.empty(), call, ": ", s.features_env_error);
}

}  // namespace core
}  // namespace pagedattn
