#include "bench_serve_roofline.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/step_profile.h"
#include "engine/weight_matrix.h"
#include "machine_probes.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/llama.h"

namespace pagedattn::tools {
namespace {

constexpr std::int64_t kF32Bytes = 4;
constexpr std::int64_t kKvElementBytes = 2;  // bench-serve's cache is f16

void add_gguf_weights(const std::string& path, ModelCost& c) {
  const GgufFile file = GgufFile::open(path);
  const GgufModelConfig config = read_model_config(file);
  c.num_experts = static_cast<std::int32_t>(config.num_experts);
  c.num_experts_used = static_cast<std::int32_t>(config.num_experts_used);
  const bool tied = file.find_tensor("output.weight") == nullptr;
  double expert_params = 0.0;
  for (const GgufTensor& t : file.tensors()) {
    const std::int64_t n = t.element_count();
    c.parameters += n;
    // As the model keeps it (engine/weight_matrix.h): in place, or widened to f32.
    const bool in_place = t.dims.size() >= 2 && engine::in_place_format(t.type, t.dims[0]);
    const std::int64_t bytes = in_place ? t.nbytes : n * kF32Bytes;
    if (t.dims.size() < 2) {  // norms and biases: read whole, no products
      c.dense_weight_bytes += bytes;
    } else if (t.name == "token_embd.weight" && !tied) {
      continue;  // an embedding lookup reads its tokens' rows only
    } else if (t.name.find("_exps") != std::string_view::npos) {
      c.expert_weight_bytes += bytes;
      expert_params += double(n);
    } else {
      c.dense_weight_bytes += bytes;
      c.matmul_params_per_token += n;
    }
  }
  if (c.num_experts > 0)
    c.matmul_params_per_token +=
        static_cast<std::int64_t>(expert_params * c.num_experts_used / c.num_experts);
}

void add_preset_weights(const std::string& preset, ModelCost& c) {
  const LlamaConfig lc = llama_preset(preset);
  c.parameters = llama_parameter_count(lc);
  const std::int64_t h = lc.hidden_size;
  const std::int64_t norms = 2 * h * lc.num_layers + h;
  // llama_parameter_count counts an untied embedding and LM head both.
  const std::int64_t unread_embedding = lc.tie_embeddings ? 0 : std::int64_t{lc.vocab_size} * h;
  c.matmul_params_per_token = c.parameters - norms - unread_embedding;
  c.dense_weight_bytes = (c.matmul_params_per_token + norms) * kF32Bytes;  // presets are f32
}

// The mean decode step's phases, each a part of the step: the products,
// attention and LM head of the forward pass, the rest of the forward pass
// (norms, RoPE, activations, residuals, embedding rows) and the step outside
// the model (scheduling, planning, sampling). All zero where nothing was
// profiled (runs over HTTP).
nlohmann::ordered_json phases_json(const engine::StepProfile& p, double step_s) {
  using engine::StepPhase;
  const double forward = p.of(StepPhase::kForward);
  const double parts =
      p.of(StepPhase::kProducts) + p.of(StepPhase::kAttention) + p.of(StepPhase::kLmHead);
  return {{"products", p.of(StepPhase::kProducts)},
          {"attention", p.of(StepPhase::kAttention)},
          {"lm_head", p.of(StepPhase::kLmHead)},
          {"model_other", std::max(0.0, forward - parts)},
          {"outside_model", forward > 0 ? std::max(0.0, step_s - forward) : 0.0}};
}

// The teams' waits by phase, named as phases_json names the phases (the
// rest of the forward pass: model_other).
nlohmann::ordered_json team_waits_json(const engine::StepProfile& p) {
  using engine::StepPhase;
  return {{"products", p.team_wait_in(StepPhase::kProducts)},
          {"attention", p.team_wait_in(StepPhase::kAttention)},
          {"lm_head", p.team_wait_in(StepPhase::kLmHead)},
          {"model_other", p.team_wait_in(StepPhase::kForward)}};
}

}  // namespace

double ModelCost::expert_share(double tokens) const {
  if (num_experts <= 0 || num_experts_used <= 0) return 0.0;
  return 1.0 - std::pow(1.0 - double(num_experts_used) / double(num_experts), tokens);
}

ModelCost model_cost(const std::string& model, const ModelSpec& spec) {
  ModelCost c;
  if (model.ends_with(".gguf"))
    add_gguf_weights(model, c);
  else
    add_preset_weights(model, c);
  // Multi-head latent attention keeps one row per token that is both key
  // and (its first latent_dim elements) value.
  const bool latent = spec.latent_dim > 0;
  const std::int64_t layers = spec.num_layers, d = spec.head_dim;
  c.kv_bytes_per_token = layers * spec.num_kv_heads * d * (latent ? 1 : 2) * kKvElementBytes;
  c.attention_flops_per_context_token =
      2 * layers * spec.num_qo_heads * (d + (latent ? spec.latent_dim : d));
  return c;
}

ProbeFigures measure_probes(bool quick) {
  using namespace pagedattn::bench;
  ProbeFigures p;
  if (quick) {
    // A quarter GiB is still several times any L3 the library targets.
    const ReadBandwidthResult read = measure_read_bandwidth(std::size_t{1} << 28, 10);
    const ComputePeakResult fma = measure_compute_peak(widest_fp32_class(), 0.05, 3);
    p = {read.best_gbps, fma.best_gflops, fma.isa, std::max(read.other_cores, fma.other_cores)};
  } else {
    const ReadBandwidthResult& read = machine_read_bandwidth();
    const FmaPeakResult& fma = machine_fma_peak();
    p = {read.best_gbps, fma.best_gflops, fma.isa, std::max(read.other_cores, fma.other_cores)};
  }
  return p;
}

nlohmann::ordered_json roofline_json(const ModelCost& cost, const std::vector<StepSample>& steps,
                                     const std::optional<ProbeFigures>& probes) {
  double seconds = 0.0, tokens = 0.0, context = 0.0, bytes = 0.0, flops = 0.0;
  engine::StepProfile phases;
  std::int64_t n = 0;
  for (const StepSample& s : steps) {
    if (s.decodes <= 0 || s.decodes != s.batch_tokens) continue;  // prefill in the step
    const double t = s.batch_tokens, ctx = double(s.token_states_stored);
    ++n;
    seconds += s.step_s;
    for (std::size_t p = 0; p < engine::kStepPhases; ++p) {
      phases.seconds[p] += s.profile.seconds[p];
      phases.team_waits[p] += s.profile.team_waits[p];
    }
    tokens += t;
    context += ctx;
    bytes += double(cost.dense_weight_bytes) +
             double(cost.expert_weight_bytes) * cost.expert_share(t) +
             double(cost.kv_bytes_per_token) * ctx;
    flops += 2.0 * double(cost.matmul_params_per_token) * t +
             double(cost.attention_flops_per_context_token) * ctx;
  }
  const double count = std::max<double>(1, double(n));
  seconds /= count;
  tokens /= count;
  context /= count;
  bytes /= count;
  flops /= count;
  for (double& p : phases.seconds) p /= count;
  for (double& p : phases.team_waits) p /= count;
  nlohmann::ordered_json j = {
      {"threads", omp_get_max_threads()},
      {"parameters", cost.parameters},
      {"weight_bytes", cost.dense_weight_bytes + cost.expert_weight_bytes},
      {"expert_weight_bytes", cost.expert_weight_bytes},
      {"matmul_flops_per_token", 2 * cost.matmul_params_per_token},
      {"kv_bytes_per_token", cost.kv_bytes_per_token},
      {"attention_flops_per_context_token", cost.attention_flops_per_context_token},
      {"decode_steps", n},
      {"decode_step_s", seconds},
      {"decode_tokens_per_step", tokens},
      {"decode_context_tokens_per_step", context},
      {"decode_step_bytes", bytes},
      {"decode_step_flops", flops},
      {"decode_step_phases_s", phases_json(phases, seconds)},
      // Within the phases above: the layer teams' threads waiting at the
      // barriers after each piece, mean over the threads (core/team.h), in
      // all and by the phase of the piece.
      {"decode_step_team_wait_s", phases.team_wait()},
      {"decode_step_team_wait_phases_s", team_waits_json(phases)}};
  const bool bounded = probes && probes->read_gbps > 0 && probes->fma_gflops > 0 && n > 0;
  const double memory_s = bounded ? bytes / (probes->read_gbps * 1e9) : 0.0;
  const double compute_s = bounded ? flops / (probes->fma_gflops * 1e9) : 0.0;
  auto or_null = [&](double x) { return bounded ? nlohmann::ordered_json(x) : nullptr; };
  j["read_gbps"] = probes ? nlohmann::ordered_json(probes->read_gbps) : nullptr;
  j["fma_gflops"] = probes ? nlohmann::ordered_json(probes->fma_gflops) : nullptr;
  j["fma_isa"] = probes ? nlohmann::ordered_json(probes->fma_isa) : nullptr;
  j["probe_other_cores"] = probes ? nlohmann::ordered_json(probes->other_cores) : nullptr;
  j["memory_bound_s"] = or_null(memory_s);
  j["compute_bound_s"] = or_null(compute_s);
  // The bound over the step time: 1 means the step ran at the roofline.
  j["roofline_fraction"] = or_null(seconds > 0 ? std::max(memory_s, compute_s) / seconds : 0.0);
  return j;
}

void print_roofline(std::FILE* out, const nlohmann::ordered_json& r) {
  const double step_s = r["decode_step_s"].get<double>();
  std::fprintf(out,
               "\n  decode steps (%lld, %d threads): %.3f ms, %.1f tokens, %.0f context tokens\n",
               static_cast<long long>(r["decode_steps"].get<std::int64_t>()),
               r["threads"].get<int>(), 1e3 * step_s, r["decode_tokens_per_step"].get<double>(),
               r["decode_context_tokens_per_step"].get<double>());
  const nlohmann::ordered_json& phases = r["decode_step_phases_s"];
  if (phases["products"].get<double>() > 0) {
    std::fprintf(out, "  of which");
    const char* sep = "";
    for (const auto& [name, s] : phases.items()) {
      std::fprintf(out, "%s %s %.3f ms (%.0f%%)", sep, name.c_str(), 1e3 * s.get<double>(),
                   step_s > 0 ? 100.0 * s.get<double>() / step_s : 0.0);
      sep = ",";
    }
    std::fprintf(out, "\n");
    const double wait_s = r["decode_step_team_wait_s"].get<double>();
    if (wait_s > 0) {
      std::fprintf(out,
                   "  layer teams: each thread waits %.3f ms (%.0f%%) at their barriers, after",
                   1e3 * wait_s, step_s > 0 ? 100.0 * wait_s / step_s : 0.0);
      const char* sep = "";
      for (const auto& [name, s] : r["decode_step_team_wait_phases_s"].items()) {
        std::fprintf(out, "%s %s %.3f ms", sep, name.c_str(), 1e3 * s.get<double>());
        sep = ",";
      }
      std::fprintf(out, "\n");
    }
  }
  if (r["roofline_fraction"].is_null()) return;
  const double memory_s = r["memory_bound_s"].get<double>();
  const double compute_s = r["compute_bound_s"].get<double>();
  std::fprintf(
      out,
      "  bounds: read %.1f MB / %.1f GB/s = %.3f ms; %.2f GFLOP / %.1f GFLOP/s = %.3f ms;\n"
      "  the step is at %.1f%% of the roofline\n",
      r["decode_step_bytes"].get<double>() / 1e6, r["read_gbps"].get<double>(), 1e3 * memory_s,
      r["decode_step_flops"].get<double>() / 1e9, r["fma_gflops"].get<double>(), 1e3 * compute_s,
      100.0 * r["roofline_fraction"].get<double>());
}

}  // namespace pagedattn::tools
