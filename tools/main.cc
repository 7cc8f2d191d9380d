// `pagedattn`: the command-line front door. Subcommands:
//   demo      a scripted tour of the paged KV-cache manager (default)
//   bench-attention  time the attention kernel on one shape (see --help)
//   version   print the library version
#include <cstdio>
#include <cstring>
#include <exception>

#include "bench_attention_cli.h"
#include "cache_demo.h"
#include "pagedattn/errors.h"
#include "pagedattn/version.h"

namespace {

int usage(std::FILE* out) {
  std::fprintf(out,
               "usage: pagedattn [demo | bench-attention [options] | version | help]\n"
               "  demo     scripted tour of the paged KV-cache manager (default)\n"
               "  bench-attention  time the attention kernel on one shape, as a fraction\n"
               "                   of this machine's read bandwidth and FMA peak (--help)\n"
               "  version  print the library version\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* command = argc > 1 ? argv[1] : "demo";
  try {
    if (std::strcmp(command, "demo") == 0) return pagedattn::tools::run_cache_demo();
    if (std::strcmp(command, "bench-attention") == 0)
      return pagedattn::tools::run_bench_attention(argc - 2, argv + 2);
    if (std::strcmp(command, "version") == 0) {
      std::printf("pagedattn %s\n", pagedattn::kVersion);
      return 0;
    }
    if (std::strcmp(command, "help") == 0 || std::strcmp(command, "--help") == 0) return usage(stdout);
    std::fprintf(stderr, "pagedattn: unknown command '%s'\n", command);
    return usage(stderr);
  } catch (const pagedattn::Error& e) {
    std::fprintf(stderr, "pagedattn: %s error: %s\n", pagedattn::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn: %s\n", e.what());
    return 1;
  }
}
