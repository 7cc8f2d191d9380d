#pragma once

namespace pagedattn::tools {

// `pagedattn bench-serve [flags]`: serves a workload through the engine and
// reports throughput, latency and KV memory figures. Returns the exit code.
int run_bench_serve(int argc, char** argv);

}  // namespace pagedattn::tools
