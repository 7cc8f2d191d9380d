#include "core/placement.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>

#if defined(__linux__)
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/own_thread.h"

namespace pagedattn::core {
namespace {

#if defined(__linux__)
// A node mask for the mempolicy calls: bit n for node n.
struct NodeMask {
  static constexpr int kNodes = 1024;
  unsigned long bits[kNodes / (8 * sizeof(unsigned long))] = {};
  explicit NodeMask(const std::vector<int>& nodes) {
    constexpr int kBitsPerWord = 8 * sizeof(unsigned long);
    for (int n : nodes)
      if (n >= 0 && n < kNodes) bits[n / kBitsPerWord] |= 1ul << (n % kBitsPerWord);
  }
};

bool default_memory_policy() {
  int mode = -1;
  return syscall(SYS_get_mempolicy, &mode, nullptr, 0ul, nullptr, 0ul) == 0 && mode == MPOL_DEFAULT;
}
#endif

}  // namespace

std::vector<int> parse_id_list(std::string_view text) {
  std::vector<int> ids;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const std::size_t dash = item.find('-');
    const std::string_view first = item.substr(0, dash);
    const std::string_view last = dash == std::string_view::npos ? first : item.substr(dash + 1);
    int a = 0, b = 0;
    const auto [pa, ea] = std::from_chars(first.data(), first.data() + first.size(), a);
    const auto [pb, eb] = std::from_chars(last.data(), last.data() + last.size(), b);
    if (ea != std::errc{} || eb != std::errc{} || pa != first.data() + first.size() ||
        pb != last.data() + last.size() || a < 0 || b < a || b - a > 1 << 16)
      return {};
    for (int id = a; id <= b; ++id) ids.push_back(id);
  }
  return ids;
}

std::vector<int> memory_nodes() {
  std::ifstream in("/sys/devices/system/node/has_memory");
  std::string line;
  if (!std::getline(in, line)) return {0};
  std::vector<int> nodes = parse_id_list(line);
  return nodes.empty() ? std::vector<int>{0} : nodes;
}

bool spread_memory_over_nodes() {
#if defined(__linux__)
  return memory_nodes().size() > 1 && default_memory_policy();
#else
  return false;
#endif
}

bool interleave_pages(void* data, std::size_t bytes) {
#if defined(__linux__)
  if (data == nullptr || bytes == 0) return false;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(data) + bytes;
  const NodeMask mask(memory_nodes());
  return syscall(SYS_mbind, begin, end - begin, MPOL_INTERLEAVE, mask.bits,
                 static_cast<unsigned long>(NodeMask::kNodes), 0u) == 0;
#else
  (void)data;
  (void)bytes;
  return false;
#endif
}

InterleaveNewPages::InterleaveNewPages(bool spread) {
#if defined(__linux__)
  if (!spread) return;
  const NodeMask mask(memory_nodes());
  active_ = syscall(SYS_set_mempolicy, MPOL_INTERLEAVE, mask.bits,
                    static_cast<unsigned long>(NodeMask::kNodes)) == 0;
#else
  (void)spread;
#endif
}

InterleaveNewPages::~InterleaveNewPages() {
#if defined(__linux__)
  if (active_) syscall(SYS_set_mempolicy, MPOL_DEFAULT, nullptr, 0ul);
#endif
}

std::int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    const std::size_t at = line.find_first_not_of(' ', 13);
    if (at == std::string::npos) return -1;
    std::int64_t kib = -1;
    const auto [end, error] = std::from_chars(line.data() + at, line.data() + line.size(), kib);
    return error == std::errc{} && kib >= 0 ? kib * 1024 : -1;
  }
  return -1;
}

void touch_pages(void* data, std::size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  auto* base = static_cast<volatile unsigned char*>(data);
  constexpr std::size_t kChunk = std::size_t{2} << 20;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto chunks = static_cast<std::int64_t>((bytes + kChunk - 1) / kChunk);
  run_on_own_thread([&] {  // no team of the caller's outlives the touch
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < chunks; ++i) {
      const std::size_t begin = static_cast<std::size_t>(i) * kChunk;
      const std::size_t end = std::min(bytes, begin + kChunk);
      for (std::size_t at = begin; at < end; at += page) base[at] = 0;
    }
  });
}

namespace {

std::mutex g_pinning_mutex;
std::vector<int> g_cpus_before_pinning;  // empty until a thread is bound

std::vector<int> calling_thread_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
#endif
  return cpus;
}

}  // namespace

std::vector<int> process_cpus() {
  {
    const std::lock_guard lock(g_pinning_mutex);
    if (!g_cpus_before_pinning.empty()) return g_cpus_before_pinning;
  }
  return calling_thread_cpus();
}

int pin_openmp_threads() {
#if defined(__linux__)
  const std::vector<int> cpus = process_cpus();
  const int threads = omp_get_max_threads();
  if (cpus.empty() || threads > static_cast<int>(cpus.size())) return 0;
  {
    const std::lock_guard lock(g_pinning_mutex);
    if (g_cpus_before_pinning.empty()) g_cpus_before_pinning = cpus;
  }
  std::atomic<int> pinned{0};
#pragma omp parallel num_threads(threads)
  {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[static_cast<std::size_t>(omp_get_thread_num())], &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0) ++pinned;
  }
  return pinned.load();
#else
  return 0;
#endif
}

}  // namespace pagedattn::core
