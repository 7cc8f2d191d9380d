#include "pagedattn/stop_matcher.h"

#include <algorithm>
#include <cstddef>

namespace pagedattn {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool keep_stop) : keep_stop_(keep_stop) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::feed(std::string_view chunk) {
  if (stopped_) return {};
  pending_ += chunk;
  std::size_t first = std::string::npos;
  const std::string* found = nullptr;
  for (const std::string& s : stops_)
    if (const std::size_t at = pending_.find(s); at < first) first = at, found = &s;
  if (found != nullptr) {
    stopped_ = true;
    Result r{pending_.substr(0, keep_stop_ ? first + found->size() : first), true, *found};
    pending_.clear();
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  std::size_t keep = 0;
  for (const std::string& s : stops_) {
    const std::size_t longest = std::min(s.size() - 1, pending_.size());
    for (std::size_t len = longest; len > keep; --len)
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
  }
  Result r{pending_.substr(0, pending_.size() - keep), false, {}};
  pending_.erase(0, pending_.size() - keep);
  return r;
}

std::string StopMatcher::finish() {
  std::string rest;
  rest.swap(pending_);
  return stopped_ ? std::string() : rest;
}

}  // namespace pagedattn
