// bench-serve's outputs: the final table and the JSON file (every figure,
// the per-step timeline and the per-request timings).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "contiguous_replay.h"
#include "serve_metrics.h"

namespace pagedattn::tools {

// A free-form description of the run (model, workload, cache), as key/value pairs.
using RunInfo = std::vector<std::pair<std::string, std::string>>;

void print_report(std::FILE* out, const ServeSummary& summary,
                  const std::vector<ReplayResult>& contiguous);

void write_json(const std::string& path, const RunInfo& info, const ServeSummary& summary,
                const std::vector<ReplayResult>& contiguous, const std::vector<StepSample>& steps,
                const std::vector<RequestTiming>& requests);

}  // namespace pagedattn::tools
