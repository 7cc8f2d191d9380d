// NUMA placement of memory and the binding of OpenMP threads
// (src/core/placement.h). A one-node machine runs the mechanisms (a
// policy of one node is still a policy the kernel reports), not the
// spreading's effect.
#include "core/placement.h"

#include "core/huge_page_vector.h"

#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"

#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <omp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace pagedattn::core {
namespace {

int thread_policy() {
  int mode = -1;
  if (syscall(SYS_get_mempolicy, &mode, nullptr, 0ul, nullptr, 0ul) != 0) return -1;
  return mode;
}

// The /proc/self/numa_maps line of the mapping at `address`, or "".
std::string numa_maps_line(const void* address) {
  std::ifstream in("/proc/self/numa_maps");
  char hex[32];
  std::snprintf(hex, sizeof hex, "%lx ",
                static_cast<unsigned long>(reinterpret_cast<std::uintptr_t>(address)));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(hex, 0) == 0) return line;
  return "";
}

TEST(Placement, ParsesLinuxIdLists) {
  EXPECT_EQ(parse_id_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_id_list("0"), (std::vector<int>{0}));
  EXPECT_TRUE(parse_id_list("").empty());
  EXPECT_TRUE(parse_id_list("3-1").empty());
  EXPECT_TRUE(parse_id_list("0,x").empty());
  EXPECT_TRUE(parse_id_list("-1").empty());
  EXPECT_FALSE(memory_nodes().empty());
}

TEST(Placement, InterleavesAMappingsPagesBeforeTheyAreTouched) {
  if (thread_policy() < 0) GTEST_SKIP() << "the kernel has no NUMA memory policies";
  const std::size_t bytes = 8 << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_TRUE(interleave_pages(p, bytes));
  const std::string line = numa_maps_line(p);
  if (!line.empty()) {
    EXPECT_NE(line.find("interleave"), std::string::npos) << line;
  }
  EXPECT_FALSE(interleave_pages(nullptr, bytes));
  munmap(p, bytes);
}

// Pages of [p, p + bytes) that are resident (mincore).
std::size_t resident_pages(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, in_core.data()) != 0) return 0;
  return static_cast<std::size_t>(
      std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

TEST(Placement, TouchingPagesMakesEveryOneResident) {
  const std::size_t bytes = (5 << 20) + 12345;  // chunks of 2 MiB and a tail
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(resident_pages(p, bytes), 0u);
  touch_pages(p, bytes);
  EXPECT_EQ(resident_pages(p, bytes), (bytes + page - 1) / page);
  const auto* bytes_seen = static_cast<const unsigned char*>(p);
  EXPECT_EQ(*std::max_element(bytes_seen, bytes_seen + bytes), 0);  // still zeros
  munmap(p, bytes);
  touch_pages(nullptr, bytes);  // nothing to touch
}

// A cache made with prefault_pages holds its whole pool resident before any
// step; without, its pages wait for their first write.
TEST(Placement, APrefaultedCachesPoolIsResidentFromTheStart) {
  for (const bool prefault : {false, true}) {
    KVCacheConfig c;
    c.num_layers = 3;
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.page_size = 16;
    c.num_pages = 512;
    c.kv_dtype = DType::kF16;
    c.prefault_pages = prefault;
    const PagedKVCache cache(c);
    for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
      const PagedKVStorage s = cache.layer_storage(layer);
      const std::size_t k_bytes = static_cast<std::size_t>(s.k_page_stride * s.num_pages) * 2;
      const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      const std::size_t all = k_bytes / page;  // whole pages inside the K region
      const std::size_t resident = resident_pages(s.k_data, all * page);
      if (prefault) {
        EXPECT_EQ(resident, all) << "layer " << layer;
      } else {
        EXPECT_LT(resident, all) << "layer " << layer;
      }
    }
  }
}

