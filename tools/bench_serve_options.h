// bench-serve's command line.
#pragma once

#include <cstdint>
#include <string>

namespace pagedattn::tools {

struct BenchServeOptions {
  std::string model = "tiny";              // tiny | small | 1b
  std::string workload = "sharegpt-like";  // a built-in name or a .jsonl trace
  std::int32_t num_requests = 0;           // 0: the preset's default
  double request_rate = 0.0;               // 0: all at once
  double kv_memory_mib = 0.0;              // 0: the preset's default
  std::int32_t page_size = 16;
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 2048;
  bool chunked_prefill = true;
  bool deterministic = false;
  bool quick = false;
  std::uint64_t seed = 1;
  std::string json;  // empty: no JSON file
  bool help = false;
};

// Upper bounds of the numeric flags (a trace of more requests, or pages larger
// than this, is a typo rather than a benchmark).
inline constexpr std::int32_t kMaxNumRequests = 1'000'000;
inline constexpr std::int32_t kMaxPageSize = 1 << 16;

// Parses argv[first..argc). InvalidArgument naming the flag and value: every
// number must be finite and in range, integers integer-valued.
BenchServeOptions parse_bench_serve_options(int argc, char** argv, int first);
const char* bench_serve_usage();

}  // namespace pagedattn::tools
