// A live progress line on a terminal (redrawn in place, at most 10 times a
// second); on a pipe or file, one plain line per 10% instead.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace pagedattn::tools {

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, std::int64_t total);
  // `done` of total finished; `detail` is shown after the bar.
  void update(std::int64_t done, const std::string& detail);
  void finish();

 private:
  std::FILE* out_;
  std::int64_t total_;
  bool tty_;
  double last_draw_ = -1.0;
  std::int64_t last_decile_ = -1;
};

}  // namespace pagedattn::tools
