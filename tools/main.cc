// `pagedattn`: the command-line front door. Subcommands:
//   demo      a scripted tour of the paged KV-cache manager (default)
//   version   print the library version
#include <cstdio>
#include <cstring>
#include <exception>

#include "cache_demo.h"
#include "pagedattn/errors.h"
#include "pagedattn/version.h"

namespace {

int usage(std::FILE* out) {
  std::fprintf(out,
               "usage: pagedattn [demo | version | help]\n"
               "  demo     scripted tour of the paged KV-cache manager (default)\n"
               "  version  print the library version\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* command = argc > 1 ? argv[1] : "demo";
  try {
    if (std::strcmp(command, "demo") == 0) return pagedattn::tools::run_cache_demo();
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
