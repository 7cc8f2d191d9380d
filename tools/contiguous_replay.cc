#include "contiguous_replay.h"

#include <algorithm>
#include <deque>

namespace pagedattn::tools {
namespace {

struct Running {
  const TraceRequest* r;
  std::int32_t generated = 0;  // output tokens so far (0: prompt not yet run)
  std::int64_t reserved = 0;
};

std::int64_t reservation(const TraceRequest& r, const ReplayOptions& o) {
  const std::int64_t per_sample =
      o.policy == ReservePolicy::kMaxLength ? o.max_len : r.prompt_len + r.output_len;
  return per_sample * r.n;
}

}  // namespace

ReplayResult replay_contiguous(const std::vector<TraceRequest>& trace, const ReplayOptions& o) {
  ReplayResult result;
  result.policy = o.policy == ReservePolicy::kMaxLength ? "contiguous, reserve max length"
                                                        : "contiguous, reserve exact length";
  std::deque<const TraceRequest*> waiting;
  for (const TraceRequest& r : trace) waiting.push_back(&r);
  std::vector<Running> running;
  std::int64_t used = 0, stored_sum = 0, reserved_sum = 0;
  std::int32_t seqs = 0;
  while (!waiting.empty() || !running.empty()) {
    // FCFS admission while the reservation and the sequence limit allow.
    while (!waiting.empty()) {
      const TraceRequest& r = *waiting.front();
      const std::int64_t need = reservation(r, o);
      const bool alone = running.empty();  // a request larger than memory still runs alone
      if (!alone && (used + need > o.capacity_tokens || seqs + r.n > o.max_num_seqs)) break;
      running.push_back({&r, 0, need});
      used += need;
      seqs += r.n;
      waiting.pop_front();
    }
    result.peak_batch = std::max(result.peak_batch, seqs);
    // One step: prompts prefill, everyone else decodes one token.
    std::int64_t stored = 0;
    for (Running& x : running) {
      ++x.generated;
      stored += std::int64_t{x.r->n} * (x.r->prompt_len + x.generated - 1);  // K/V held
    }
    stored_sum += stored;
    reserved_sum += used;
    ++result.steps;
    std::erase_if(running, [&](const Running& x) {
      if (x.generated < x.r->output_len) return false;
      used -= x.reserved;
      seqs -= x.r->n;
      return true;
    });
  }
  result.kv_efficiency = reserved_sum > 0 ? double(stored_sum) / double(reserved_sum) : 0.0;
  return result;
}

}  // namespace pagedattn::tools
