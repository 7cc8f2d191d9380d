// `pagedattn serve`: the OpenAI-compatible HTTP server (docs/serve.md).
#pragma once

#include <string>

#include "http_server.h"
#include "pagedattn/dtype.h"
#include "text_codec.h"

namespace pagedattn::serve {

struct ServeOptions {
  std::string model;  // FILE.gguf or a preset name (tiny, small, 1b)
  ServerOptions server;
  double kv_memory_mib = 256.0;
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 2048;
  std::int32_t max_position = 0;  // presets and GGUF: 0 keeps the model's own
  bool enable_prefix_caching = false;
  double host_kv_memory_mib = 0.0;   // 0: no host tier
  bool bf16_products = false;        // EngineConfig::bf16_products
  bool exact_products = false;       // EngineConfig::exact_products
  bool pin_threads = false;          // EngineConfig::pin_threads
  DType kv_dtype = DType::kF16;      // EngineConfig::kv_dtype (--kv-cache-dtype)
  bool int8_activations = false;     // EngineConfig::int8_activations
  bool deterministic = false;        // EngineConfig::deterministic
  std::int32_t tensor_parallel = 1;  // ranks sharing the model (under mpirun)
  bool disaggregate = false;         // under mpirun: rank 0 decodes, the others prefill
  // make_gguf_codec's policy: completions' text prompts parse control-token
  // text (--no-parse-special-in-prompts: not); chat messages do not unless
  // --parse-special-in-messages (trusted clients only).
  SpecialTokenPolicy special_tokens;
  bool check_tensors = false;  // GgufModelOptions::check_tensors (--check-tensors)
  bool help = false;
};

// Parses argv[first..argc) (tools/cli_flags.h). InvalidArgument naming the
// flag and value.
ServeOptions parse_serve_options(int argc, char** argv, int first);
std::string serve_help();  // --help, from the flags' definitions
// Builds the server for `options` (model, codec, engine). With
// --tensor-parallel, on ranks other than 0: follows rank 0's steps until its
// server stops, then returns null (rank 0 serves).
std::unique_ptr<HttpServer> make_server(const ServeOptions& options);
int run_serve(int argc, char** argv);

}  // namespace pagedattn::serve
