#include "serve_metrics.h"

#include <algorithm>
#include <cmath>

namespace pagedattn::tools {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

ServeSummary summarize_requests(const std::vector<RequestTiming>& requests, double duration_s) {
  ServeSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot;
  for (const RequestTiming& r : requests) {
    if (r.finish < 0) continue;
    ++s.completed;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.first_token - r.arrival);
    if (r.longest_sample > 1) tpot.push_back((r.finish - r.first_token) / (r.longest_sample - 1));
  }
  s.ttft_p50 = percentile(ttft, 50);
  s.ttft_p99 = percentile(ttft, 99);
  s.tpot_p50 = percentile(tpot, 50);
  s.tpot_p99 = percentile(tpot, 99);
  if (s.duration_s > 0) {
    s.requests_per_s = s.completed / s.duration_s;
    s.output_tokens_per_s = double(s.output_tokens) / s.duration_s;
  }
  return s;
}

ServeSummary summarize(const std::vector<RequestTiming>& requests,
                       const std::vector<StepSample>& steps, std::int32_t page_size) {
  ServeSummary s = summarize_requests(requests, steps.empty() ? 0.0 : steps.back().time);
  s.page_size = page_size;
  s.steps = std::ssize(steps);
  std::int64_t stored = 0, reserved = 0, in_use = 0, unshared = 0;
  for (const StepSample& x : steps) {
    s.peak_batch = std::max(s.peak_batch, x.running_seqs);
    s.peak_pages = std::max(s.peak_pages, x.pages_in_use);
    stored += x.token_states_stored;
    reserved += x.pages_in_use * page_size;
    in_use += x.pages_in_use;
    unshared += x.pages_if_unshared;
  }
  s.kv_efficiency = reserved > 0 ? double(stored) / double(reserved) : 0.0;
  s.sharing_saving = unshared > 0 ? 1.0 - double(in_use) / double(unshared) : 0.0;
  return s;
}

}  // namespace pagedattn::tools
