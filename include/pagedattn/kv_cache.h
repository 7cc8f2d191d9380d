// PagedKVCache: the owning KV-cache manager. It owns the K/V page storage of
// every layer and the metadata (page pool with refcounts, sequences as page
// lists), and turns each step's begin_forward into a BatchPlan that kernels
// consume. It never does math on K/V values beyond copying pages.
//
// Every call validates all of its arguments before touching state and is
// transactional: on error it throws a pagedattn::Error subclass naming the
// argument and value, and the cache is left bit-identical (state_digest()).
//
// Threading: a cache is internally synchronized. Any call may come from any
// thread; calls on one cache serialize on its mutex (attention holds it for
// the whole layer, so a structural call from another thread waits for the
// layer to finish). The only exceptions: construction, destruction and
// moves (no other thread may use the cache then), and the references and
// views some calls return - config() is fixed; the BatchPlan returned by
// begin_forward / plan() stays valid only until the step ends (end_forward,
// cancel_forward), so the thread driving a step must be the one to end it.
// Other threads may query, add or remove sequences and so on, but structural
// calls are refused (InvalidState) while a step is open, as they always were.
//
// Steps have identities: begin_forward numbers each step (BatchPlan::step_id)
// and every per-step call (attention, mark_layer_appended, end_forward,
// cancel_forward) takes the id of the step its caller began, refusing
// (InvalidState) when another step is open: a thread whose step another
// thread ended and replaced - even by one of the same token count - never
// writes its K/V into the other step's sequences.
//
// Steps never expose stale K/V: pages are reused without being cleared, so
// end_forward refuses a step in which some layer's K/V of the new tokens was
// not written (see end_forward), and debug_get_kv reads a step's token of a
// layer not yet written as zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn {

using SeqId = std::int64_t;
// A step's identity: begin_forward numbers the steps of a cache 1, 2, ...
// (cancelled ones included, so an id is never reused). kAnyStep in a
// per-step call means "whichever step is open" (no check).
using StepId = std::uint64_t;
inline constexpr StepId kAnyStep = 0;

// Where RoPE happens for cache-level attention (TVM's modes).
enum class RopeMode : std::uint8_t {
  kNone = 0,    // q and k arrive rotated (or the model has no RoPE)
  kNormal = 1,  // q and new k are rotated at their positions; K is stored rotated
  kInline = 2,  // K is stored raw and rotated inside attention at its cache position
};

// Where a cache's K/V pages live.
enum class KVDevice : std::uint8_t {
  kCpu = 0,   // host memory; the CPU kernels
  kCuda = 1,  // an NVIDIA GPU's memory through a KVDeviceBackend (kv_device.h)
};

class KVDeviceBackend;

// What a token stores per layer (TVM's AttnKind).
enum class AttentionKind : std::uint8_t {
  kMHA = 0,  // K and V rows per KV head (multi-head, grouped-query, multi-query)
  // Multi-head latent attention (DeepSeek-V2/V3): one row per token,
  // K = [latent (v_head_dim) | RoPE key (head_dim - v_head_dim)], and V is
  // the latent itself, so nothing is stored for V. num_kv_heads must be 1;
  // queries are absorbed into the latent space ([latent | rope] per head),
  // outputs come back in it; attention() takes no v.
  kMLA = 1,
};

