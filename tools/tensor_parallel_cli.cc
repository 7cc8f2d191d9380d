#include "tensor_parallel_cli.h"

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "pagedattn/errors.h"
#include "pagedattn/llama.h"

#ifdef PAGEDATTN_HAVE_MPI
#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/distributed/tensor_parallel.h"
#endif

namespace pagedattn::tools {

bool wants_tensor_parallel(int argc, char** argv) {
  // --tensor-parallel N or, as the flag parser also reads it, --tensor-parallel=N.
  constexpr std::string_view joined = "--tensor-parallel=";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--tensor-parallel" && i + 1 < argc && std::string_view(argv[i + 1]) != "1")
      return true;
    if (arg.starts_with(joined) && arg.substr(joined.size()) != "1") return true;
  }
  return false;
}

#ifdef PAGEDATTN_HAVE_MPI

namespace {

std::shared_ptr<dist::CollectiveStats> g_stats;
std::weak_ptr<dist::TensorParallelLeader> g_leader;

std::string fingerprint(const std::string& model_arg, std::int32_t size) {
  if (std::filesystem::exists(model_arg)) return dist::gguf_fingerprint(model_arg, size);
  try {
    LlamaConfig c = llama_preset(model_arg);
    c.shard.size = size;
    return dist::model_fingerprint(c);
  } catch (const Error& e) {
    return e.what();  // differs from a loadable model's: every rank learns of it
  }
}

}  // namespace

std::shared_ptr<void> start_mpi_if_requested(int* argc, char*** argv) {
  if (!wants_tensor_parallel(*argc, *argv)) return nullptr;
  // Serialized: `serve` steps the engine (and so calls MPI) on its engine thread.
  return std::make_shared<dist::MpiSession>(argc, argv, dist::MpiThreads::kSerialized);
}

std::shared_ptr<Model> make_cli_model(std::int32_t tensor_parallel, const std::string& model_arg,
                                      const ShardFactory& make) {
  if (tensor_parallel == 1) return make({});
  require<InvalidState>(dist::MpiSession::active(), "--tensor-parallel ", tensor_parallel,
                        ": MPI is not initialized");
  const dist::MpiComm world = dist::MpiComm::world();
  require(world.size() == tensor_parallel, "--tensor-parallel ", tensor_parallel, " needs ",
          tensor_parallel, " MPI ranks, this run has ", world.size(), " (run `mpirun -np ",
          tensor_parallel, " pagedattn ... --tensor-parallel ", tensor_parallel, "`)");
  dist::require_same_model(world, fingerprint(model_arg, tensor_parallel));
  g_stats = std::make_shared<dist::CollectiveStats>();
  std::unique_ptr<Model> shard;
  dist::run_on_every_rank(world, [&] { shard = make(dist::mpi_shard(world, g_stats)); });
  if (world.rank() != 0) {
    // Rank 0 decides when to stop (a server first finishes its requests,
    // which needs the followers) and releases them; if rank 0 dies instead,
    // mpirun kills them. So followers ignore the stop signals: a terminal's
    // Ctrl-C (one process group), and SIGUSR1, which mpirun forwards to every
    // rank (`serve` stops gracefully on it; OpenMPI 4.1 does not forward
    // SIGINT / SIGTERM but kills the ranks).
    for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, SIG_IGN);
    dist::run_tensor_parallel_follower(world, *shard);
    return nullptr;
  }
  auto leader = std::make_shared<dist::TensorParallelLeader>(world, std::move(shard));
  g_leader = leader;
  return leader;
}

TensorParallelTimes tensor_parallel_times() {
  TensorParallelTimes t;
  if (g_stats == nullptr) return t;
  t.size = dist::MpiComm::world().size();
  t.all_reduce_calls = g_stats->calls;
  t.all_reduce_floats = g_stats->floats;
  t.all_reduce_seconds = g_stats->seconds;
  if (const auto leader = g_leader.lock()) t.broadcast_seconds = leader->broadcast_seconds();
  return t;
}

#else  // built without MPI

namespace {
[[noreturn]] void no_mpi() {
  throw Unsupported(
      "--tensor-parallel needs a pagedattn built with MPI (Debian: libopenmpi-dev openmpi-bin; "
      "cmake -DPAGEDATTN_WITH_MPI=ON); this build has none");
}
}  // namespace

std::shared_ptr<void> start_mpi_if_requested(int* argc, char*** argv) {
  if (wants_tensor_parallel(*argc, *argv)) no_mpi();
  return nullptr;
}

std::shared_ptr<Model> make_cli_model(std::int32_t tensor_parallel, const std::string&,
                                      const ShardFactory& make) {
  if (tensor_parallel != 1) no_mpi();
  return make({});
}

TensorParallelTimes tensor_parallel_times() {
  return {};
}

#endif

}  // namespace pagedattn::tools
