// The private state of PagedKVCache, shared by its implementation files.
#pragma once

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "config.h"
#include "host_pool.h"
#include "page_pool.h"
#include "page_storage.h"
#include "pagedattn/kv_cache.h"
#include "prefix_index.h"
#include "sequence.h"
#include "step_attention.h"

namespace pagedattn {

inline constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();

// What begin_forward changed, so that cancel_forward can undo it exactly,
// and which K/V of the step's new tokens has been written so far.
struct StepRecord {
  // What begin_forward changes in a listed sequence: it only grows the
  // length, the page list and the open tree, and may replace the last page
  // by a copy (copy-on-write).
  struct SeqBefore {
    SeqId id = 0;
    std::int64_t length = 0;
    std::size_t num_pages = 0;
    std::int32_t cow_page = -1;  // the shared last page a copy replaced, or -1
    std::size_t tree_size = 0;
    bool tree_open = false;
    // cow_page was cached and held only by this sequence: its release waits
    // for end_forward (so no take of this step can reclaim it before undo).
    bool cow_deferred = false;
  };
  std::vector<SeqBefore> seqs_before;  // [batch_size]
  std::vector<std::int32_t> taken;     // pages taken from the pool, in order
  std::vector<std::int32_t> deferred;  // cow_deferred pages, released by end_forward
  std::vector<char> layer_appended;    // [num_layers] every new token written
  std::vector<char> token_written;     // [num_tokens] every layer written (debug_set_kv)
  std::int64_t tokens_written = 0;     // count of token_written set

  void reset(std::int32_t num_layers, std::int32_t num_tokens) {
    seqs_before.clear();
    taken.clear();
    deferred.clear();
    layer_appended.assign(static_cast<std::size_t>(num_layers), 0);
    token_written.assign(static_cast<std::size_t>(num_tokens), 0);
    tokens_written = 0;
  }
  bool all_tokens_written() const { return tokens_written == std::ssize(token_written); }
  // The first layer whose K/V the step has not fully written, or -1.
  std::int32_t first_unwritten_layer() const {
    if (all_tokens_written()) return -1;
    for (std::size_t l = 0; l < layer_appended.size(); ++l)
      if (!layer_appended[l]) return static_cast<std::int32_t>(l);
    return -1;
  }
};

struct PagedKVCache::State {
  // `c` resolved; `device_backend` null for a CPU cache.
  State(const KVCacheConfig& c, std::shared_ptr<KVDeviceBackend> device_backend)
      : config(c),
        backend(std::move(device_backend)),
        pool(c.num_pages),
        storage(c, backend ? cache::StorageKind::kDevice : cache::StorageKind::kHost, backend),
        index(c.num_pages, c.host_num_pages),
        host(c.host_num_pages > 0 ? std::make_unique<cache::HostTier>(c, backend) : nullptr) {
    if (backend) attention.device = std::make_unique<cache::DeviceStep>(backend);
  }

