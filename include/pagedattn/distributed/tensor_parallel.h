// Tensor parallelism over MPI ranks. Every rank holds one shard of the
// model (TensorParallelShard: 1/N of the heads, of the KV cache and of the
// attention, MLP and LM head weights); the shards' partial sums meet in
// MPI_Allreduce, their slices of the logits in MPI_Allgather.
// Rank 0 runs the Engine (scheduler, sampling) on a TensorParallelLeader;
// ranks 1.. run run_tensor_parallel_follower. Each step the leader
// broadcasts what the followers need to build the same plan: every call
// that changed its cache since the last step, as the cache's observer logged
// it (SequenceOp: sequences added with or without a cached prefix, forked,
// popped, windowed or removed - an abort is a remove -, tokens told to the
// prefix cache, swaps to and from the host tier, token-tree commits, and
// the step boundaries: begin_forward with its arguments and tree,
// end_forward, cancel_forward), a check of the cache's shape after them, the
// token ids, the logit rows and the deterministic flag. Followers replay the
// calls on their own cache, compare its shape with rank 0's (an error ending
// every rank when they differ), and every rank runs its shard's forward.
//
//   dist::MpiComm world = dist::MpiComm::world();
//   auto stats = std::make_shared<dist::CollectiveStats>();
//   LlamaConfig config = llama_preset("tiny");
//   config.shard = dist::mpi_shard(world, stats);
//   dist::require_same_model(world, dist::model_fingerprint(config));
//   if (world.rank() == 0) {
//     auto leader = std::make_shared<dist::TensorParallelLeader>(world, make_llama_model(config));
//     { Engine engine({.model = leader}); ... }
//     leader->shutdown();
//   } else {
//     dist::run_tensor_parallel_follower(world, *make_llama_model(config));
//   }
//
// Failures: a rank whose forward throws prints the error and calls
// MpiComm::abort (the others may be inside a collective and would wait
// forever otherwise), so mpirun ends every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/llama.h"
#include "pagedattn/model.h"

namespace pagedattn::dist {

// Time spent inside the shard's collectives (all_reduce_sum, all_gather), for benchmarks.
struct CollectiveStats {
  std::int64_t calls = 0;
  std::int64_t floats = 0;  // summed element counts
  double seconds = 0.0;
};

// Rank comm.rank() of comm.size(), its all-reduce MPI_Allreduce and its
// all-gather MPI_Allgather over comm, timed into `stats` when not null.
TensorParallelShard mpi_shard(const MpiComm& comm, std::shared_ptr<CollectiveStats> stats = {});

// Startup check, collective: every rank passes a description of what it
// loaded; InvalidArgument on every rank (so none waits for the others) when
// any rank's differs from rank 0's, naming the ranks and, on a differing
// rank, both descriptions.
void require_same_model(const MpiComm& comm, const std::string& fingerprint);
// Collective: runs f on every rank; when it throws on any rank, throws on
// every rank (a failing rank its own error, the others one naming the
// failed ranks), so that no rank goes on to wait for one that gave up.
void run_on_every_rank(const MpiComm& comm, const std::function<void()>& f);
// The whole-model fields of a config and the tensor-parallel size.
std::string model_fingerprint(const LlamaConfig& config);
// A GGUF file's identity: its size and a hash of its first MiB (header,
// metadata and tensor table), plus the tensor-parallel size.
std::string gguf_fingerprint(const std::string& path, std::int32_t tensor_parallel_size);

// Rank 0's model: the local shard behind the Model interface, keeping the
// followers in step with every forward.
class TensorParallelLeader final : public Model {
 public:
  TensorParallelLeader(const MpiComm& comm, std::unique_ptr<Model> shard);
  ~TensorParallelLeader() override;  // shutdown() if not done yet
  TensorParallelLeader(const TensorParallelLeader&) = delete;
  TensorParallelLeader& operator=(const TensorParallelLeader&) = delete;

  const ModelSpec& spec() const override { return shard_->spec(); }
  // Sends the cache's config (page size and count, dtype, planning, prefix
  // caching, host tier: the followers build identical caches) and logs every
  // call that changes it from now on. InvalidState on a second call, or for
  // a cache that is not fresh (a sequence, a cached page or an open step).
  void attach_cache(PagedKVCache& cache) override;
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override;
  // Sends the operations logged since the last step (e.g. the removes of
  // the last finished requests) and, while the cache still exists, its final
  // shape for the followers to compare; then releases them. Idempotent.
  void shutdown();
  // Seconds spent broadcasting steps (the all-reduces are in CollectiveStats).
  double broadcast_seconds() const { return broadcast_seconds_; }

 private:
  MpiComm comm_;
  std::unique_ptr<Model> shard_;
  PagedKVCache* cache_ = nullptr;  // read only while cache_alive_ holds
  // The cache's observer appends here; shared, so either may outlive the other.
  std::shared_ptr<std::vector<SequenceOp>> pending_ops_ =
      std::make_shared<std::vector<SequenceOp>>();
  // Expires when the cache (and with it its observer, which holds the
  // token) is destroyed: an Engine destroys its cache before its model.
  std::weak_ptr<const void> cache_alive_;
  bool shut_down_ = false;
  double broadcast_seconds_ = 0.0;
};

// What a follower saw, for tests and logs.
struct FollowerReport {
  std::int64_t steps = 0;
  std::int64_t ops = 0;      // cache calls replayed
  bool cache_empty = false;  // no sequence and every page free at shutdown
  std::int64_t num_pages = 0;
  std::int64_t num_host_pages = 0;
  // This rank's cache at shutdown: its prefix-cache and swap counters, and
  // whether its shape was compared with rank 0's then (rank 0's cache still
  // existed when it shut down).
  PrefixCacheStats prefix_cache;
  bool checked_at_shutdown = false;
};

// Ranks other than 0: replays rank 0's steps on `shard` and a cache of its
// own until the leader shuts down; checks the cache's invariants at the end.
// A message of another protocol version, or a cache whose shape differs
// from rank 0's after a replay, prints the difference and ends every rank.
FollowerReport run_tensor_parallel_follower(const MpiComm& comm, Model& shard);

}  // namespace pagedattn::dist
