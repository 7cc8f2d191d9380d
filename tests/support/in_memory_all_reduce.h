// A tensor-parallel all_reduce_sum for shards on threads of one process:
// each call sums the spans of `size` threads and returns when all have
// arrived (the shard tests' stand-in for MPI).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace pagedattn::test {

class InMemoryAllReduce {
 public:
  explicit InMemoryAllReduce(int size) : size_(size) {}
  void operator()(std::span<float> values) {
    std::unique_lock lock(mutex_);
    const std::uint64_t round = round_;
    if (arrived_ == 0)
      sum_.assign(values.begin(), values.end());
    else
      for (std::size_t i = 0; i < values.size(); ++i) sum_[i] += values[i];
    if (++arrived_ == size_) {
      arrived_ = 0;
      result_ = sum_;
      ++round_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return round_ != round; });
    }
    std::copy(result_.begin(), result_.end(), values.begin());
  }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable done_;
  int arrived_ = 0;
  std::uint64_t round_ = 0;
  std::vector<float> sum_, result_;
};

}  // namespace pagedattn::test