// Named-field configuration; every field is validated by the constructor.
struct KVCacheConfig {
  std::int32_t num_layers = 1;
  std::int32_t num_qo_heads = 1;
  std::int32_t num_kv_heads = 1;  // must divide num_qo_heads
  std::int32_t head_dim = 128;    // K (and Q) head dim
  std::int32_t v_head_dim = 0;    // 0 means head_dim
  AttentionKind attention_kind = AttentionKind::kMHA;
  std::int32_t page_size = 16;  // tokens per page, >= 1
  // Give either num_pages, or (num_pages = 0) a byte budget for K+V storage
  // of all layers, from which the largest fitting page count is derived.
  std::int64_t num_pages = 0;
  std::int64_t memory_budget_bytes = 0;
  // f32, f16, bf16, fp8 e4m3fn / e5m2 (value = stored x scale; per tensor,
  // or per KV head when the vectors below are given), or int8 (symmetric, a
  // scale per token and head kept beside the page and set on write).
  DType kv_dtype = DType::kF16;
  float k_scale = 1.0f, v_scale = 1.0f;  // fp8 per-tensor dequantisation scales
  std::vector<float> k_head_scales;      // fp8: [num_kv_heads] or empty
  std::vector<float> v_head_scales;      // fp8: [num_kv_heads] or empty
  KVLayout layout = KVLayout::kHND;
  bool support_sliding_window = false;  // enable_sliding_window requires it
  // Cache-level attention: where RoPE is applied, and its parameters
  // (rope.cos_cache must be null: the cache builds its own table).
  RopeMode rope_mode = RopeMode::kNone;
  RopeConfig rope;
  // How attention() plans its kernel work. fixed_kv_chunk > 0 makes every
  // row's result independent of its batch mates (an engine's deterministic
  // mode); num_threads 0 means OpenMP's maximum.
  AttentionPlanOptions attention_plan;
  // Automatic prefix caching (docs/prefix_caching.md): full pages whose token
  // ids a sequence told (set_sequence_tokens) stay cached after it is removed
  // and are shared with later sequences whose prompts start the same way.
  bool enable_prefix_caching = false;
  // The host-memory tier: a second pool of pages, same shape as the device
  // pages, for swapped-out sequences and for cached pages evicted from the
  // device pool. Give host_num_pages, or (host_num_pages = 0) a byte budget;
  // both 0 means no host tier.
  std::int64_t host_num_pages = 0;
  std::int64_t host_memory_budget_bytes = 0;
  // Where the pages live. kCuda needs the constructor that takes a backend
  // (pagedattn::cuda::kv_device_backend()), whose comment says what such a
  // cache serves differently (docs/design.md, "Device storage (CUDA)").
  KVDevice device = KVDevice::kCpu;
  // Touch every page of a CPU cache's pool when the cache is made, spread
  // over OpenMP's threads, so that no step waits later while the kernel
  // zeroes memory the step writes first (a 2 MiB huge page per fault, on
  // the stepping thread alone while the others wait: the first step of a
  // 30-layer model spent 130-170 ms on it on the Zen 5 VM). The pool is then
  // resident from the start, as vLLM's and llama.cpp's KV buffers are. The
  // engine sets it; false: pages are mapped as they are first written. Not
  // the host tier, nor a device cache.
  bool prefault_pages = false;
};

// What a new sequence would get from the prefix cache (match_prefix).
struct PrefixMatch {
  std::int64_t num_tokens = 0;    // tokens whose K/V come from the cache (whole pages)
  std::int64_t device_pages = 0;  // of its pages, hits resident in device pages
  std::int64_t host_pages = 0;    // hits in the host tier (copied into fresh device pages)
  // Free device pages (num_free_pages) adding the sequence would consume:
  // host hits plus device hits that sit evictable in the cache.
  std::int64_t pages_taken = 0;
};

// Prefix-cache and host-tier counters since construction.
struct PrefixCacheStats {
  std::int64_t queries = 0;            // add_sequence_with_prefix calls
  std::int64_t query_tokens = 0;       // tokens those calls offered
  std::int64_t hit_tokens = 0;         // tokens they got from the cache
  std::int64_t device_hit_tokens = 0;  // ... from device pages
  std::int64_t host_hit_tokens = 0;    // ... from the host tier
  std::int64_t evictions = 0;          // cached device pages reclaimed by the pool
  std::int64_t demotions = 0;          // ... of which moved to the host tier
  std::int64_t host_evictions = 0;     // cached host pages reclaimed
  std::int64_t swapped_out_pages = 0;  // device pages copied to the host by swap_out
  std::int64_t swapped_in_pages = 0;   // host pages copied back by swap_in
};

