// Where the engine's memory and threads live on a machine of several NUMA
// nodes (Linux; elsewhere every call does nothing).
//
// A decode step reads every weight and the K/V of every running sequence
// once, from whichever thread the work falls to (attention items go to the
// next free thread, products split rows over all of them). Memory on one
// node would cap the step at that node's bandwidth while the other nodes'
// sat idle, so the weights and the K/V pool are spread page by page over
// every node with memory (MPOL_INTERLEAVE), as llama.cpp's `--numa
// distribute` and vLLM's CPU backend do. A process the user has placed
// (numactl --membind / --interleave / --preferred, or any set_mempolicy) is
// left as placed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace pagedattn::core {

// The numbers in a Linux list ("0-3,8,10-11"), ascending; empty for text
// that is not one.
std::vector<int> parse_id_list(std::string_view text);

// Nodes with memory (/sys/devices/system/node/has_memory); {0} where the
// kernel has no NUMA.
std::vector<int> memory_nodes();

// Whether the engine spreads its memory over the nodes: more than one node
// has memory and the process runs under the default memory policy.
bool spread_memory_over_nodes();

// Spreads the pages of [data, data + bytes) not yet touched over
// memory_nodes() (mbind MPOL_INTERLEAVE; the range is widened to whole
// pages). Returns whether the kernel took the policy.
bool interleave_pages(void* data, std::size_t bytes);

// While alive, the calling thread's new pages (those it touches first:
// vectors it fills, file pages it reads into the page cache) are spread
// over memory_nodes() (set_mempolicy MPOL_INTERLEAVE); the default policy
// comes back at the end. Does nothing unless `spread` (the model loaders
// pass spread_memory_over_nodes()).
class InterleaveNewPages {
 public:
  explicit InterleaveNewPages(bool spread);
  ~InterleaveNewPages();
  InterleaveNewPages(const InterleaveNewPages&) = delete;
  InterleaveNewPages& operator=(const InterleaveNewPages&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

// The CPUs this process may run on, ascending: the calling thread's
// affinity (sched_getaffinity), or, once pin_openmp_threads has bound some
// thread, the affinity that thread had before (what the process was given,
// not the one CPU left to a bound thread).
std::vector<int> process_cpus();

// The memory the kernel estimates it can give without swapping
// (/proc/meminfo MemAvailable), in bytes; -1 where it does not say.
std::int64_t available_memory_bytes();

// Makes every page of [data, data + bytes) resident now (written once:
// an anonymous mapping's pages stay zero), in 2 MiB chunks spread over
// OpenMP's threads, so that the kernel zeroes them here rather than at
// their first use.
void touch_pages(void* data, std::size_t bytes);

// Binds the calling thread's OpenMP threads, one each, to process_cpus():
// thread i (the calling thread is 0) to the i-th CPU in ascending order
// (Linux numbers a machine's cores before their SMT siblings, and a node's
// cores together), in a parallel region of omp_get_max_threads() threads,
// which OpenMP keeps for the calling thread's later regions (a thread that
// starts parallel regions has threads of its own). Threads the calling
// thread creates afterwards inherit its one CPU. Returns the threads bound
// (0 where there are more threads than CPUs: nothing is bound).
int pin_openmp_threads();

}  // namespace pagedattn::core
