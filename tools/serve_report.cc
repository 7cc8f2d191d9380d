#include "serve_report.h"

#include "pagedattn/errors.h"

namespace pagedattn::tools {

namespace {

// The rows both tables share.
void print_request_rows(std::FILE* out, const ServeSummary& s) {
  std::fprintf(out, "\n  %-30s %10.2f\n", "requests/s", s.requests_per_s);
  std::fprintf(out, "  %-30s %10.1f\n", "output tokens/s", s.output_tokens_per_s);
  std::fprintf(out, "  %-30s %10.1f / %.1f ms\n", "TTFT p50 / p99", s.ttft_p50 * 1e3,
               s.ttft_p99 * 1e3);
  std::fprintf(out, "  %-30s %10.2f / %.2f ms\n", "time per output token p50/p99", s.tpot_p50 * 1e3,
               s.tpot_p99 * 1e3);
}

double share(std::int64_t part, std::int64_t whole) {
  return whole > 0 ? double(part) / double(whole) : 0.0;
}

void print_prefix_rows(std::FILE* out, const ServeSummary& s) {
  std::fprintf(out, "  %-30s %10.1f %%  (%lld of %lld prompt tokens; caching %s)\n",
               "prefix-cache hits", share(s.prefix_hit_tokens, s.prompt_tokens) * 100,
               static_cast<long long>(s.prefix_hit_tokens), static_cast<long long>(s.prompt_tokens),
               s.prefix_caching ? "on" : "off");
  if (s.history_tokens > 0)
    std::fprintf(out, "  %-30s %10.1f %%  (hit tokens / %lld history tokens)\n",
                 "  of the resent history", share(s.prefix_hit_tokens, s.history_tokens) * 100,
                 static_cast<long long>(s.history_tokens));
  if (s.shared_prefix_tokens > 0)
    std::fprintf(out, "  %-30s %10.1f %%  (hit tokens / %lld system-prompt tokens)\n",
                 "  of the shared prefixes",
                 share(s.prefix_hit_tokens, s.shared_prefix_tokens) * 100,
                 static_cast<long long>(s.shared_prefix_tokens));
  std::fprintf(out, "  %-30s %10lld  (%lld evicted)\n", "cached pages at the end",
               static_cast<long long>(s.cached_pages), static_cast<long long>(s.prefix_evictions));
}

}  // namespace

void print_report(std::FILE* out, const ServeSummary& s,
                  const std::vector<ReplayResult>& contiguous) {
  print_request_rows(out, s);
  std::fprintf(out, "  %-30s %10d sequences\n", "peak running batch", s.peak_batch);
  std::fprintf(out, "  %-30s %10lld  (%lld by swap, %lld tokens swapped, %lld recomputed)\n",
               "preemptions", static_cast<long long>(s.preemptions),
               static_cast<long long>(s.swap_outs), static_cast<long long>(s.swapped_tokens),
               static_cast<long long>(s.recomputed_tokens));
  print_prefix_rows(out, s);
  std::fprintf(out, "  %-30s %10lld of %lld pages x %d tokens\n", "KV pages used (peak)",
               static_cast<long long>(s.peak_pages), static_cast<long long>(s.num_pages),
               s.page_size);
  std::fprintf(out, "  %-30s %10.1f %%  (token states stored / KV reserved)\n",
               "KV memory efficiency", s.kv_efficiency * 100);
  std::fprintf(out, "  %-30s %10.1f %%  (pages in use vs. no sharing)\n",
               "memory saved by page sharing", s.sharing_saving * 100);
  std::fprintf(out, "  %-30s %10.1f %%  of step time outside the model\n", "scheduling + planning",
               s.overhead_share * 100);
  std::fprintf(out, "  %-30s %10lld in %.1f s\n", "steps", static_cast<long long>(s.steps),
               s.duration_s);
  std::fprintf(
      out,
      "\n  The same trace and KV memory under contiguous reservation (vLLM paper, Fig. 2:\n"
      "  20.4%%-38.2%% efficiency for contiguous systems, 96.3%% for vLLM):\n");
  std::fprintf(out, "  %-36s %12s %16s\n", "policy", "efficiency", "largest batch");
  std::fprintf(out, "  %-36s %10.1f %% %16d\n", "paged (this run)", s.kv_efficiency * 100,
               s.peak_batch);
  for (const ReplayResult& r : contiguous)
    std::fprintf(out, "  %-36s %10.1f %% %16d\n", r.policy.c_str(), r.kv_efficiency * 100,
                 r.peak_batch);
}

void print_client_report(std::FILE* out, const ServeSummary& s, const ClientTally& tally) {
  print_request_rows(out, s);
  std::fprintf(out, "  %-30s %10d of %d\n", "completed requests", s.completed,
               s.completed + tally.failed);
  std::fprintf(out, "  %-30s %10lld in %.1f s (%s)\n", "output tokens",
               static_cast<long long>(s.output_tokens), s.duration_s,
               tally.counted_from_chunks == 0 ? "from the streams' usage"
                                              : "some counted one per chunk: no usage sent");
  std::fprintf(out, "  %-30s %10d\n", "failed requests", tally.failed);
  for (const auto& [message, n] : tally.failures)
    std::fprintf(out, "    %5d x %s\n", n, message.c_str());
  if (tally.short_outputs > 0)
    std::fprintf(out,
                 "  warning: %d requests returned fewer tokens than max_tokens (does the server\n"
                 "  honour ignore_eos?)\n",
                 tally.short_outputs);
}

namespace {

// One JSON array of get(x) over `items`.
template <typename T, typename Get>
nlohmann::ordered_json column(const std::vector<T>& items, Get get) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const T& x : items) a.push_back(get(x));
  return a;
}

}  // namespace