// What kernels need for one step, shared by every layer. Built by
// begin_forward; valid until end_forward (or the next begin_forward).
struct BatchPlan {
  StepId step_id = kAnyStep;                   // the step this plan belongs to
  std::vector<SeqId> seq_ids;                  // [batch_size] in the caller's order
  std::vector<std::int32_t> qo_indptr;         // [batch_size + 1] offsets of new tokens
  std::vector<std::int32_t> kv_indptr;         // [batch_size + 1] offsets into kv_indices
  std::vector<std::int32_t> kv_indices;        // [kv_indptr.back()] page ids
  std::vector<std::int32_t> kv_last_page_len;  // [batch_size]
  std::vector<std::int32_t> kv_lens;           // [batch_size] keys after the append
  std::vector<std::int32_t> kv_sink_lens;      // [batch_size] (see PagedKVTable)
  std::vector<std::int32_t> kv_gap_lens;       // [batch_size] (see PagedKVTable)
  std::vector<std::int32_t> positions;         // [num_tokens] position of each new token
                                               // (tree nodes: committed length + depth)
  std::vector<std::int64_t> slot_mapping;  // [num_tokens] page * page_size + offset, -1 = no write
  bool has_gaps = false;                   // any kv_gap_lens[b] != 0
  std::int32_t page_size = 0;
  // Token trees (see TokenTreeMask; filled only when has_tree): sequences
  // whose uncommitted tree is a plain chain get tree_begin = kv_lens (none).
  bool has_tree = false;
  std::vector<std::int32_t> tree_begin;        // [batch_size]
  std::vector<std::int32_t> tree_node_indptr;  // [batch_size + 1]
  std::vector<std::int32_t> tree_enter;        // [nodes]
  std::vector<std::int32_t> tree_exit;         // [nodes]
  std::vector<std::int32_t> tree_positions;    // [nodes]

