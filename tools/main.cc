// `pagedattn`: the command-line front door. Subcommands:
//   bench-serve  serve a workload through the continuous-batching engine (default)
//   serve     an OpenAI-compatible HTTP server over the engine
//   demo      a scripted tour of the paged KV-cache manager
//   bench-attention  time the attention kernel on one shape (see --help)
//   version   print the library version
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

#include "bench_attention_cli.h"
#include "bench_serve.h"
#include "cache_demo.h"
#include "generate.h"
#include "pagedattn/errors.h"
#include "pagedattn/version.h"
#include "serve/serve_cli.h"
#include "tensor_parallel_cli.h"

namespace {

int usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: pagedattn [bench-serve [flags] | generate [flags] | serve [flags] | demo | "
      "bench-attention [options] |\n"
      "                  version | help]\n"
      "  bench-serve  serve a workload through the engine and report throughput,\n"
      "               latency and KV memory efficiency (default; --help for flags)\n"
      "  generate  text from a GGUF model, streamed (--model FILE.gguf --prompt TEXT; --help)\n"
      "  serve    OpenAI-compatible HTTP server (--model FILE.gguf|PRESET; --help)\n"
      "  demo     scripted tour of the paged KV-cache manager\n"
      "  bench-attention  time the attention kernel on one shape, as a fraction\n"
      "                   of this machine's read bandwidth and FMA peak (--help)\n"
      "  version  print the library version\n");
  return out == stdout ? 0 : 2;
}

// The library's OpenMP wait policy, for every command: passive (threads
// sleep between parallel regions) unless the user chose one. Spinning
// threads take the cores from each other and from other processes: on a
// shared machine steps get several times slower, while alone passive
// waiting costs one stream's decode a little (docs/engine.md, "Threads").
// libgomp reads the policy only at start-up, hence the restart.
void prefer_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run as we are
}

}  // namespace

int main(int argc, char** argv) {
  const char* command = argc > 1 ? argv[1] : "bench-serve";
  // Under mpirun (--tensor-parallel, --disaggregate) the launcher owns the
  // process: no re-exec; pass `mpirun -x OMP_WAIT_POLICY=passive` instead.
  const bool launched_by_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                               std::getenv("PMI_SIZE") != nullptr ||
                               std::getenv("PMIX_RANK") != nullptr;
  if (!launched_by_mpi && !pagedattn::tools::wants_tensor_parallel(argc, argv))
    prefer_passive_openmp_wait(argv);
  std::shared_ptr<void> mpi;  // finalizes MPI after the command's objects are gone
  try {
    mpi = pagedattn::tools::start_mpi_if_requested(&argc, &argv);
    if (std::strcmp(command, "bench-serve") == 0)
      return pagedattn::tools::run_bench_serve(argc, argv);
    if (std::strcmp(command, "demo") == 0) return pagedattn::tools::run_cache_demo();
    if (std::strcmp(command, "generate") == 0) return pagedattn::tools::run_generate(argc, argv);
    if (std::strcmp(command, "serve") == 0) return pagedattn::serve::run_serve(argc, argv);
    if (std::strcmp(command, "bench-attention") == 0)
      return pagedattn::tools::run_bench_attention(argc - 2, argv + 2);
    if (std::strcmp(command, "version") == 0) {
      std::printf("pagedattn %s\n", pagedattn::kVersion);
      return 0;
    }
    if (std::strcmp(command, "help") == 0 || std::strcmp(command, "--help") == 0)
      return usage(stdout);
    std::fprintf(stderr, "pagedattn: unknown command '%s'\n", command);
    return usage(stderr);
  } catch (const pagedattn::Error& e) {
    std::fprintf(stderr, "pagedattn: %s error: %s\n", pagedattn::error_code_name(e.code()),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn: %s\n", e.what());
    return 1;
  }
}