std::ofstream open_json_output(const std::string& path) {
  std::ofstream out(path);
  require(out.good(), "bench-serve: cannot write --json file '", path, "'");
  return out;
}

nlohmann::ordered_json serve_json(const RunInfo& info, const ServeSummary& s,
                                  const std::vector<ReplayResult>& contiguous,
                                  const std::vector<StepSample>& steps,
                                  const std::vector<RequestTiming>& requests) {
  nlohmann::ordered_json doc;
  doc["run"] = info;
  doc["summary"] = {{"duration_s", s.duration_s},
                    {"completed_requests", s.completed},
                    {"output_tokens", s.output_tokens},
                    {"requests_per_s", s.requests_per_s},
                    {"output_tokens_per_s", s.output_tokens_per_s},
                    {"ttft_p50_s", s.ttft_p50},
                    {"ttft_p99_s", s.ttft_p99},
                    {"tpot_p50_s", s.tpot_p50},
                    {"tpot_p99_s", s.tpot_p99},
                    {"peak_running_batch", s.peak_batch},
                    {"preemptions", s.preemptions},
                    {"peak_pages", s.peak_pages},
                    {"num_pages", s.num_pages},
                    {"page_size", s.page_size},
                    {"kv_efficiency", s.kv_efficiency},
                    {"sharing_saving", s.sharing_saving},
                    {"overhead_share", s.overhead_share},
                    {"steps", s.steps},
                    {"prompt_tokens", s.prompt_tokens},
                    {"history_tokens", s.history_tokens},
                    {"shared_prefix_tokens", s.shared_prefix_tokens},
                    {"prefix_hit_tokens", s.prefix_hit_tokens},
                    {"prefix_hit_rate", share(s.prefix_hit_tokens, s.prompt_tokens)},
                    {"history_hit_rate", share(s.prefix_hit_tokens, s.history_tokens)},
                    {"cached_pages", s.cached_pages},
                    {"prefix_evictions", s.prefix_evictions},
                    {"swap_outs", s.swap_outs},
                    {"swap_ins", s.swap_ins},
                    {"swapped_tokens", s.swapped_tokens},
                    {"recomputed_tokens", s.recomputed_tokens}};
  doc["contiguous"] = nlohmann::ordered_json::array();
  for (const ReplayResult& r : contiguous)
    doc["contiguous"].push_back({{"policy", r.policy},
                                 {"kv_efficiency", r.kv_efficiency},
                                 {"peak_batch", r.peak_batch},
                                 {"steps", r.steps}});
  doc["timeline"] = {
      {"time_s", column(steps, [](const StepSample& x) { return x.time; })},
      {"running_seqs", column(steps, [](const StepSample& x) { return x.running_seqs; })},
      {"batch_tokens", column(steps, [](const StepSample& x) { return x.batch_tokens; })},
      {"pages_in_use", column(steps, [](const StepSample& x) { return x.pages_in_use; })},
      {"token_states_stored",
       column(steps, [](const StepSample& x) { return x.token_states_stored; })},
      {"pages_if_unshared", column(steps, [](const StepSample& x) { return x.pages_if_unshared; })},
      {"output_tokens", column(steps, [](const StepSample& x) { return x.output_tokens; })},
      {"step_s", column(steps, [](const StepSample& x) { return x.step_s; })},
      {"decode_tokens", column(steps, [](const StepSample& x) { return x.decodes; })}};
  doc["requests"] = {
      {"arrival_s", column(requests, [](const RequestTiming& r) { return r.arrival; })},
      {"first_token_s", column(requests, [](const RequestTiming& r) { return r.first_token; })},
      {"finish_s", column(requests, [](const RequestTiming& r) { return r.finish; })},
      {"output_tokens", column(requests, [](const RequestTiming& r) { return r.output_tokens; })}};
  return doc;
}

nlohmann::ordered_json client_json(const RunInfo& info, const ServeSummary& s,
                                   const ClientTally& tally,
                                   const std::vector<RequestTiming>& requests,
                                   const std::vector<std::string>& errors) {
  nlohmann::ordered_json doc;
  doc["run"] = info;
  doc["summary"] = {{"duration_s", s.duration_s},
                    {"completed_requests", s.completed},
                    {"failed_requests", tally.failed},
                    {"short_outputs", tally.short_outputs},
                    {"output_tokens", s.output_tokens},
                    {"output_tokens_from_usage", tally.counted_from_chunks == 0},
                    {"requests_per_s", s.requests_per_s},
                    {"output_tokens_per_s", s.output_tokens_per_s},
                    {"ttft_p50_s", s.ttft_p50},
                    {"ttft_p99_s", s.ttft_p99},
                    {"tpot_p50_s", s.tpot_p50},
                    {"tpot_p99_s", s.tpot_p99}};
  doc["summary"]["failures"] = nlohmann::ordered_json::array();
  for (const auto& [message, n] : tally.failures)
    doc["summary"]["failures"].push_back({{"message", message}, {"count", n}});
  doc["requests"] = {
      {"arrival_s", column(requests, [](const RequestTiming& r) { return r.arrival; })},
      {"first_token_s", column(requests, [](const RequestTiming& r) { return r.first_token; })},
      {"finish_s", column(requests, [](const RequestTiming& r) { return r.finish; })},
      {"output_tokens", column(requests, [](const RequestTiming& r) { return r.output_tokens; })},
      {"error", errors}};
  return doc;
}

void write_json(std::ofstream& out, const std::string& path,
                const nlohmann::ordered_json& document) {
  out << document.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  out.flush();
  require(out.good(), "bench-serve: writing '", path, "' failed");
}

}  // namespace pagedattn::tools