// A pool to touch that the machine cannot hold is refused with the reason,
// before anything is mapped, instead of the OOM killer ending the process.
TEST(Placement, APrefaultedPoolLargerThanTheMemoryLeftIsRefused) {
  const std::int64_t available = available_memory_bytes();
  if (available < 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  KVCacheConfig c;
  c.num_layers = 4;
  c.num_qo_heads = 8;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  c.kv_dtype = DType::kF16;
  const std::int64_t page_bytes = std::int64_t{c.num_layers} * 2 * c.page_size * 8 * 128 * 2;
  c.num_pages = 2 * available / page_bytes + 1;
  c.prefault_pages = true;
  try {
    const PagedKVCache cache(c);
    FAIL() << "a pool of twice the available memory was touched";
  } catch (const OutOfPages& e) {
    EXPECT_NE(std::string(e.what()).find("MemAvailable"), std::string::npos) << e.what();
  }
}

TEST(Placement, NewPagesAreInterleavedOnlyWhileTheGuardLives) {
  if (thread_policy() < 0) GTEST_SKIP() << "the kernel has no NUMA memory policies";
  ASSERT_EQ(thread_policy(), MPOL_DEFAULT);
  {
    const InterleaveNewPages off(false);
    EXPECT_FALSE(off.active());
    EXPECT_EQ(thread_policy(), MPOL_DEFAULT);
  }
  {
    const InterleaveNewPages on(true);
    EXPECT_TRUE(on.active());
    EXPECT_EQ(thread_policy(), MPOL_INTERLEAVE);
    // Under the default policy the engine spreads only over several nodes.
    EXPECT_FALSE(spread_memory_over_nodes());  // not the default policy now
  }
  EXPECT_EQ(thread_policy(), MPOL_DEFAULT);
  EXPECT_EQ(spread_memory_over_nodes(), memory_nodes().size() > 1);
}

// On a thread of its own: binding reaches that thread's OpenMP threads only,
// and the rest of the suite keeps unbound ones.
TEST(Placement, BindsEachOpenMpThreadToItsOwnCpu) {
  const std::vector<int> cpus = process_cpus();
  ASSERT_FALSE(cpus.empty());
  std::vector<std::vector<int>> bound;
  int pinned = -1, threads = 0;
  std::thread([&] {
    threads = std::min<int>(2, static_cast<int>(cpus.size()));
    omp_set_num_threads(threads);
    pinned = pin_openmp_threads();
    bound.resize(static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(threads)
    {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof set, &set);
      std::vector<int>& mine = bound[static_cast<std::size_t>(omp_get_thread_num())];
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) mine.push_back(cpu);
    }
  }).join();
  ASSERT_EQ(pinned, threads);
  std::set<int> distinct;
  for (const std::vector<int>& mine : bound) {
    ASSERT_EQ(mine.size(), 1u);
    distinct.insert(mine[0]);
  }
  EXPECT_EQ(static_cast<int>(distinct.size()), threads);
  // What the process was given, not the one CPU of a bound thread.
  EXPECT_EQ(process_cpus(), cpus);
}

// The VmFlags of the mapping in /proc/self/smaps that holds `p` ("" when
// none does).
std::string mapping_flags(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    std::uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find('-') < 16) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Weights' vectors: from kHugePageBytes up, a mapping of their own on a
// huge-page boundary advised MADV_HUGEPAGE (smaps' "hg" flag, set whatever
// THP's mode, where the kernel has THP at all); smaller ones on a cache
// line. Contents survive growth, which moves them to a new mapping.
TEST(HugePageVector, LargeVectorsStartOnAHugePageAdvisedForHugePages) {
  HugePageVector<std::byte> small(1000), large(3 * kHugePageBytes + 5);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.data()) % kCacheLineBytes, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHugePageBytes, 0u);
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = std::byte(i % 251);
  large.resize(5 * kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHugePageBytes, 0u);
  for (std::size_t i = 0; i < 3 * kHugePageBytes + 5; i += 4093)
    ASSERT_EQ(large[i], std::byte(i % 251)) << i;
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    const std::string flags = mapping_flags(large.data());
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  }
  HugePageVector<float> copied(large.size() / 4, 1.5f);
  copied = HugePageVector<float>(10, 2.0f);  // a large one freed, a small one in its place
  EXPECT_EQ(copied.back(), 2.0f);
}

}  // namespace
}  // namespace pagedattn::core
