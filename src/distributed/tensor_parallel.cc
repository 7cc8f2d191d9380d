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
#include <string>
#include <type_traits>
#include <utility>

#include "core/seconds_since.h"
#include "distributed/byte_message.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

using Clock = std::chrono::steady_clock;

enum class Message : std::int32_t { kAttach = 1, kStep = 2, kShutdown = 3 };

// The step protocol's version, sent with kAttach: ranks of builds that
// disagree about the messages' layout stop at once. 2: the full cache log
// (prefix caching, host tier, token trees, step boundaries) and shape checks.
constexpr std::int32_t kProtocolVersion = 2;

// The leader cache's shape and sizing: followers build the same cache.
// int64 fields only, so the struct has no padding (every byte sent is set).
struct CacheShape {
  std::int64_t num_layers = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::int64_t page_size = 0;
  std::int64_t kv_dtype = 0;
  std::int64_t num_pages = 0;
  std::int64_t fixed_kv_chunk = 0, min_kv_chunk = 0;
  std::int64_t support_sliding_window = 0;
  std::int64_t enable_prefix_caching = 0;
  std::int64_t host_num_pages = 0;
  std::int64_t bf16_products = 0, int8_products = 0, f16_products = 0, fp8_fast_products = 0,
               fast_prefill_products = 0;
  std::int64_t prefault_pages = 0;
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
  s.enable_prefix_caching = k.enable_prefix_caching ? 1 : 0;
  s.host_num_pages = k.host_num_pages;
  s.bf16_products = k.attention_plan.bf16_products ? 1 : 0;
  s.int8_products = k.attention_plan.int8_products ? 1 : 0;
  s.f16_products = k.attention_plan.f16_products ? 1 : 0;
  s.fp8_fast_products = k.attention_plan.fp8_fast_products ? 1 : 0;
  s.fast_prefill_products = k.attention_plan.fast_prefill_products ? 1 : 0;
  s.prefault_pages = k.prefault_pages ? 1 : 0;
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
  k.page_size = static_cast<std::int32_t>(leader.page_size);
  k.num_pages = leader.num_pages;
  k.kv_dtype = static_cast<DType>(leader.kv_dtype);
  k.attention_plan.fixed_kv_chunk = static_cast<std::int32_t>(leader.fixed_kv_chunk);
  k.attention_plan.min_kv_chunk = static_cast<std::int32_t>(leader.min_kv_chunk);
  k.support_sliding_window = leader.support_sliding_window != 0;
  // The same page counts in both tiers: replayed calls take the same pages.
  k.enable_prefix_caching = leader.enable_prefix_caching != 0;
  k.host_num_pages = leader.host_num_pages;
  k.attention_plan.bf16_products = leader.bf16_products != 0;
  k.attention_plan.int8_products = leader.int8_products != 0;
  k.attention_plan.f16_products = leader.f16_products != 0;
  k.attention_plan.fp8_fast_products = leader.fp8_fast_products != 0;
  k.attention_plan.fast_prefill_products = leader.fast_prefill_products != 0;
  k.prefault_pages = leader.prefault_pages != 0;
  return k;
}

// --- the cache log on the wire ----------------------------------------------

constexpr auto kLastOpKind = SequenceOp::Kind::kCommitTree;

void put_op(MessageWriter& w, const SequenceOp& op) {
  w.put(op.kind);
  w.put(op.seq_id);
  w.put(op.parent_id);
  w.put(op.count);
  w.put(op.sink_size);
  w.put(op.salt);
  w.put_vector(std::span<const std::int32_t>(op.token_ids));
  w.put_vector(std::span<const SeqId>(op.seq_ids));
  w.put_vector(std::span<const std::int64_t>(op.values));
  w.put_vector(std::span<const std::int64_t>(op.tree_parents));
}

SequenceOp get_op(MessageReader& r) {
  SequenceOp op;
  op.kind = r.get<SequenceOp::Kind>();
  require<InternalError>(op.kind <= kLastOpKind, "tensor parallelism: cache call kind ",
                         static_cast<int>(op.kind), " from rank 0 is not one this build knows");
  op.seq_id = r.get<SeqId>();
  op.parent_id = r.get<SeqId>();
  op.count = r.get<std::int64_t>();
  op.sink_size = r.get<std::int64_t>();
  op.salt = r.get<std::uint64_t>();
  op.token_ids = r.get_vector<std::int32_t>();
  op.seq_ids = r.get_vector<SeqId>();
  op.values = r.get_vector<std::int64_t>();
  op.tree_parents = r.get_vector<std::int64_t>();
  return op;
}

