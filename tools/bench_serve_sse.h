// Server-sent events (the text/event-stream of a streaming completion), parsed
// incrementally: bytes arrive in arbitrary pieces, events come out whole.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::tools {

class SseParser {
 public:
  // Appends `bytes` and returns the data of every event they complete (the
  // "data:" lines of one event joined with '\n'; events without data, comments
  // and other fields are skipped). Lines end in "\n" or "\r\n".
  std::vector<std::string> feed(std::string_view bytes);

  // Bytes of an unfinished line or event are pending (a stream that ends here
  // was cut off).
  bool pending() const { return !line_.empty() || has_data_; }

 private:
  void take_line(std::string_view line, std::vector<std::string>& events);

  std::string line_;  // the unfinished line
  std::string data_;  // the unfinished event's data
  bool has_data_ = false;
};

}  // namespace pagedattn::tools
