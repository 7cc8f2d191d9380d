// bench-serve's roofline figures: what one decode step must at least cost on
// this machine, from the model the run loaded and the machine probes
// (perf/machine_probes.h), against what the step took. The thread-scaling
// report (bench/scaling.sh) reads them from the JSON's "roofline" object.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagedattn/model.h"
#include "serve_metrics.h"

namespace pagedattn::tools {

// What one token costs the model, whole-model figures (not a tensor-parallel
// rank's share).
struct ModelCost {
  std::int64_t parameters = 0;  // every weight, embeddings and norms included
  // Bytes of the weights a decode step reads in full whatever its batch: the
  // layers' matrices and the LM head, as the model keeps them in memory (f32,
  // or a GGUF block format read in place). An untied embedding table is left
  // out: a step reads only its tokens' rows.
  std::int64_t dense_weight_bytes = 0;
  // Mixture of experts: the routed experts' bytes, all of them; a step reads
  // those of the experts its tokens chose (expert_share).
  std::int64_t expert_weight_bytes = 0;
  std::int32_t num_experts = 0, num_experts_used = 0;
  // Multiply-adds per token through those matrices (each counts 2 FLOP).
  std::int64_t matmul_params_per_token = 0;
  std::int64_t kv_bytes_per_token = 0;  // K and V of one cached token, all layers (f16)
  // Attention's FLOP per decode token per token of its context (q.k and
  // p.v, one multiply-add each per head and dimension).
  std::int64_t attention_flops_per_context_token = 0;

  // The expected share of the experts that `tokens` tokens touch when each
  // picks num_experts_used of num_experts uniformly: 1 - (1 - k/E)^tokens.
  double expert_share(double tokens) const;
};

// From a preset name or a .gguf path, and the loaded model's spec (heads,
// layers, head_dim of the cache).
ModelCost model_cost(const std::string& model, const ModelSpec& spec);

// The machine probes' figures, for the threads the run used.
struct ProbeFigures {
  double read_gbps = 0.0;   // sequential read bandwidth, best pass, GB/s
  double fma_gflops = 0.0;  // widest fp32 FMA peak, best pass, GFLOP/s
  std::string fma_isa;
  double other_cores = 0.0;  // others' CPU use during the probes (the larger)
};

// Measures the probes with all OpenMP threads: machine_read_bandwidth() and
// machine_fma_peak() (repeated after a quiet wait when others are busy), or
// with `quick` one short measurement of each (a smaller buffer, fewer passes:
// CI runs, where the wait could take longer than the test).
ProbeFigures measure_probes(bool quick);

// The "roofline" object of the JSON: the model's cost, the threads, the mean
// pure-decode step (steps whose every token was a decode) and its two
// bounds, memory (weights + KV read / read probe) and compute (FLOP / FMA
// probe); the bounds and the fraction are null without probes.
nlohmann::ordered_json roofline_json(const ModelCost& cost, const std::vector<StepSample>& steps,
                                     const std::optional<ProbeFigures>& probes);

// The report's roofline lines (the decode step against its bounds).
void print_roofline(std::FILE* out, const nlohmann::ordered_json& roofline);

}  // namespace pagedattn::tools
