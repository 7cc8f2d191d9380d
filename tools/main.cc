// `pagedattn`: the command-line front door. Subcommands:
//   bench-serve  serve a workload through the continuous-batching engine (default)
//   serve     an OpenAI-compatible HTTP server over the engine
//   demo      a scripted tour of the paged KV-cache manager
//   bench-attention  time the attention kernel on one shape (see --help)
//   version   print the library version
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "bench_attention_cli.h"
#include "bench_serve.h"
#include "cache_demo.h"
#include "generate.h"
#include "pagedattn/engine.h"
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

// OpenBLAS picks its kernels by CPU model when the program loads, and a
// build older than the CPU falls back to generic SSE3 ones, several times
// slower on prefill. Start again with the kernels this CPU can run: the
// variable is read at load time only.
void reload_if_blas_fell_back(char** argv) {
  const std::string core = pagedattn::blas_core_instead_of_fallback();
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "pagedattn: OpenBLAS chose its generic kernels on this CPU and restarting with "
               "OPENBLAS_CORETYPE=%s failed (%s): set it yourself for faster prefill\n",
               core.c_str(), std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  reload_if_blas_fell_back(argv);
  const char* command = argc > 1 ? argv[1] : "bench-serve";
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
