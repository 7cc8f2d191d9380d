// libFuzzer harness: the bytes are the body of a completions (first byte
// even) or chat completions request to `pagedattn serve`. Parsing must either
// succeed with a request the engine accepts, or throw ApiError (the HTTP
// error the client gets); any other exception or failure is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "api_error.h"
#include "openai_request.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "text_codec.h"

namespace pagedattn::fuzz {
namespace {

constexpr serve::RequestLimits kLimits{
    .vocab_size = 1024, .max_position = 256, .num_pages = 24, .page_size = 8, .max_n = 8};

void check(bool condition) {
  if (!condition) std::abort();
}

// What Engine::add_request would refuse.
void check_accepted(const serve::GenerationRequest& r) {
  check(!r.prompt_ids.empty());
  for (std::int32_t id : r.prompt_ids) check(id >= 0 && id < kLimits.vocab_size);
  for (std::int32_t id : r.params.stop_token_ids) check(id >= 0 && id < kLimits.vocab_size);
  check(r.params.max_tokens >= 1);
  check(std::int64_t(r.prompt_ids.size()) + r.params.max_tokens <= kLimits.max_position);
  check(r.params.n >= 1 && r.params.n <= kLimits.max_n);
  check(r.params.temperature >= 0.0f && r.params.top_p > 0.0f && r.params.top_p <= 1.0f);
  check(r.params.top_k >= 0);
  for (const auto& [id, bias] : r.params.logit_bias) check(id >= 0 && id < kLimits.vocab_size);
  check(r.params.min_tokens <= r.params.max_tokens);
  // The engine's own check of every field it takes (ranges, duplicates).
  try {
    check_sampling_params(r.params);
  } catch (const InvalidArgument&) {
    check(false);
  }
}

}  // namespace
}  // namespace pagedattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedattn;
  static const auto codec = serve::make_byte_codec(1024, 2);
  if (size == 0) return 0;
  const auto endpoint = data[0] % 2 == 0 ? serve::Endpoint::kCompletions : serve::Endpoint::kChat;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    fuzz::check_accepted(serve::parse_generation_request(body, endpoint, *codec, fuzz::kLimits));
  } catch (const serve::ApiError& e) {
    fuzz::check(e.status() == 400 || e.status() == 413);
    (void)e.to_json();
  }
  return 0;
}
