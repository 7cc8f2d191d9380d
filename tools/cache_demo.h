#pragma once

namespace pagedattn::tools {

// Runs a scripted serving scenario on a PagedKVCache and prints what the
// cache does at each stage. Returns the process exit code.
int run_cache_demo();

}  // namespace pagedattn::tools
