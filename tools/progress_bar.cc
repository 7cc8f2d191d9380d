#include "progress_bar.h"

#include <unistd.h>

#include "core/seconds_since.h"

namespace pagedattn::tools {

ProgressBar::ProgressBar(std::FILE* out, std::int64_t total)
    : out_(out), total_(total > 0 ? total : 1), tty_(isatty(fileno(out)) != 0) {}

void ProgressBar::update(std::int64_t done, const std::string& detail) {
  if (!tty_) {
    const std::int64_t decile = done * 10 / total_;
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(out_, "  %3lld%%  %lld/%lld requests  %s\n", static_cast<long long>(decile * 10),
                 static_cast<long long>(done), static_cast<long long>(total_), detail.c_str());
    std::fflush(out_);
    return;
  }
  const double t = steady_seconds();
  if (done < total_ && t - last_draw_ < 0.1) return;
  last_draw_ = t;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(done * kWidth / total_);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(out_, "\r  [%s] %lld/%lld  %s\033[K", bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), detail.c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace pagedattn::tools