void put_ops(MessageWriter& w, const std::vector<SequenceOp>& ops) {
  w.put(static_cast<std::int64_t>(ops.size()));
  for (const SequenceOp& op : ops) put_op(w, op);
}

// Replays the logged calls on `cache`; returns how many.
std::int64_t replay_ops(MessageReader& r, PagedKVCache& cache) {
  const auto n = r.get<std::int64_t>();
  require<InternalError>(n >= 0, "tensor parallelism: ", n, " cache calls in a message");
  for (std::int64_t i = 0; i < n; ++i) cache.apply(get_op(r));
  return n;
}

// --- the cache's shape, compared after every replay ---------------------------

// What the caches of all ranks must agree on (their K/V bytes differ: each
// holds its own heads). Printed, so that a mismatch shows both sides.
std::string describe_shape(const PagedKVCache& cache) {
  const PrefixCacheStats st = cache.prefix_cache_stats();
  std::string step = "no open step";
  if (cache.in_forward()) {
    // The plan's page tables, positions and tree arrays, hashed.
    const BatchPlan& plan = cache.plan();
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](const auto& values) {
      h = (h ^ values.size()) * 0x100000001b3ull;
      for (const auto v : values) h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001b3ull;
    };
    mix(plan.seq_ids);
    mix(plan.qo_indptr);
    mix(plan.kv_indptr);
    mix(plan.kv_indices);
    mix(plan.kv_last_page_len);
    mix(plan.kv_lens);
    mix(plan.kv_sink_lens);
    mix(plan.kv_gap_lens);
    mix(plan.positions);
    mix(plan.slot_mapping);
    mix(plan.tree_begin);
    mix(plan.tree_node_indptr);
    mix(plan.tree_enter);
    mix(plan.tree_exit);
    mix(plan.tree_positions);
    step =
        detail::concat("step ", plan.step_id, " of ", plan.num_tokens(), " tokens, plan hash ", h);
  }
  return detail::concat(
      step, "; ", cache.num_sequences(), " sequences of ", cache.total_sequence_length(),
      " tokens, ", cache.num_free_pages(), " free pages (", cache.num_cached_pages(), " cached), ",
      cache.num_free_host_pages(), " free host pages; prefix cache: ", st.queries, " queries, ",
      st.hit_tokens, " hit tokens (", st.host_hit_tokens, " from the host tier), ", st.evictions,
      " evictions (", st.demotions, " demoted), ", st.host_evictions, " host evictions; swapped ",
      st.swapped_out_pages, " pages out, ", st.swapped_in_pages, " in");
}

void require_same_shape(const std::string& leader, const PagedKVCache& cache, const char* when) {
  const std::string mine = describe_shape(cache);
  require<InternalError>(mine == leader,
                         "tensor parallelism: this rank's cache differs from rank 0's ", when,
                         " (a replay diverged):\n  rank 0:    ", leader, "\n  this rank: ", mine);
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
  comm.broadcast_vector(message.bytes(), 0, /*idle=*/true);
  seconds += seconds_since(start);
}
}  // namespace

void TensorParallelLeader::attach_cache(PagedKVCache& cache) {
  require<InvalidState>(cache_ == nullptr && !shut_down_,
                        "TensorParallelLeader::attach_cache: already attached (one engine per "
                        "leader) or shut down");
  // The followers' caches start fresh: so must this one, for a replay to match.
  require<InvalidState>(cache.empty() && cache.num_cached_pages() == 0 && !cache.in_forward(),
                        "TensorParallelLeader::attach_cache: the cache holds ",
                        cache.num_sequences(), " sequences and ", cache.num_cached_pages(),
                        " cached pages", cache.in_forward() ? " in an open step" : "",
                        "; attach a fresh cache");
  MessageWriter w;
  w.put(Message::kAttach);
  w.put(kProtocolVersion);
  w.put(shape_of(cache.config()));
  send(comm_, w, broadcast_seconds_);
  // Called under the cache's lock by the thread changing the cache (the
  // engine's, holding the engine's lock, like forward). The token dies with
  // the observer, that is with the cache.
  auto alive = std::make_shared<int>(0);
  cache_alive_ = alive;
  cache.set_sequence_observer([ops = pending_ops_, alive](const SequenceOp& op) {
    (void)alive;  // held, not used
    ops->push_back(op);
  });
  cache_ = &cache;
}

