// One accepted completion request on its HTTP thread: it reads the request's
// channel, turns tokens into text per sample (incremental decoding, stop
// strings held back across chunks), and writes OpenAI's JSON - the whole
// response, or Server-Sent Events chunk by chunk.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine_worker.h"
#include "openai_request.h"
#include "pagedattn/stop_matcher.h"
#include "text_codec.h"

namespace pagedattn::serve {

// One token's logprobs as a response shows them, its texts decoded.
struct LogprobEntry {
  std::string token{};             // the token's bytes (TextCodec::token_text)
  std::optional<float> logprob{};  // none: the prompt's first token (it has no context)
  std::vector<std::pair<std::string, float>> top{};  // the most likely tokens, most likely first
  std::int64_t text_offset = 0;  // characters of the choice's text before the token
};

class GenerationJob {
 public:
  GenerationJob(GenerationRequest request, EngineWorker::Ticket ticket, const TextCodec& codec,
                std::string model_name, EngineWorker& worker, ServerMetrics& metrics);

  // Non-streamed: waits up to `timeout` for the end; true once the engine is
  // done with the request.
  bool wait_finished(std::chrono::milliseconds timeout);
  // Non-streamed, after wait_finished: the response body; ApiError 500 when
  // the engine failed the request.
  std::string whole_body();
  // Streamed: waits up to `timeout` for news and returns the SSE events it
  // makes (possibly none); after the last call done() is true.
  std::string next_events(std::chrono::milliseconds timeout);
  bool done() const { return done_; }
  // The HTTP side is finished with the request (normally, or the client left).
  void release(bool delivered);

 private:
  struct Sample {
    Sample(std::unique_ptr<TextStream> d, StopMatcher m)
        : decoder(std::move(d)), matcher(std::move(m)) {}
    std::unique_ptr<TextStream> decoder;
    StopMatcher matcher;
    std::string text;                    // non-streamed: everything; streamed: the unsent delta
    std::vector<LogprobEntry> logprobs;  // non-streamed: every token's; streamed: the unsent
    std::int64_t characters = 0;         // the text's so far: the next token's text_offset
    std::int64_t tokens = 0;
    const char* finish = nullptr;  // set once the sample is done
    bool role_sent = false;
  };
  void absorb(const RequestChannel::News& news);
  void absorb_sample(const SampleOutput& out);
  void absorb_prompt_logprobs(const std::vector<TokenLogprobs>& prompt);
  LogprobEntry logprob_entry(const TokenLogprobs& lp, std::int64_t text_offset) const;
  bool all_samples_done() const;
  std::string usage_json() const;
  std::string chunk(std::size_t index, Sample& s);
  std::string final_body();

  GenerationRequest request_;
  EngineWorker::Ticket ticket_;
  const TextCodec& codec_;
  std::string model_name_;
  std::string id_;
  std::int64_t created_;
  EngineWorker& worker_;
  ServerMetrics& metrics_;
  std::unordered_set<std::int32_t> hidden_tokens_;  // end-of-turn tokens: not text
  std::vector<Sample> samples_;
  std::string error_;
  bool finished_ = false;  // the engine is done with the request
  bool done_ = false;      // the HTTP side has written everything
};

}  // namespace pagedattn::serve
