#include "disagg_serve.h"

#include <csignal>
#include <cstdio>
#include <string_view>

#include "pagedattn/distributed/disagg.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

constexpr int kDecodeRank = 0;

// Rank 0's RemotePrefill: dist::PrefillClient over the other ranks.
class MpiRemotePrefill final : public RemotePrefill {
 public:
  explicit MpiRemotePrefill(const EngineConfig& config)
      : world_(dist::MpiComm::world()), client_(world_, config) {}

  // The logits stay on the prefill rank: requests that report them run here.
  bool takes(const SamplingParams& params) const override {
    return !params.logprobs && !params.prompt_logprobs;
  }
  void submit(std::int64_t key, std::span<const std::int32_t> prompt,
              const SamplingParams& params) override {
    client_.submit(key, prompt, params);
  }
  void cancel(std::int64_t key) override { client_.cancel(key); }
  std::vector<Arrival> poll(Engine& engine) override {
    std::vector<Arrival> arrivals;
    for (dist::PrefillArrival& a : client_.poll(engine)) {
      Arrival out;
      out.key = a.key;
      out.request_id = a.request_id;
      out.first_tokens = std::move(a.first_tokens);
      out.finish = std::move(a.finish);
      out.error = std::move(a.error);
      arrivals.push_back(std::move(out));
    }
    return arrivals;
  }
  bool busy() const override { return client_.busy(); }
  void close() override {
    client_.close();
    const dist::TransferStats t = client_.stats();
    std::fprintf(stderr,
                 "pagedattn serve --disaggregate: %lld prompts imported from %d prefill rank(s), "
                 "%.2f MiB of KV pages in %.3f s, %lld waited for room, %lld cancelled\n",
                 static_cast<long long>(t.transfers), world_.size() - 1,
                 double(t.bytes) / (1 << 20), t.seconds, static_cast<long long>(t.retries),
                 static_cast<long long>(t.cancelled));
  }

 private:
  dist::MpiComm world_;
  dist::PrefillClient client_;
};

bool wants_disaggregate(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--disaggregate") return true;
  return false;
}

}  // namespace

std::shared_ptr<void> start_mpi_if_disaggregated(int* argc, char*** argv) {
  if (!wants_disaggregate(*argc, *argv) || dist::MpiSession::active()) return nullptr;
  return std::make_shared<dist::MpiSession>(argc, argv, dist::MpiThreads::kSerialized);
}

std::unique_ptr<RemotePrefill> start_disaggregated(const EngineConfig& config) {
  require<InvalidState>(dist::MpiSession::active(), "serve --disaggregate: MPI is not initialized");
  const dist::MpiComm world = dist::MpiComm::world();
  require(world.size() >= 2, "serve --disaggregate: run it under `mpirun -np N` with N >= 2 (rank ",
          kDecodeRank, " serves and decodes, the others prefill); this run has ", world.size(),
          " rank(s)");
  if (world.rank() == kDecodeRank) return std::make_unique<MpiRemotePrefill>(config);
  // Rank 0 decides when to stop (its server first finishes its requests,
  // which needs the prefill ranks) and releases them; so they ignore the
  // stop signals, as tensor-parallel followers do (tensor_parallel_cli.cc).
  for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, SIG_IGN);
  try {
    const dist::TransferStats t = dist::serve_prefill(world, kDecodeRank, config);
    if (t.pages_left != 0)
      std::fprintf(stderr, "pagedattn serve --disaggregate: rank %d: %lld pages left in use\n",
                   world.rank(), static_cast<long long>(t.pages_left));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn serve --disaggregate: rank %d: %s\n", world.rank(), e.what());
    std::fflush(stderr);
    world.abort(1);
  }
  return nullptr;
}

}  // namespace pagedattn::serve
