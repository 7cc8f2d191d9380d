// The body of POST /v1/completions or /v1/chat/completions, checked and
// turned into what the engine takes. Every problem is an ApiError: 400
// naming the field for a malformed or out-of-range field, 413 for a prompt
// (plus max_tokens) longer than the model's context or the KV pool.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/engine.h"
#include "text_codec.h"

namespace pagedattn::serve {

enum class Endpoint { kCompletions, kChat };

// What the served model and engine can take.
struct RequestLimits {
  std::int32_t vocab_size = 0;
  std::int32_t max_position = 0;  // prompt + max_tokens at most
  std::int64_t num_pages = 0;     // KV pool
  std::int32_t page_size = 16;
  std::int32_t max_n = 1;  // samples per request
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::vector<std::int32_t> prompt_ids;
  // Logprobs: params.logprobs (completions' `logprobs`, chat's `top_logprobs`
  // once `logprobs` is true), and with echo params.prompt_logprobs.
  SamplingParams params;
  // Stop strings, part of the output only with params.include_stop_str_in_output.
  std::vector<std::string> stop;
  // Completions' `echo`: each choice's text (and logprobs) starts with the
  // prompt, `prompt_text`: the prompt as sent, or its token ids decoded.
  bool echo = false;
  std::string prompt_text;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a final usage chunk
};

GenerationRequest parse_generation_request(std::string_view body, Endpoint endpoint,
                                           const TextCodec& codec, const RequestLimits& limits);

}  // namespace pagedattn::serve
