// Replays a trace through contiguous-reservation KV allocators (no model):
// each sample reserves one contiguous slot range at admission, either the
// maximum sequence length (Orca-Max, FasterTransformer) or the exact final
// length (Orca-Oracle). Requests are admitted FCFS while their reservation
// fits; prompts take one step, then one token per step. This is the vLLM
// paper's Figure 2 comparison, on the same trace and the same KV memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.h"

namespace pagedattn::tools {

enum class ReservePolicy { kMaxLength, kExactLength };

struct ReplayOptions {
  ReservePolicy policy = ReservePolicy::kMaxLength;
  std::int64_t capacity_tokens = 0;  // KV memory in token slots
  std::int32_t max_len = 2048;       // reservation of kMaxLength
  std::int32_t max_num_seqs = 256;
};

struct ReplayResult {
  std::string policy;
  double kv_efficiency = 0.0;   // token states stored / reserved, over all steps
  std::int32_t peak_batch = 0;  // most sequences running at once
  std::int64_t steps = 0;
};

ReplayResult replay_contiguous(const std::vector<TraceRequest>& trace,
                               const ReplayOptions& options);

}  // namespace pagedattn::tools
