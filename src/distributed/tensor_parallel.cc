// Tensor parallelism over MPI: the shard's all-reduce and all-gather, the
// startup check, and the leader/follower step protocol (one broadcast
// message per step).
#include "pagedattn/distributed/tensor_parallel.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/seconds_since.h"
#include "distributed/byte_message.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

using Clock = std::chrono::steady_clock;

enum class Message : std::int32_t { kAttach = 1, kStep = 2, kShutdown = 3 };

// The leader cache's shape and sizing: followers build the same cache.
struct CacheShape {
  std::int32_t num_layers = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::int32_t page_size = 0;
  std::int32_t kv_dtype = 0;
  std::int64_t num_pages = 0;
  std::int32_t fixed_kv_chunk = 0, min_kv_chunk = 0;
  std::int32_t support_sliding_window = 0;
  std::int32_t padding = 0;  // explicit, so every byte sent is initialized
};

// Runs f; on an exception prints it and ends every rank (another rank may
// be waiting in a collective this one will never join).
template <class F>
void run_or_abort(const MpiComm& comm, const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "pagedattn tensor parallelism: rank %d of %d failed in %s: %s\n"
                 "pagedattn tensor parallelism: aborting every rank\n",
                 comm.rank(), comm.size(), what, e.what());
    std::fflush(stderr);
    comm.abort(1);
  }
}

CacheShape shape_of(const KVCacheConfig& k) {
  CacheShape s;
  s.num_layers = k.num_layers;
  s.num_qo_heads = k.num_qo_heads;
  s.num_kv_heads = k.num_kv_heads;
  s.head_dim = k.head_dim;
  s.page_size = k.page_size;
  s.kv_dtype = static_cast<std::int32_t>(k.kv_dtype);
  s.num_pages = k.num_pages;
  s.fixed_kv_chunk = k.attention_plan.fixed_kv_chunk;
  s.min_kv_chunk = k.attention_plan.min_kv_chunk;
  s.support_sliding_window = k.support_sliding_window ? 1 : 0;
  return s;
}

// The follower's cache: its model's shape, the leader's sizing.
KVCacheConfig follower_cache_config(const ModelSpec& spec, const CacheShape& leader) {
  KVCacheConfig k = kv_cache_config(spec);
  const CacheShape mine = shape_of(k);
  require<InvalidArgument>(
      mine.num_layers == leader.num_layers && mine.num_qo_heads == leader.num_qo_heads &&
          mine.num_kv_heads == leader.num_kv_heads && mine.head_dim == leader.head_dim,
      "tensor parallelism: this rank's shard has ", mine.num_layers, " layers x ",
      mine.num_qo_heads, " query / ", mine.num_kv_heads, " KV heads of ", mine.head_dim,
      ", rank 0's has ", leader.num_layers, " x ", leader.num_qo_heads, " / ", leader.num_kv_heads,
      " of ", leader.head_dim);
  k.page_size = leader.page_size;
  k.num_pages = leader.num_pages;
  k.kv_dtype = static_cast<DType>(leader.kv_dtype);
  k.attention_plan.fixed_kv_chunk = leader.fixed_kv_chunk;
  k.attention_plan.min_kv_chunk = leader.min_kv_chunk;
  k.support_sliding_window = leader.support_sliding_window != 0;
  return k;
}

std::uint64_t fnv1a(std::span<const char> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// MPI_Allgather in place: `values` holds comm.size() blocks of equal length.
void all_gather_blocks(const MpiComm& comm, std::span<float> values) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  require<InvalidArgument>(values.size() % ranks == 0, "tensor parallelism: all_gather of ",
                           values.size(), " floats, not a multiple of the ", ranks, " ranks");
  const std::size_t block = values.size() / ranks;
  require<InvalidArgument>(block <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                           "tensor parallelism: all_gather blocks of ", block,
                           " floats exceed MPI's int counts");
  check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(),
                          static_cast<int>(block), MPI_FLOAT, comm.handle()),
            "MPI_Allgather");
}

}  // namespace

TensorParallelShard mpi_shard(const MpiComm& comm, std::shared_ptr<CollectiveStats> stats) {
  TensorParallelShard shard;
  shard.rank = comm.rank();
  shard.size = comm.size();
  shard.all_reduce_sum = [comm, stats](std::span<float> values) {
    const auto start = Clock::now();
    comm.all_reduce_sum(values);
    if (stats) {
      stats->seconds += seconds_since(start);
      stats->floats += std::ssize(values);
      ++stats->calls;
    }
  };
  // The vocabulary-parallel LM head's logits; timed with the all-reduces
  // (stats count every collective of the forward pass).
  shard.all_gather = [comm, stats](std::span<float> values) {
    const auto start = Clock::now();
    all_gather_blocks(comm, values);
    if (stats) {
      stats->seconds += seconds_since(start);
      stats->floats += std::ssize(values);
      ++stats->calls;
    }
  };
  return shard;
}

