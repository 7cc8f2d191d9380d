// `pagedattn bench-attention`: one attention shape, timed and reported as a
// fraction of this machine's measured limits.
#pragma once

namespace pagedattn::tools {

// argv: the options after the subcommand name. Returns the exit status;
// throws pagedattn::InvalidArgument on a bad option.
int run_bench_attention(int argc, char** argv);

}  // namespace pagedattn::tools
