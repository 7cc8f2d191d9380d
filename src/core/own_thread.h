// Start-up parallel work on a thread of its own.
#pragma once

#include <functional>

namespace pagedattn::core {

// Runs f on a new thread with the caller's OpenMP thread count, waits for
// it and rethrows what it threw. For parallel work done once when something
// is made (touching a K/V pool, timing the attention product paths): libgomp
// keeps a team of threads for every thread that opened a parallel region
// until that thread exits, and while it manages more threads than there are
// CPUs it cuts every team's spinning between regions to almost nothing, so a
// server's stepping thread (not the one that made its engine) then had its
// threads fall asleep between each step's regions. A team made here ends with
// its thread.
void run_on_own_thread(const std::function<void()>& f);

// f on a thread of its own when it opens a parallel region (`parallel`),
// here otherwise: a loader's small pieces pay no thread.
void run_on_own_thread_if(bool parallel, const std::function<void()>& f);

}  // namespace pagedattn::core
