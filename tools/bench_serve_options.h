// bench-serve's command line.
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/dtype.h"

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
  bool prefix_caching = false;         // --prefix-caching on|off
  double host_kv_memory_mib = 0.0;     // host-memory tier for swapped-out pages; 0: none
  bool bf16_products = false;          // EngineConfig::bf16_products
  bool exact_products = false;         // EngineConfig::exact_products
  bool pin_threads = false;            // EngineConfig::pin_threads
  DType kv_dtype = DType::kF16;        // EngineConfig::kv_dtype (--kv-cache-dtype)
  bool int8_activations = false;       // EngineConfig::int8_activations
  std::int32_t shared_prefixes = 4;    // --workload shared-prefix
  std::int32_t shared_prefix_len = 0;  // 0: the preset's default
  std::int32_t turns = 4;              // --workload multi-turn
  std::int32_t tensor_parallel = 1;    // ranks sharing the model (under mpirun)
  bool quick = false;
  bool probes = false;  // measure the machine probes for the roofline figures
  std::uint64_t seed = 1;
  std::string json;  // empty: no JSON file
  bool help = false;
  // Against a server over HTTP (--url): the engine flags above do not apply.
  std::string url;               // empty: serve in-process
  std::string api_key;           // sent as "Authorization: Bearer KEY"
  std::string model_name;        // empty: the first model the server lists
  std::int32_t concurrency = 0;  // requests in flight; 0: one connection per request
  double timeout_s = 600.0;      // per request: connect, and silence while streaming
  bool text_prompts = false;     // prompts as text instead of token ids
};

// Upper bounds of the numeric flags (a trace of more requests, or pages larger
// than this, is a typo rather than a benchmark).
inline constexpr std::int32_t kMaxNumRequests = 1'000'000;
inline constexpr std::int32_t kMaxPageSize = 1 << 16;
inline constexpr double kMaxTimeoutSeconds = 86400.0;  // longer is capped to this
inline constexpr std::int32_t kMaxConcurrency = 1024;  // threads and sockets of the client

// Parses argv[first..argc) (cli_flags.h). InvalidArgument naming the flag and
// value: every number must be finite and in range, integers integer-valued;
// the engine flags only without --url, the HTTP client's only with it.
BenchServeOptions parse_bench_serve_options(int argc, char** argv, int first);
std::string bench_serve_help();  // --help, from the flags' definitions

}  // namespace pagedattn::tools