  std::int32_t batch_size() const { return static_cast<std::int32_t>(seq_ids.size()); }
  std::int32_t num_tokens() const { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
  // Non-owning CSR view for kernels (gap arrays omitted when has_gaps is false).
  PagedKVTable table() const;
  // Non-owning view of the tree arrays (inactive when has_tree is false).
  TokenTreeMask tree_mask() const;
};

// One successful call that changed the cache's pages or sequences, as a
// sequence observer sees it: every sequence operation (add, remove, fork,
// pop_n, enable_sliding_window), the prefix cache's (add_sequence_with_prefix,
// set_sequence_tokens when it told new tokens, reset_prefix_cache), the
// host tier's (swap_out, swap_in), the step boundaries (begin_forward of
// either overload, end_forward, cancel_forward) and
// commit_accepted_token_tree_nodes. Replaying a log of them in order with
// PagedKVCache::apply on a cache of the same config (between a begin_forward
// and its end_forward, the replica writes that step's K/V itself) rebuilds
// the same sequences, pages, prefix index, host tier and counters: tensor
// parallelism keeps every rank's cache in step with the scheduler's this
// way. Page transfer (reserve_incoming, outgoing_pages) has no entry: it is
// refused while an observer is set.
struct SequenceOp {
  enum class Kind : std::uint8_t {
    kAdd,
    kRemove,
    kFork,
    kPopN,
    kSlidingWindow,
    kAddWithPrefix,  // seq_id, token_ids (all offered), salt; count: tokens it took
    kTellTokens,     // seq_id; token_ids: the tokens told past the first `count`
    kResetPrefixCache,
    kSwapOut,       // seq_ids
    kSwapIn,        // seq_ids
    kBeginForward,  // seq_ids, values (append lengths); count 1: tree_parents apply
    kEndForward,
    kCancelForward,
    kCommitTree,  // seq_ids, values (leaf indices)
  };
  Kind kind = Kind::kAdd;
  SeqId seq_id = 0;            // the sequence changed (kFork: the child)
  SeqId parent_id = 0;         // kFork
  std::int64_t count = 0;      // kFork: fork_pos (resolved, never -1); kPopN: n;
                               // kSlidingWindow: window_size; kAddWithPrefix: the
                               // tokens it took from the cache; kTellTokens: tokens
                               // told before; kBeginForward: 1 for a tree forward
  std::int64_t sink_size = 0;  // kSlidingWindow: attn_sink_size
  std::uint64_t salt = 0;      // kAddWithPrefix: cache_salt
  std::vector<std::int32_t> token_ids = {};
  std::vector<SeqId> seq_ids = {};
  std::vector<std::int64_t> values = {};
  std::vector<std::int64_t> tree_parents = {};  // kBeginForward with count 1
};
using SequenceObserver = std::function<void(const SequenceOp&)>;
// --- page transfer (disaggregated prefill/decode) ------------------------------
// The K/V bytes of a sequence's pages as contiguous byte runs of this cache's
// storage, per layer, in one canonical order: the K pages of the sequence in
// logical order, then its V pages (an int8 K page carries the page's K and
// V token scales after its K block, so every page is two runs, K and V, one
// under MLA). Whole pages are listed (a partial last page too); runs of
// neighbouring pages are merged. Two caches with equal configs list byte
// streams of equal length for the same token count, so a sender's stream
// lands in a receiver's pages whatever their page ids (page ids are remapped:
// each side's pages are its own). The views are non-owning: MPI (or memcpy)
// moves the bytes straight from one cache's storage into the other's.
struct KVPageRuns {
  SeqId seq_id = 0;
  std::int64_t num_tokens = 0;
  std::vector<std::int32_t> pages;                        // this cache's page ids, logical order
  std::vector<std::vector<std::span<std::byte>>> layers;  // [num_layers] runs
  std::int64_t layer_bytes = 0;                           // bytes of each layer's stream
  std::int64_t total_bytes() const { return layer_bytes * std::ssize(layers); }
};
// What outgoing_pages pins: pages that cannot be freed or reused (or written:
// they are shared while pinned) until release_outgoing(id).
struct OutgoingKV {
  std::int64_t id = 0;
  KVPageRuns runs;
};
// --- end of page transfer -------------------------------------------------------

class PagedKVCache {
 public:
  // config.device must be kCpu (Unsupported otherwise: a device cache needs
  // the constructor below).
  explicit PagedKVCache(const KVCacheConfig& config);
  // Device storage: the pages (one allocation for every layer, zeroed) come
  // from `backend`, whose device() must be config.device, and every byte of
  // K/V moves through it. Metadata, plans and the host tier stay in host
  // memory (the host tier from backend->allocate_host). Differences from a
  // kCpu cache:
  //   - attention / attention_with_fused_qkv take device pointers (q, k, v,
  //     out, lse, options.alibi_slopes and sinks); the step's table, slot
  //     mapping and positions are uploaded once per step, the backend plans
  //     once per step and options. RoPE (kNormal) rotates copies in the
  //     inputs' dtype (the CPU cache rotates f32 copies). rope_mode kInline
  //     is refused here (Unsupported). The work is enqueued on the
  //     backend's stream (CUDA: the one kv_device_backend was given): out
  //     and lse are written when the stream gets there.
  //   - layer_storage gives device pointers (no e4m3 NaN flags: a device
  //     cache keeps none; its kernels look for NaN codes themselves).
  //   - debug_get_kv / debug_set_kv and state_digest copy the pages they
  //     touch through host memory (slow: for tests and debugging).
  //   - page transfer (reserve_incoming, outgoing_pages) is refused
  //     (Unsupported): its byte views would be device memory, which needs
  //     CUDA-aware MPI, not served.
  // The backend may also refuse configs it cannot serve (Unsupported; the
  // CUDA one: kv_dtype float32). Null backend: InvalidArgument.
  PagedKVCache(const KVCacheConfig& config, std::shared_ptr<KVDeviceBackend> backend);
  ~PagedKVCache();
  PagedKVCache(PagedKVCache&&) noexcept;
  PagedKVCache& operator=(PagedKVCache&&) noexcept;
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;

  const KVCacheConfig& config() const;  // with num_pages and v_head_dim resolved