void TensorParallelLeader::forward(const ForwardBatch& batch, PagedKVCache& cache,
                                   std::span<float> logits) {
  require<InvalidState>(&cache == cache_ && !shut_down_,
                        "TensorParallelLeader::forward: not the attached cache, or shut down");
  require<InvalidState>(cache.in_forward(),
                        "TensorParallelLeader::forward: no step is open (call begin_forward)");
  MessageWriter w;
  w.put(Message::kStep);
  w.put(static_cast<std::uint8_t>(batch.deterministic));
  w.put(static_cast<std::uint8_t>(batch.int8_activations));
  w.put(static_cast<std::uint8_t>(batch.bf16_products));
  put_ops(w, *pending_ops_);
  w.put_string(describe_shape(cache));
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
  put_ops(w, *pending_ops_);
  pending_ops_->clear();
  const bool cache_exists = cache_ != nullptr && !cache_alive_.expired();
  w.put(static_cast<std::uint8_t>(cache_exists));
  if (cache_exists) w.put_string(describe_shape(*cache_));
  send(comm_, w, broadcast_seconds_);
}

namespace {

// `logits`: reused across steps. The logged calls end with this step's
// begin_forward (its end_forward comes with the next message).
void replay_step(MessageReader& r, Model& shard, PagedKVCache& cache, std::vector<float>& logits,
                 FollowerReport& report) {
  const bool deterministic = r.get<std::uint8_t>() != 0;
  const bool int8_activations = r.get<std::uint8_t>() != 0;
  const bool bf16_products = r.get<std::uint8_t>() != 0;
  report.ops += replay_ops(r, cache);
  require_same_shape(r.get_string(), cache, "before a forward");
  const std::vector<std::int32_t> token_ids = r.get_vector<std::int32_t>();
  const std::vector<std::int32_t> logit_rows = r.get_vector<std::int32_t>();
  // Rank 0's logit rows: each rank multiplies its vocabulary rows of the
  // LM head for them and takes part in gathering the logits (rank 0 samples).
  logits.resize(logit_rows.size() * static_cast<std::size_t>(shard.spec().vocab_size));
  shard.forward({token_ids, logit_rows, deterministic, int8_activations, bf16_products}, cache,
                logits);
}

void replay_shutdown(MessageReader& r, PagedKVCache* cache, FollowerReport& report) {
  if (cache == nullptr) return;  // rank 0 never attached a cache: nothing was logged
  report.ops += replay_ops(r, *cache);
  if (r.get<std::uint8_t>() != 0) {
    require_same_shape(r.get_string(), *cache, "at shutdown");
    report.checked_at_shutdown = true;
  }
  cache->check_invariants();
}

}  // namespace

FollowerReport run_tensor_parallel_follower(const MpiComm& comm, Model& shard) {
  require(comm.rank() != 0, "run_tensor_parallel_follower: rank 0 leads");
  FollowerReport report;
  std::unique_ptr<PagedKVCache> cache;
  std::vector<float> logits;
  for (bool running = true; running;) {
    std::vector<std::byte> bytes;
    comm.broadcast_vector(bytes, 0, /*idle=*/true);  // the server may be idle for hours
    run_or_abort(comm, "a tensor-parallel step", [&] {
      MessageReader r(bytes, "tensor parallelism: a step message from rank 0");
      const auto kind = r.get<Message>();
      if (kind == Message::kAttach) {
        require<InvalidState>(cache == nullptr, "tensor parallelism: rank 0 attached twice");
        const auto version = r.get<std::int32_t>();
        require<InvalidState>(version == kProtocolVersion,
                              "tensor parallelism: rank 0 speaks step protocol version ", version,
                              ", this rank ", kProtocolVersion,
                              " (every rank must run the same pagedattn build)");
        cache = std::make_unique<PagedKVCache>(
            follower_cache_config(shard.spec(), r.get<CacheShape>()));
        return;
      }
      if (kind == Message::kShutdown) {
        replay_shutdown(r, cache.get(), report);
        running = false;
        return;
      }
      require<InternalError>(kind == Message::kStep && cache != nullptr,
                             "tensor parallelism: unexpected message ", static_cast<int>(kind),
                             " from rank 0");
      replay_step(r, shard, *cache, logits, report);
      ++report.steps;
    });
  }
  report.cache_empty = cache == nullptr || cache->empty();
  report.num_pages = cache == nullptr ? 0 : cache->num_pages();
  report.num_host_pages = cache == nullptr ? 0 : cache->num_host_pages();
  if (cache != nullptr) report.prefix_cache = cache->prefix_cache_stats();
  return report;
}

}  // namespace pagedattn::dist
