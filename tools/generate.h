// `pagedattn generate`: text from a real GGUF model, streamed as it is made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pagedattn::tools {

struct GenerateOptions {
  std::string model;   // FILE.gguf (required)
  std::string prompt;  // required
  bool chat = false;   // wrap the prompt in the model's chat template
  std::string system;  // chat: a system message ("" = the template's default)
  std::int32_t max_tokens = 128;
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  std::int32_t top_k = 0;
  std::optional<std::uint64_t> seed;
  double kv_memory_mib = 256.0;
  bool ignore_eos = false;  // generate max_tokens whatever the model says (benchmarks)
  std::int32_t tensor_parallel = 1;  // ranks sharing the model (under mpirun)
  bool help = false;
};

// Parses argv[first..argc). InvalidArgument naming the flag and value.
GenerateOptions parse_generate_options(int argc, char** argv, int first);
const char* generate_usage();
int run_generate(int argc, char** argv);

}  // namespace pagedattn::tools