  // --- sequences -------------------------------------------------------------
  // Adds an empty sequence. InvalidArgument if `seq_id` exists.
  void add_sequence(SeqId seq_id);
  // Removes a sequence and returns its pages (shared ones lose a reference).
  void remove_sequence(SeqId seq_id);
  // Creates `child_id` holding the first `fork_pos` tokens of `parent_id`
  // (-1 = all of them). Full pages before the fork point are shared; a
  // partially filled page at the fork point is copied. Forks of forks nest
  // without limit. Forking a windowed sequence gives a child without a
  // window: it keeps the parent's sinks and gap (nothing more is dropped) and
  // cannot take a window or a token tree of its own.
  void fork_sequence(SeqId parent_id, SeqId child_id, std::int64_t fork_pos = -1);
  // Removes the last `n` tokens (speculative-decoding rollback). Pages shared
  // with other sequences are never modified: a later append copies first.
  void pop_n(SeqId seq_id, std::int64_t n);
  // TVM semantics: after every step the sequence keeps only its first
  // `attn_sink_size` tokens plus the most recent ones, `window_size` in total;
  // pages that fall out are released. Requires config.support_sliding_window,
  // 1 <= window_size and 0 <= attn_sink_size < window_size.
  void enable_sliding_window(SeqId seq_id, std::int64_t window_size, std::int64_t attn_sink_size);
  // Runs the call `op` describes (validated like that call); kTellTokens
  // also checks that the sequence was told exactly op.count tokens before.
  void apply(const SequenceOp& op);
  // Called after every successful call SequenceOp lists, on the calling
  // thread while the cache's lock is held (so it must not call this cache).
  // An empty function removes the observer. While one is set, page transfer
  // (reserve_incoming, outgoing_pages) is refused (Unsupported): its K/V
  // bytes arrive from outside, which no log can replay.
  void set_sequence_observer(SequenceObserver observer);

  // --- prefix caching (config.enable_prefix_caching) ---------------------------
  // A page's key hashes (parent page's key, cache_salt, its token ids); a hit
  // also compares the stored token ids and parent, so a hash collision can
  // never share pages of different content. Only full pages are cached, and a
  // cached page is never written (an append into it copies first).
  //
  // Dry run: the longest cached prefix of `token_ids` under `cache_salt`,
  // whole pages only and never all of token_ids (at least one token is left
  // to compute). All zeros with prefix caching off.
  PrefixMatch match_prefix(std::span<const std::int32_t> token_ids,
                           std::uint64_t cache_salt = 0) const;
  // Adds `seq_id` holding the tokens match_prefix(token_ids, cache_salt)
  // finds: device hits are shared (refcount + 1, no copy), host hits copied
  // into device pages. Returns the tokens held; the caller computes the rest.
  // OutOfPages (cache unchanged) if the hits need more pages than are free.
  // With prefix caching off: add_sequence, returns 0.
  std::int64_t add_sequence_with_prefix(SeqId seq_id, std::span<const std::int32_t> token_ids,
                                        std::uint64_t cache_salt = 0);
  // Tells the cache the token ids of tokens [0, token_ids.size()) of a
  // sequence (size <= its committed length); may be called again with a
  // longer prefix, whose start must equal what was told (InvalidArgument
  // otherwise). Every full page among them is published: other sequences can
  // match it at once. The salt is the one given to add_sequence_with_prefix
  // (0 for add_sequence; forks inherit it and the parent's told tokens).
  // Sequences with a sliding window (or a windowed parent's gap) are never
  // published: for them the call does nothing. InvalidState inside a step or
  // for a swapped sequence. No effect with prefix caching off.
  void set_sequence_tokens(SeqId seq_id, std::span<const std::int32_t> token_ids);
  // Evictable device pages holding a cached prefix (refcount 0). They count
  // as free in num_free_pages(): taking a page uses a free one first, then
  // evicts the least recently released cached page (demoting it to the host
  // tier when there is one, else dropping it).
  std::int64_t num_cached_pages() const;
  PrefixCacheStats prefix_cache_stats() const;
  // Drops every cached page nobody holds (device and host tier).
  // InvalidState inside a step.
  void reset_prefix_cache();

