#include "core/own_thread.h"

#include <omp.h>

#include <exception>
#include <thread>

namespace pagedattn::core {

void run_on_own_thread(const std::function<void()>& f) {
  const int threads = omp_get_max_threads();
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      omp_set_num_threads(threads);
      f();
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
}

void run_on_own_thread_if(bool parallel, const std::function<void()>& f) {
  if (parallel)
    run_on_own_thread(f);
  else
    f();
}

}  // namespace pagedattn::core