void require_same_model(const MpiComm& comm, const std::string& fingerprint) {
  std::vector<char> root(fingerprint.begin(), fingerprint.end());
  comm.broadcast_vector(root, 0);
  const bool same = std::string(root.begin(), root.end()) == fingerprint;
  std::vector<float> differs(static_cast<std::size_t>(comm.size()), 0.0f);
  differs[static_cast<std::size_t>(comm.rank())] = same ? 0.0f : 1.0f;
  comm.all_reduce_sum(differs);
  std::string ranks;
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0.0f) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (ranks.empty()) return;
  throw InvalidArgument(
      detail::concat("tensor parallelism: the ranks do not run the same model: rank(s) ", ranks,
                     " differ from rank 0",
                     same ? std::string()
                          : detail::concat(" (rank 0: ", std::string(root.begin(), root.end()),
                                           "; rank ", comm.rank(), ": ", fingerprint, ")")));
}

void run_on_every_rank(const MpiComm& comm, const std::function<void()>& f) {
  std::exception_ptr error;
  try {
    f();
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<float> failed(static_cast<std::size_t>(comm.size()), 0.0f);
  failed[static_cast<std::size_t>(comm.rank())] = error ? 1.0f : 0.0f;
  comm.all_reduce_sum(failed);
  if (error) std::rethrow_exception(error);
  std::string ranks;
  for (std::size_t r = 0; r < failed.size(); ++r)
    if (failed[r] != 0.0f) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  require<InvalidState>(ranks.empty(), "tensor parallelism: rank(s) ", ranks,
                        " failed (see their error); this rank stops too");
}

std::string model_fingerprint(const LlamaConfig& c) {
  return detail::concat("llama '", c.name, "' vocab ", c.vocab_size, " hidden ", c.hidden_size,
                        " intermediate ", c.intermediate_size, " layers ", c.num_layers, " heads ",
                        c.num_qo_heads, "/", c.num_kv_heads, "x", c.head_dim, " rope ",
                        static_cast<int>(c.rope_style), "/", c.rope_theta, "/",
                        c.llama3_rope_factor, " eps ", c.rms_norm_eps, " max_position ",
                        c.max_position, " tied ", c.tie_embeddings, " eos ", c.eos_token_id,
                        " seed ", c.weight_seed, " tensor-parallel size ", c.shard.size);
}

std::string gguf_fingerprint(const std::string& path, std::int32_t tensor_parallel_size) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return detail::concat("gguf '", path, "' (cannot be opened)");
  const auto size = static_cast<std::int64_t>(in.tellg());
  std::vector<char> head(static_cast<std::size_t>(std::min<std::int64_t>(size, 1 << 20)));
  in.seekg(0);
  in.read(head.data(), std::ssize(head));
  return detail::concat("gguf of ", size, " bytes, header hash ", fnv1a(head),
                        ", tensor-parallel size ", tensor_parallel_size);
}

TensorParallelLeader::TensorParallelLeader(const MpiComm& comm, std::unique_ptr<Model> shard)
    : comm_(comm), shard_(std::move(shard)) {
  require(shard_ != nullptr, "TensorParallelLeader: shard is null");
  require(comm_.rank() == 0, "TensorParallelLeader: runs on rank 0, this is rank ", comm_.rank());
}

TensorParallelLeader::~TensorParallelLeader() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn tensor parallelism: shutdown failed: %s\n", e.what());
  }
}

namespace {
void send(const MpiComm& comm, MessageWriter& message, double& seconds) {
  const auto start = Clock::now();
  comm.broadcast_vector(message.bytes(), 0);
  seconds += seconds_since(start);
}
}  // namespace

void TensorParallelLeader::attach_cache(PagedKVCache& cache) {
  require<InvalidState>(cache_ == nullptr && !shut_down_,
                        "TensorParallelLeader::attach_cache: already attached (one engine per "
                        "leader) or shut down");
  cache_ = &cache;
  MessageWriter w;
  w.put(Message::kAttach);
  w.put(shape_of(cache.config()));
  send(comm_, w, broadcast_seconds_);
  // Called under the cache's lock by the thread changing the cache (the
  // engine's, holding the engine's lock, like forward).
  cache.set_sequence_observer([ops = pending_ops_](const SequenceOp& op) { ops->push_back(op); });
}

