// Stop strings over streamed text (SamplingParams::stop): text is fed chunk
// by chunk, and what may be the start of a stop string is held back until it
// is known not to be, so a stop string split across chunks is still found
// and never sent. The server and Python's LLM both apply stops with it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

class StopMatcher {
 public:
  // Empty strings are ignored. `keep_stop` (SamplingParams::
  // include_stop_str_in_output): the text released at a stop ends with the
  // stop string rather than before it.
  explicit StopMatcher(std::vector<std::string> stops, bool keep_stop = false);

  struct Result {
    std::string text;      // safe to send now
    bool stopped = false;  // a stop string matched: `text` ends before it (or with it: keep_stop)
    std::string matched;   // with `stopped`: the stop string found
  };
  // Feed the next chunk. After a stop, further calls return nothing.
  Result feed(std::string_view chunk);
  // The held-back tail (the stream ended without a stop).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool keep_stop_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace pagedattn
