// `mpirun -np 2 pagedattn generate --disaggregate ...`: rank 0 prefills the
// prompt and sends its KV pages to rank 1, which decodes and streams the
// text (the same text as `generate` alone). Any rank's failure ends both
// (MPI_Abort) with the reason on stderr, so no rank waits forever.
#include <chrono>
#include <cstdio>

#include "generate.h"
#include "pagedattn/distributed/disagg.h"

namespace pagedattn::tools {
namespace {

constexpr int kPrefillRank = 0, kDecodeRank = 1;

void decode_and_print(const dist::MpiComm& world, const EngineConfig& config,
                      std::size_t prompt_len, const Tokenizer& tokenizer) {
  StreamingDecoder text(tokenizer, {.render_special = false});
  std::int64_t generated = 0;
  double first_token_seconds = 0.0;
  const auto start = std::chrono::steady_clock::now();
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  dist::DecodeHooks hooks;
  hooks.on_tokens = [&](std::int64_t, std::span<const std::int32_t> tokens) {
    for (std::int32_t id : tokens) {
      if (generated++ == 0) first_token_seconds = since_start();
      std::fputs(text.push(id).c_str(), stdout);
      std::fflush(stdout);
    }
  };
  const dist::DecodeReport report = dist::run_decode(world, kPrefillRank, config, hooks);
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double decode_seconds = since_start() - first_token_seconds;
  const dist::TransferStats& t = report.transfer;
  std::fprintf(stderr,
               "[%s, disaggregated: prompt %zu tokens prefilled on rank %d, first token after "
               "%.1f ms | KV pages %.2f MiB in %.2f ms (%.2f GB/s) | %lld new tokens, decode "
               "%.1f tokens/s on rank %d]\n",
               config.model->spec().name.c_str(), prompt_len, kPrefillRank,
               first_token_seconds * 1e3, double(t.bytes) / (1 << 20), t.seconds * 1e3,
               t.seconds > 0 ? double(t.bytes) / t.seconds * 1e-9 : 0.0,
               static_cast<long long>(generated),
               generated > 1 ? double(generated - 1) / decode_seconds : 0.0, kDecodeRank);
}

}  // namespace

int run_generate_disaggregated(const EngineConfig& config, const std::vector<std::int32_t>& prompt,
                               const SamplingParams& params, const Tokenizer& tokenizer) {
  int argc = 0;
  char** argv = nullptr;
  dist::MpiSession session(&argc, &argv);
  const dist::MpiComm world = dist::MpiComm::world();
  require(world.size() == 2, "generate --disaggregate: run it under `mpirun -np 2` (rank ",
          kPrefillRank, " prefills, rank ", kDecodeRank, " decodes); this run has ", world.size(),
          " rank(s)");
  try {
    if (world.rank() == kPrefillRank) {
      const dist::DisaggRequest request{prompt, params};
      dist::run_prefill(world, kDecodeRank, config, std::span(&request, 1));
    } else {
      decode_and_print(world, config, prompt.size(), tokenizer);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn generate --disaggregate: rank %d: %s\n", world.rank(),
                 e.what());
    std::fflush(stderr);
    world.abort(1);
  }
  return 0;
}

}  // namespace pagedattn::tools