void TensorParallelLeader::forward(const ForwardBatch& batch, PagedKVCache& cache,
                                   std::span<float> logits) {
  require<InvalidState>(&cache == cache_ && !shut_down_,
                        "TensorParallelLeader::forward: not the attached cache, or shut down");
  const BatchPlan& plan = cache.plan();
  require<Unsupported>(!plan.has_tree,
                       "TensorParallelLeader::forward: token trees are not replicated");
  std::vector<std::int64_t> lengths(plan.seq_ids.size());
  for (std::size_t i = 0; i < lengths.size(); ++i)
    lengths[i] = plan.qo_indptr[i + 1] - plan.qo_indptr[i];
  MessageWriter w;
  w.put(Message::kStep);
  w.put(static_cast<std::uint8_t>(batch.deterministic));
  w.put_vector(std::span<const SequenceOp>(*pending_ops_));
  w.put_vector(std::span<const SeqId>(plan.seq_ids));
  w.put_vector(std::span<const std::int64_t>(lengths));
  w.put_vector(batch.token_ids);
  w.put_vector(batch.logit_rows);
  send(comm_, w, broadcast_seconds_);
  pending_ops_->clear();
  run_or_abort(comm_, "forward", [&] { shard_->forward(batch, cache, logits); });
}

void TensorParallelLeader::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // The cache may be gone already (an Engine destroys its cache before
  // releasing its model): its observer only holds the log.
  MessageWriter w;
  w.put(Message::kShutdown);
  w.put_vector(std::span<const SequenceOp>(*pending_ops_));
  pending_ops_->clear();
  send(comm_, w, broadcast_seconds_);
}

namespace {

// `logits`: reused across steps.
void replay_step(MessageReader& r, Model& shard, PagedKVCache& cache, std::vector<float>& logits) {
  const bool deterministic = r.get<std::uint8_t>() != 0;
  for (const SequenceOp& op : r.get_vector<SequenceOp>()) cache.apply(op);
  const std::vector<SeqId> seq_ids = r.get_vector<SeqId>();
  const std::vector<std::int64_t> lengths = r.get_vector<std::int64_t>();
  const std::vector<std::int32_t> token_ids = r.get_vector<std::int32_t>();
  const std::vector<std::int32_t> logit_rows = r.get_vector<std::int32_t>();
  cache.begin_forward(seq_ids, lengths);
  // Rank 0's logit rows: each rank multiplies its vocabulary rows of the
  // LM head for them and takes part in gathering the logits (rank 0 samples).
  logits.resize(logit_rows.size() * static_cast<std::size_t>(shard.spec().vocab_size));
  shard.forward({token_ids, logit_rows, deterministic}, cache, logits);
  cache.end_forward();
}

}  // namespace

FollowerReport run_tensor_parallel_follower(const MpiComm& comm, Model& shard) {
  require(comm.rank() != 0, "run_tensor_parallel_follower: rank 0 leads");
  FollowerReport report;
  std::unique_ptr<PagedKVCache> cache;
  std::vector<float> logits;
  for (bool running = true; running;) {
    std::vector<std::byte> bytes;
    comm.broadcast_vector(bytes, 0);
    run_or_abort(comm, "a tensor-parallel step", [&] {
      MessageReader r(bytes, "tensor parallelism: a step message from rank 0");
      const auto kind = r.get<Message>();
      if (kind == Message::kAttach) {
        require<InvalidState>(cache == nullptr, "tensor parallelism: rank 0 attached twice");
        cache = std::make_unique<PagedKVCache>(
            follower_cache_config(shard.spec(), r.get<CacheShape>()));
        return;
      }
      if (kind == Message::kShutdown) {
        const std::vector<SequenceOp> ops = r.get_vector<SequenceOp>();
        if (cache != nullptr) {
          for (const SequenceOp& op : ops) cache->apply(op);
          cache->check_invariants();
        }
        running = false;
        return;
      }
      require<InternalError>(kind == Message::kStep && cache != nullptr,
                             "tensor parallelism: unexpected message ", static_cast<int>(kind),
                             " from rank 0");
      replay_step(r, shard, *cache, logits);
      ++report.steps;
    });
  }
  report.cache_empty = cache == nullptr || cache->empty();
  report.num_pages = cache == nullptr ? 0 : cache->num_pages();
  return report;
}

}  // namespace pagedattn::dist
