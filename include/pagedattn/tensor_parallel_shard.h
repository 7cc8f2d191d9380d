// Which slice of a model this process computes under tensor parallelism
// (Megatron-style): rank r of N keeps query and KV heads [r H / N, (r+1) H / N),
// the matching rows of Q/K/V and gate/up (column split) and input columns of
// the attention output and down projections (row split). Their partial
// outputs are summed over ranks by all_reduce_sum, once after the attention
// output projection and once after the down projection of every layer.
// Embeddings, norms and the LM head are replicated, so every rank holds the
// same residual stream and logits. The engine library only calls
// all_reduce_sum; the transport (MPI in src/distributed) is the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

namespace pagedattn {

struct TensorParallelShard {
  std::int32_t rank = 0;  // in [0, size)
  std::int32_t size = 1;  // 1: the whole model, all_reduce_sum unused
  // In place: every element becomes the sum of that element over all ranks
  // (the same result on every rank). Required when size > 1.
  std::function<void(std::span<float>)> all_reduce_sum;
};

}  // namespace pagedattn