  // --- host tier: swapping (vLLM swap_blocks, for preemption) -------------------
  // Moves the pages of the listed sequences to the host tier: one host copy
  // per distinct device page (pages the listed sequences share stay shared;
  // a page also held by an unlisted sequence keeps its device copy). The
  // sequences stay, swapped: steps, fork, pop_n, windows, debug K/V access
  // and set_sequence_tokens refuse them (InvalidState) until swap_in;
  // sequence_pages lists host page ids. OutOfPages (unchanged) if the host
  // tier lacks room; InvalidState inside a step, without a host tier, or for
  // a sequence with an open token tree or already swapped.
  void swap_out(std::span<const SeqId> seq_ids);
  // Copies the listed swapped sequences back into device pages. OutOfPages
  // (unchanged) if fewer than swap_in_pages_needed are free.
  void swap_in(std::span<const SeqId> seq_ids);
  bool is_swapped(SeqId seq_id) const;
  // Device pages swap_in(seq_ids) takes (dry run; validates like swap_in).
  std::int64_t swap_in_pages_needed(std::span<const SeqId> seq_ids) const;
  // Free host pages: unused plus evictable cached ones.
  std::int64_t num_free_host_pages() const;
  std::int64_t num_host_pages() const;

  // --- steps -----------------------------------------------------------------
  // Reserves pages for `append_lengths[i]` new tokens of `seq_ids[i]` and
  // returns the step's plan. Lengths may be 0. OutOfPages if the pool cannot
  // hold them; the cache is then unchanged. InvalidState for a sequence with
  // an uncommitted token tree (see the token-tree overload below).
  const BatchPlan& begin_forward(std::span<const SeqId> seq_ids,
                                 std::span<const std::int64_t> append_lengths);
  // begin_forward (either overload) returning a copy of the plan made under
  // the cache's lock. For a cache shared by threads: the reference
  // begin_forward returns shows whatever step is open when it is read, so a
  // thread that ended this step and began another meanwhile would hand the
  // caller that step's plan and step_id.
  BatchPlan begin_forward_copy(std::span<const SeqId> seq_ids,
                               std::span<const std::int64_t> append_lengths);
  BatchPlan begin_forward_copy(std::span<const SeqId> seq_ids,
                               std::span<const std::int64_t> append_lengths,
                               std::span<const std::int64_t> token_tree_parents);
  // Speculative decoding (TVM): appends a forest of draft tokens per
  // sequence. token_tree_parents [sum of append_lengths], sequence after
  // sequence: the parent of each appended node as an index into the
  // sequence's uncommitted tree, -1 for a child of the committed prefix;
  // a parent index is below its node's. Node indices count the whole
  // uncommitted tree in the order appended, so a tree may grow over several
  // tree forwards before commit (each forward's nodes attend to the
  // committed prefix, their ancestors from any earlier forward, and
  // themselves). At most 256 uncommitted nodes per sequence. Positions (for
  // RoPE) are committed length + depth; K/V sit in node order after the
  // committed prefix. Every listed sequence (even with 0 tokens or a plain
  // chain) then has an open tree: until commit_accepted_token_tree_nodes it
  // is refused by the two-argument begin_forward, fork_sequence, pop_n and
  // enable_sliding_window (InvalidState). Sequences with a sliding window
  // cannot take trees. A chain attends exactly like ordinary causal decode.
  const BatchPlan& begin_forward(std::span<const SeqId> seq_ids,
                                 std::span<const std::int64_t> append_lengths,
                                 std::span<const std::int64_t> token_tree_parents);
  // Keeps, per sequence, the root-to-leaf path ending at leaf_indices[i]
  // (a node of its open tree; -1 rejects every node): the path's K/V move to
  // the positions right after the committed prefix (only rows whose slot
  // changes are copied, every layer), the other nodes are popped, and the
  // tree closes. InvalidState for a sequence without an open tree (e.g. a
  // second commit).
  void commit_accepted_token_tree_nodes(std::span<const SeqId> seq_ids,
                                        std::span<const std::int64_t> leaf_indices);
  // Uncommitted tree nodes of a sequence (0 when no tree is open).
  std::int64_t token_tree_size(SeqId seq_id) const;
  bool has_open_token_tree(SeqId seq_id) const;
  // Per-step calls take `step`, the step_id of the plan their caller's
  // begin_forward returned (copy it: the reference shows later steps too),
  // and refuse with InvalidState, changing nothing, when that step is no
  // longer the open one. kAnyStep skips the check (single-threaded callers).
  //
  // Ends the step: sliding windows drop the tokens that fell out.
  // InvalidState (the step stays open) when the step has new tokens and some
  // layer's K/V was not written for all of them - by attention /
  // attention_with_fused_qkv of that layer, by debug_set_kv covering every
  // new token, or by the caller itself (mark_layer_appended).
  void end_forward(StepId step = kAnyStep);
  // Abandons the step (e.g. the model threw half way): the cache returns to
  // exactly its state before begin_forward (state_digest() equal), the new
  // tokens, their pages and any open tree nodes of this forward are gone.
  // One exception: cached prefix pages the step evicted to take pages stay
  // evicted (their K/V may have been overwritten). InvalidState outside a step.
  void cancel_forward(StepId step = kAnyStep);
  // For callers that write the step's K/V themselves (append_paged_kv into
  // layer_storage(layer) through plan().slot_mapping): declares that every
  // new token of `layer` has been written, so end_forward accepts the step.
  // A caller that marks a layer it did not write exposes whatever its pages
  // held before - possibly another sequence's K/V.
  void mark_layer_appended(std::int32_t layer, StepId step = kAnyStep);

