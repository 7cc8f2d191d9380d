// OpenMP's thread count for the rest of a scope, restored at its end.
#pragma once

#include <omp.h>

namespace pagedattn::test {

struct OmpThreads {
  int saved = omp_get_max_threads();
  explicit OmpThreads(int threads) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;
};

}  // namespace pagedattn::test
