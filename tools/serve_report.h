// bench-serve's outputs: the final table and the JSON file (every figure,
// the per-step timeline and the per-request timings).
#pragma once

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "contiguous_replay.h"
#include "serve_metrics.h"

namespace pagedattn::tools {

// A description of the run (model, workload, cache): a JSON object whose
// values keep their types (numbers as numbers).
using RunInfo = nlohmann::ordered_json;

void print_report(std::FILE* out, const ServeSummary& summary,
                  const std::vector<ReplayResult>& contiguous);

// The client's table (bench-serve --url): the request figures, then the
// failures by message and the requests that came back short.
void print_client_report(std::FILE* out, const ServeSummary& summary, const ClientTally& tally);

// Opens (creates or truncates) the --json file, so that a path that cannot be
// written fails before the run rather than after it. InvalidArgument naming it.
std::ofstream open_json_output(const std::string& path);

// The whole run as one JSON document: "run", "summary", "contiguous",
// "timeline" (one entry per step) and "requests"; every figure a JSON number.
nlohmann::ordered_json serve_json(const RunInfo& info, const ServeSummary& summary,
                                  const std::vector<ReplayResult>& contiguous,
                                  const std::vector<StepSample>& steps,
                                  const std::vector<RequestTiming>& requests);

// bench-serve --url as one JSON document: "run", "summary" (the request
// figures under serve_json's names, plus failed_requests, short_outputs and
// failures), and "requests" (serve_json's columns plus "error", "" when it
// completed).
nlohmann::ordered_json client_json(const RunInfo& info, const ServeSummary& summary,
                                   const ClientTally& tally,
                                   const std::vector<RequestTiming>& requests,
                                   const std::vector<std::string>& errors);

// Writes `document` to `out` (opened by open_json_output). InvalidArgument
// naming `path` when the write fails.
void write_json(std::ofstream& out, const std::string& path,
                const nlohmann::ordered_json& document);

}  // namespace pagedattn::tools