  // --- attention inside a step (the TVM protocol) -----------------------------
  // For `layer`: applies RoPE per config.rope_mode (to private copies; q and
  // k are never modified), appends the step's new K/V through the plan's
  // slot mapping, and attends over every sequence of the batch.
  //   q   [num_tokens][num_qo_heads][head_dim]   (num_tokens = plan().num_tokens())
  //   k   [num_tokens][num_kv_heads][head_dim]
  //   v   [num_tokens][num_kv_heads][v_head_dim]
  //   out [num_tokens][num_qo_heads][v_head_dim]
  //   lse [num_tokens][num_qo_heads] natural-log LSE, or null
  // options: scale (default 1/sqrt(head_dim)), causal, window_left, softcap,
  // ALiBi, sinks (options.key_rope is set by the cache). num_tokens >= 0 is
  // the row count the caller sized q, k, v and out for: InvalidState if the
  // step has another count (a caller that read plan() while another thread
  // could end the step); -1 trusts the plan. `step`: InvalidState unless it
  // is the open step (see end_forward) - the count alone cannot tell a
  // replacement step of the same size. Validates everything first: a failed
  // call changes nothing and the step stays usable. Marks `layer` as
  // appended for end_forward.
  void attention(std::int32_t layer, const HeadTensor& q, const HeadTensor& k, const HeadTensor& v,
                 const HeadTensor& out, const AttentionOptions& options = {}, float* lse = nullptr,
                 std::int64_t num_tokens = -1, StepId step = kAnyStep);
  // The same with q, k and v packed per token: qkv [num_tokens][Hq + 2 Hkv][head_dim]
  // (requires v_head_dim == head_dim). TVM: attention_with_fused_qkv.
  void attention_with_fused_qkv(std::int32_t layer, const HeadTensor& qkv, const HeadTensor& out,
                                const AttentionOptions& options = {}, float* lse = nullptr,
                                std::int64_t num_tokens = -1, StepId step = kAnyStep);
  bool in_forward() const;
  // The current step's plan (InvalidState outside a step).
  const BatchPlan& plan() const;
  // plan().num_tokens() by value: safe for threads that do not drive the
  // step (the reference plan() returns dies when another thread ends it).
  // InvalidState outside a step.
  std::int64_t num_step_tokens() const;
  // plan().step_id by value, likewise. InvalidState outside a step.
  StepId step_id() const;