  // Every public call holds this for its whole duration (the threading
  // contract in kv_cache.h). Implementation functions never lock.
  mutable std::mutex mutex;
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mutex); }

  KVCacheConfig config;
  std::shared_ptr<KVDeviceBackend> backend;  // device caches only
  SequenceObserver observer;                 // may be empty
  void notify(const SequenceOp& op) const {
    if (observer) observer(op);
  }
  // Notifies a call with the sequence ids and values given (only built
  // when someone observes).
  void notify_list(SequenceOp::Kind kind, std::span<const SeqId> ids,
                   std::span<const std::int64_t> values) const {
    if (!observer) return;
    SequenceOp op{.kind = kind};
    op.seq_ids.assign(ids.begin(), ids.end());
    op.values.assign(values.begin(), values.end());
    observer(op);
  }
  // Page transfer has no log entry (its bytes come from outside).
  void require_unobserved(const char* call) const {
    require<Unsupported>(!observer, "PagedKVCache::", call,
                         ": not available while a sequence observer is set (tensor "
                         "parallelism): the transferred K/V cannot be replayed on a replica");
  }
  cache::PagePool pool;
  cache::PageStorage storage;
  std::unordered_map<SeqId, cache::Sequence> seqs;
  BatchPlan plan;
  bool in_forward = false;
  StepId last_step_id = kAnyStep;         // plan.step_id of the latest step begun
  StepRecord step;                        // valid while in_forward
  cache::StepAttention attention;         // kernel plan and buffers for attention()
  cache::PrefixIndex index;               // cached full pages (prefix caching)
  std::unique_ptr<cache::HostTier> host;  // null without a host tier
  PrefixCacheStats stats;
  // Page transfer: pages pinned by outgoing_pages, by pin id.
  std::unordered_map<std::int64_t, std::vector<std::int32_t>> outgoing;
  std::int64_t next_outgoing_id = 1;

  std::int32_t page_size() const { return config.page_size; }
  bool caching() const { return config.enable_prefix_caching; }

  const cache::Sequence& find(SeqId id, const char* call, const char* arg) const {
    auto it = seqs.find(id);
    if (it == seqs.end())
      throw InvalidArgument(
          detail::concat("PagedKVCache::", call, ": ", arg, " = ", id, " does not exist"));
    return it->second;
  }
  cache::Sequence& find(SeqId id, const char* call, const char* arg) {
    return const_cast<cache::Sequence&>(std::as_const(*this).find(id, call, arg));
  }
  // A per-step call's check: a step is open and it is `step_id` (unless
  // kAnyStep). A caller holding the id of a step another thread ended must
  // not act on the step that replaced it, whatever its size.
  void require_step(StepId step_id, const char* call) const {
    if (!in_forward)
      throw InvalidState(detail::concat("PagedKVCache::", call, ": no forward is in progress",
                                        step_id == kAnyStep
                                            ? std::string(" (call begin_forward first)")
                                            : detail::concat(" (step = ", step_id, " has ended)")));
    require<InvalidState>(step_id == kAnyStep || step_id == plan.step_id, "PagedKVCache::", call,
                          ": step = ", step_id, " is not the open step (step_id ", plan.step_id,
                          "): another thread ended it and began another");
  }
  // Refuses calls a device cache does not serve.
  void require_host_storage(const char* call, const char* why) const {
    require<Unsupported>(backend == nullptr, "PagedKVCache::", call,
                         ": not served on a device cache (KVCacheConfig.device = ",
                         cache::device_name(config.device), "): ", why);
  }
  void require_no_forward(const char* call) const {
    require<InvalidState>(!in_forward, "PagedKVCache::", call,
                          ": not allowed while a forward is in progress (call end_forward first)");
  }
  void require_not_swapped(const cache::Sequence& s, SeqId id, const char* call) const {
    require<InvalidState>(!s.swapped, "PagedKVCache::", call, ": seq_id = ", id,
                          " is swapped out to the host tier; call swap_in first");
  }
  void require_free_pages(std::int64_t needed, const char* call) const {
    if (needed > pool.num_free())
      throw OutOfPages(detail::concat("PagedKVCache::", call, ": needs ", needed, " free pages, ",
                                      pool.num_free(), " of ", pool.num_pages(), " are free"));
  }

  // Pages appending `n` tokens to `s` takes from the pool, including a
  // copy-on-write of a partially filled last page that is shared.
  // `released` counts, per page, the references that copy-on-writes of
  // earlier sequences of the same batch drop (a page they leave to a single
  // holder is then written in place); it is updated for this sequence.
  std::int64_t append_cost(const cache::Sequence& s, std::int64_t n,
                           std::unordered_map<std::int32_t, std::int32_t>& released) const {
    if (n == 0) return 0;
    const std::int64_t grow =
        cache::pages_for_slots(s.used_slots() + n, page_size()) - std::ssize(s.pages);
    if (s.used_slots() % page_size() == 0) return grow;
    const std::int32_t last = s.pages.back();
    if (pool.is_cached(last)) return grow + 1;  // cached pages are never written
    auto it = released.find(last);
    const std::int32_t dropped = it == released.end() ? 0 : it->second;
    if (pool.refcount(last) - dropped <= 1) return grow;
    ++released[last];
    return grow + 1;
  }
  bool needs_copy_on_write(const cache::Sequence& s) const {
    const std::int32_t last = s.pages.empty() ? -1 : s.pages.back();
    return s.used_slots() % page_size() != 0 && (pool.is_shared(last) || pool.is_cached(last));
  }

  // --- page supply, prefix cache, host tier (kv_cache_prefix.cc) ------------
  // Takes a device page: an unused one, else the oldest evictable cached
  // page (demoted to the host tier when it has room, else dropped).
  // Precondition: pool.num_free() > 0. Its e4m3 NaN flags start clear.
  std::int32_t take_page();
  // Makes an unused device page out of the oldest evictable cached one.
  void evict_oldest_cached_page();
  // Takes a host page likewise (the oldest cached host page is dropped).
  // Precondition: host && host->pool.num_free() > 0.
  std::int32_t take_host_page();
  // Releases every page of `s` (host pages if swapped); with prefix caching
  // last page first, so that a prefix's later pages are evicted before its
  // first ones (a prefix is matched from its first page).
  void release_pages(const cache::Sequence& s);
  // Publishes the full told pages of `s` not yet linked.
  void publish_told_pages(cache::Sequence& s);
  // set_sequence_tokens without the lock.
  void set_tokens(SeqId seq_id, std::span<const std::int32_t> token_ids);
  // Serials of the cached pages a new sequence with these tokens would share.
  std::vector<std::uint64_t> match(std::span<const std::int32_t> tokens, std::uint64_t salt) const;
  PrefixMatch summarize(const std::vector<std::uint64_t>& hits) const;
  // Gives a new sequence the pages of `hits` (validated: enough free pages).
  void hold_hits(const std::vector<std::uint64_t>& hits, cache::Sequence& s);
  // Device / host pages the listed swapped sequences hold, each once, in order.
  std::vector<std::int32_t> distinct_pages(std::span<const SeqId> ids) const;
  void validate_swap(std::span<const SeqId> ids, bool swapped, const char* call) const;

  // Checks a forward's arguments and returns the pages it takes. A
  // non-tree forward (`tree` false) refuses sequences with an open tree
  // unless `dry_run` (pages_needed / can_append only count pages).
  std::int64_t validate_forward(std::span<const SeqId> ids, std::span<const std::int64_t> lens,
                                const char* call, bool tree = false, bool dry_run = false) const;
  void require_unique_ids(std::span<const SeqId> ids, const char* call) const;
  // token_tree_parents of a tree forward (kv_cache_tree.cc).
  void validate_tree_parents(std::span<const SeqId> ids, std::span<const std::int64_t> lens,
                             std::span<const std::int64_t> parents) const;
  // begin_forward without the lock (tree: with token_tree_parents).
  void begin(std::span<const SeqId> ids, std::span<const std::int64_t> lens);
  void begin_tree(std::span<const SeqId> ids, std::span<const std::int64_t> lens,
                  std::span<const std::int64_t> parents);
  void start_step(std::span<const std::int64_t> lens);
  // Fills the plan for a validated forward; `parents` only for tree forwards.
  void build_plan(std::span<const SeqId> ids, std::span<const std::int64_t> lens, bool tree,
                  std::span<const std::int64_t> parents);
  void append_to_plan(cache::Sequence& s, std::int64_t n);
  // Grows s's open tree by the appended nodes and writes their positions and
  // (unless the whole tree is a chain) mask intervals to the plan.
  void append_tree_to_plan(cache::Sequence& s, std::span<const std::int64_t> parents);
  // Moves the accepted path's K/V after the committed prefix, pops the rest
  // and closes the tree (leaf -1: pops every node).
  void commit_tree_path(cache::Sequence& s, std::int32_t leaf);
  // Refuses calls on a sequence whose K/V is still being received.
  void require_not_receiving(const cache::Sequence& s, SeqId id, const char* call) const {
    require<InvalidState>(!s.receiving, "PagedKVCache::", call, ": seq_id = ", id,
                          " is still receiving its K/V (call commit_incoming or cancel_incoming "
                          "first)");
  }
  // Refuses calls that would break a sequence's open token tree.
  void require_no_open_tree(const cache::Sequence& s, SeqId id, const char* call) const;
  // The plan's index of `id` and the step's first new token of it, or -1.
  std::int32_t plan_index(SeqId id) const;
  // PagedKVCache::attention without the lock.
  void attend(std::int32_t layer, const HeadTensor& q, const HeadTensor& k, const HeadTensor& v,
              const HeadTensor& out, const AttentionOptions& options, float* lse,
              std::int64_t num_tokens, StepId step_id);
  // attend's device path (cache_attention.cc): `p` validated, with the
  // plan's host table.
  void attend_on_device(AttentionParams p, const HeadTensor& k, const HeadTensor& v);
  // Returns the cache to its state before begin_forward.
  void undo_step();
  std::uint64_t digest() const;
  void release_tail(cache::Sequence& s);
  void slide_window(cache::Sequence& s);
};

}  // namespace pagedattn
