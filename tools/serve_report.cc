#include "serve_report.h"

#include <fstream>
#include <iomanip>

#include "pagedattn/errors.h"

namespace pagedattn::tools {

void print_report(std::FILE* out, const ServeSummary& s, const std::vector<ReplayResult>& contiguous) {
  std::fprintf(out, "\n  %-30s %10.2f\n", "requests/s", s.requests_per_s);
  std::fprintf(out, "  %-30s %10.1f\n", "output tokens/s", s.output_tokens_per_s);
  std::fprintf(out, "  %-30s %10.1f / %.1f ms\n", "TTFT p50 / p99", s.ttft_p50 * 1e3, s.ttft_p99 * 1e3);
  std::fprintf(out, "  %-30s %10.2f / %.2f ms\n", "time per output token p50/p99", s.tpot_p50 * 1e3,
               s.tpot_p99 * 1e3);
  std::fprintf(out, "  %-30s %10d sequences\n", "peak running batch", s.peak_batch);
  std::fprintf(out, "  %-30s %10lld\n", "preemptions (recompute)", static_cast<long long>(s.preemptions));
  std::fprintf(out, "  %-30s %10lld of %lld pages x %d tokens\n", "KV pages used (peak)",
               static_cast<long long>(s.peak_pages), static_cast<long long>(s.num_pages), s.page_size);
  std::fprintf(out, "  %-30s %10.1f %%  (token states stored / KV reserved)\n",
               "KV memory efficiency", s.kv_efficiency * 100);
  std::fprintf(out, "  %-30s %10.1f %%  (pages in use vs. no sharing)\n",
               "memory saved by page sharing", s.sharing_saving * 100);
  std::fprintf(out, "  %-30s %10.1f %%  of step time outside the model\n",
               "scheduling + planning", s.overhead_share * 100);
  std::fprintf(out, "  %-30s %10lld in %.1f s\n", "steps", static_cast<long long>(s.steps), s.duration_s);
  std::fprintf(out,
               "\n  The same trace and KV memory under contiguous reservation (vLLM paper, Fig. 2:\n"
               "  20.4%%-38.2%% efficiency for contiguous systems, 96.3%% for vLLM):\n");
  std::fprintf(out, "  %-36s %12s %16s\n", "policy", "efficiency", "largest batch");
  std::fprintf(out, "  %-36s %10.1f %% %16d\n", "paged (this run)", s.kv_efficiency * 100, s.peak_batch);
  for (const ReplayResult& r : contiguous)
    std::fprintf(out, "  %-36s %10.1f %% %16d\n", r.policy.c_str(), r.kv_efficiency * 100, r.peak_batch);
}

namespace {

template <typename T, typename Get>
void json_array(std::ofstream& f, const char* name, const std::vector<T>& v, Get get, bool last = false) {
  f << "    \"" << name << "\": [";
  for (std::size_t i = 0; i < v.size(); ++i) f << (i ? "," : "") << get(v[i]);
  f << "]" << (last ? "\n" : ",\n");
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

void write_json(const std::string& path, const RunInfo& info, const ServeSummary& s,
                const std::vector<ReplayResult>& contiguous, const std::vector<StepSample>& steps,
                const std::vector<RequestTiming>& requests) {
  std::ofstream f(path);
  require(f.good(), "bench-serve: cannot write --json file '", path, "'");
  f << std::setprecision(9) << "{\n  \"run\": {";
  for (std::size_t i = 0; i < info.size(); ++i)
    f << (i ? ", " : "") << quoted(info[i].first) << ": " << quoted(info[i].second);
  f << "},\n  \"summary\": {\n";
  const std::pair<const char*, double> figures[] = {
      {"duration_s", s.duration_s}, {"completed_requests", s.completed},
      {"output_tokens", double(s.output_tokens)}, {"requests_per_s", s.requests_per_s},
      {"output_tokens_per_s", s.output_tokens_per_s}, {"ttft_p50_s", s.ttft_p50},
      {"ttft_p99_s", s.ttft_p99}, {"tpot_p50_s", s.tpot_p50}, {"tpot_p99_s", s.tpot_p99},
      {"peak_running_batch", s.peak_batch}, {"preemptions", double(s.preemptions)},
      {"peak_pages", double(s.peak_pages)}, {"num_pages", double(s.num_pages)},
      {"page_size", s.page_size}, {"kv_efficiency", s.kv_efficiency},
      {"sharing_saving", s.sharing_saving}, {"overhead_share", s.overhead_share},
      {"steps", double(s.steps)}};
  for (std::size_t i = 0; i < std::size(figures); ++i)
    f << "    \"" << figures[i].first << "\": " << figures[i].second
      << (i + 1 < std::size(figures) ? ",\n" : "\n");
  f << "  },\n  \"contiguous\": [";
  for (std::size_t i = 0; i < contiguous.size(); ++i)
    f << (i ? ", " : "") << "{\"policy\": " << quoted(contiguous[i].policy)
      << ", \"kv_efficiency\": " << contiguous[i].kv_efficiency
      << ", \"peak_batch\": " << contiguous[i].peak_batch << ", \"steps\": " << contiguous[i].steps << "}";
  f << "],\n  \"timeline\": {\n";
  json_array(f, "time_s", steps, [](const StepSample& x) { return x.time; });
  json_array(f, "running_seqs", steps, [](const StepSample& x) { return x.running_seqs; });
  json_array(f, "batch_tokens", steps, [](const StepSample& x) { return x.batch_tokens; });
  json_array(f, "pages_in_use", steps, [](const StepSample& x) { return x.pages_in_use; });
  json_array(f, "token_states_stored", steps, [](const StepSample& x) { return x.token_states_stored; });
  json_array(f, "pages_if_unshared", steps, [](const StepSample& x) { return x.pages_if_unshared; });
  json_array(f, "output_tokens", steps, [](const StepSample& x) { return x.output_tokens; }, true);
  f << "  },\n  \"requests\": {\n";
  json_array(f, "arrival_s", requests, [](const RequestTiming& r) { return r.arrival; });
  json_array(f, "first_token_s", requests, [](const RequestTiming& r) { return r.first_token; });
  json_array(f, "finish_s", requests, [](const RequestTiming& r) { return r.finish; });
  json_array(f, "output_tokens", requests, [](const RequestTiming& r) { return r.output_tokens; }, true);
  f << "  }\n}\n";
  require(f.good(), "bench-serve: writing '", path, "' failed");
}

}  // namespace pagedattn::tools