  // --- queries (never mutate) ------------------------------------------------
  std::int64_t num_pages() const;
  std::int64_t num_free_pages() const;  // unused + evictable cached pages (what can be taken)
  std::int64_t num_sequences() const;
  bool has_sequence(SeqId seq_id) const;
  std::int64_t sequence_length(SeqId seq_id) const;  // tokens held (retained)
  // Tokens a sliding window has dropped from the sequence (a fork keeps its
  // parent's count). A retained token after the sinks that the plan numbers
  // p (plan().positions, TVM's numbering within the cache) is token
  // p + num_dropped_tokens of the whole sequence: a model whose RoPE must
  // see absolute positions (Mistral-style windows) adds it.
  std::int64_t num_dropped_tokens(SeqId seq_id) const;
  std::int64_t total_sequence_length() const;  // sum over sequences
  std::vector<SeqId> sequence_ids() const;     // sorted ascending
  // Pages a begin_forward with these arguments would take from the pool
  // (dry run; validates like begin_forward). can_append: it would succeed.
  std::int64_t pages_needed(std::span<const SeqId> seq_ids,
                            std::span<const std::int64_t> append_lengths) const;
  bool can_append(std::span<const SeqId> seq_ids,
                  std::span<const std::int64_t> append_lengths) const;
  // No sequences and every page free.
  bool empty() const;
  // Throws InternalError describing the first broken invariant: refcounts
  // equal references (device and host tier), pages with refcount 0 are
  // either free or cached in the LRU list (no duplicates), cached marks
  // agree with the prefix index, every index entry's key is the key of its
  // content and sits where its page map says, page-list sizes match lengths,
  // window bounds hold.
  void check_invariants() const;
  // 64-bit hash of all metadata (the prefix index, LRU order and host tier
  // included) and of the K/V bytes of every slot a sequence or the prefix
  // cache holds (dead slots past the end of a page's holders, e.g. rows of a
  // cancelled step, are not state: nothing can read them).
  std::uint64_t state_digest() const;

  // --- page transfer (disaggregated prefill/decode; TVM DisaggPrepareRecv /
  // DisaggMarkSend) ------------------------------------------------------------
  // Receiver: adds `seq_id` in a receiving state holding fresh pages for
  // `num_tokens` tokens (>= 1) and returns where the bytes go. Until
  // commit_incoming or cancel_incoming, every other call naming the sequence
  // (begin_forward, fork, pop_n, remove_sequence, debug K/V access,
  // outgoing_pages...) is refused with InvalidState. OutOfPages (cache
  // unchanged) when the pool cannot hold it.
  KVPageRuns reserve_incoming(SeqId seq_id, std::int64_t num_tokens);
  // The bytes have landed: the sequence becomes an ordinary one of length
  // num_tokens. cancel_incoming instead removes it and frees its pages.
  // Both: InvalidState for a sequence that is not receiving.
  void commit_incoming(SeqId seq_id);
  void cancel_incoming(SeqId seq_id);
  bool is_receiving(SeqId seq_id) const;
  // Sender: the runs of every token of `seq_id`, pinned (each page gains a
  // reference) until release_outgoing(id), so the sequence may be removed,
  // or appended to (copy-on-write), while its bytes are in flight. Refused
  // for a sequence with an open tree or a sliding-window gap, or while a
  // forward is in progress.
  OutgoingKV outgoing_pages(SeqId seq_id);
  void release_outgoing(std::int64_t outgoing_id);  // InvalidArgument if unknown
  std::int64_t num_outgoing() const;                // pins not yet released
  // --- end of page transfer -------------------------------------------------------

  // --- storage ----------------------------------------------------------------
  std::int64_t bytes_per_page() const;  // K+V bytes of one page over all layers
  std::int64_t storage_bytes() const;
  PagedKVStorage layer_storage(std::int32_t layer) const;
  // Page ids of a sequence in logical order, and its gap (see PagedKVTable).
  std::vector<std::int32_t> sequence_pages(SeqId seq_id) const;
  std::int32_t page_refcount(std::int32_t page) const;

  // Reads tokens [start, end) of a sequence as float, every layer:
  // k_out [num_layers][end-start][num_kv_heads][head_dim],
  // v_out [num_layers][end-start][num_kv_heads][v_head_dim].
  // Inside a step, a new token of a layer not yet written reads as zeros
  // (its slot may still hold a previous owner's K/V).
  void debug_get_kv(SeqId seq_id, std::int64_t start, std::int64_t end, std::span<float> k_out,
                    std::span<float> v_out) const;
  // (MLA: v_out gets the latent, the head of each K row.)
  // Writes the same shapes (rounded to the storage dtype); MLA takes an empty
  // v_in. Tokens in pages shared with another sequence are refused
  // (InvalidArgument). Inside a step, the step's new tokens it writes count as
  // written in every layer.
  void debug_set_kv(SeqId seq_id, std::int64_t start, std::int64_t end, std::span<const float> k_in,
                    std::span<const float> v_in);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn
