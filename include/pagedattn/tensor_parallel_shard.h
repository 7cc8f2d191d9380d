// Which slice of a model this process computes under tensor parallelism
// (Megatron-style): rank r of N keeps query and KV heads [r H / N, (r+1) H / N)
// (with N > Hkv: a copy of KV head r Hkv / N), the matching rows of Q/K/V and
// gate/up (column split) and input columns of the attention output and down
// projections (row split). Their partial outputs are summed over ranks by
// all_reduce_sum, once after the attention output projection and once after
// the down projection of every layer. With all_gather set, the LM head is
// split by vocabulary rows and the logits gathered; embeddings and norms are
// replicated, so every rank holds the same residual stream and logits. The
// engine library only calls these functions; the transport (MPI in
// src/distributed) is the caller's.
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
  // In place: `values` holds `size` blocks of equal length; every rank's
  // block `rank` is copied into that block on every rank. Optional: when
  // empty, every rank multiplies the whole LM head. (The initializer keeps
  // {rank, size, all_reduce_sum} free of missing-initializer warnings.)
  std::function<void(std::span<float>)> all_gather = {};
};

}  // namespace pagedattn
