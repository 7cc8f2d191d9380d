#include "bench_serve_sse.h"

namespace pagedattn::tools {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  for (std::size_t newline; (newline = bytes.find('\n')) != std::string_view::npos;) {
    line_.append(bytes.substr(0, newline));
    bytes.remove_prefix(newline + 1);
    if (line_.ends_with('\r')) line_.pop_back();
    take_line(line_, events);
    line_.clear();
  }
  line_.append(bytes);
  return events;
}

void SseParser::take_line(std::string_view line, std::vector<std::string>& events) {
  if (line.empty()) {  // a blank line ends the event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (!line.starts_with("data:")) return;  // a comment (":...") or another field
  line.remove_prefix(5);
  if (line.starts_with(' ')) line.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(line);
  has_data_ = true;
}

}  // namespace pagedattn::tools
