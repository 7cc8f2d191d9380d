// `pagedattn generate`: text from a real GGUF model, streamed as it is made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tools {

struct GenerateOptions {
  std::string model;   // FILE.gguf (required)
  std::string prompt;  // required
  bool chat = false;   // wrap the prompt in the model's chat template
  // Without --chat: control-token text in the prompt ("<|im_start|>")
  // becomes control tokens (--no-parse-special: plain text). With --chat the
  // prompt is a message, whose text stays plain (docs/serve.md, "Special tokens").
  bool parse_special = true;
  std::string system;  // chat: a system message ("" = the template's default)
  std::int32_t max_tokens = 128;
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  std::int32_t top_k = 0;
  std::optional<std::uint64_t> seed;
  double kv_memory_mib = 256.0;
  bool ignore_eos = false;           // generate max_tokens whatever the model says (benchmarks)
  std::int32_t tensor_parallel = 1;  // ranks sharing the model (under mpirun)
  bool disaggregate = false;         // under mpirun -np 2: rank 0 prefills, rank 1 decodes
  bool check_tensors = false;        // scan the weights for NaN / Inf before generating
  bool int8_activations = false;     // EngineConfig::int8_activations
  bool bf16_products = false;        // EngineConfig::bf16_products
  bool exact_products = false;       // EngineConfig::exact_products
  bool pin_threads = false;          // EngineConfig::pin_threads
  DType kv_dtype = DType::kF16;      // EngineConfig::kv_dtype (--kv-cache-dtype)
  bool help = false;
};

// Parses argv[first..argc) (cli_flags.h). InvalidArgument naming the flag and value.
GenerateOptions parse_generate_options(int argc, char** argv, int first);
std::string generate_help();  // --help, from the flags' definitions
int run_generate(int argc, char** argv);
// generate --disaggregate (builds with MPI only, generate_disagg.cc): the
// prompt's K/V moves from the prefill rank to the decode rank, which prints
// the text.
int run_generate_disaggregated(const EngineConfig& config, const std::vector<std::int32_t>& prompt,
                               const SamplingParams& params, const Tokenizer& tokenizer);

}  // namespace pagedattn::tools
