// PagedKVCache: every public mutation first validates (const, may throw),
// then applies (no validation failures possible past that point).
#include "pagedattn/kv_cache.h"

#include <algorithm>

#include "config.h"
#include "kernels/nan_flags.h"
#include "kv_cache_state.h"

namespace pagedattn {

using cache::Sequence;
using detail::concat;

namespace {

KVCacheConfig resolve_cpu_config(const KVCacheConfig& config) {
  KVCacheConfig c = cache::resolve_config(config);
  require<Unsupported>(c.device == KVDevice::kCpu, "PagedKVCache(config): KVCacheConfig.device = ",
                       cache::device_name(c.device),
                       " needs a backend for its pages: construct the cache with "
                       "PagedKVCache(config, backend) (pagedattn::cuda::kv_device_backend() for "
                       "CUDA)");
  return c;
}

// Everything a device cache needs checked before the backend allocates.
KVCacheConfig resolve_device_config(const KVCacheConfig& config, const KVDeviceBackend* backend) {
  KVCacheConfig c = cache::resolve_config(config);
  require(backend != nullptr, "PagedKVCache(config, backend): backend is null");
  require(c.device != KVDevice::kCpu,
          "PagedKVCache(config, backend): KVCacheConfig.device = cpu, but a backend serves device "
          "caches only (construct a CPU cache with PagedKVCache(config))");
  require(backend->device() == c.device,
          "PagedKVCache(config, backend): KVCacheConfig.device = ", cache::device_name(c.device),
          " but the backend serves ", cache::device_name(backend->device()));
  require<Unsupported>(c.rope_mode != RopeMode::kInline,
                       "PagedKVCache(config, backend): KVCacheConfig.rope_mode = kInline (keys "
                       "rotated inside attention) is not served on a device cache; use kNormal "
                       "(keys stored rotated)");
  backend->check_config(c);
  return c;
}

}  // namespace

PagedKVCache::PagedKVCache(const KVCacheConfig& config)
    : state_(std::make_unique<State>(resolve_cpu_config(config), nullptr)) {}
PagedKVCache::PagedKVCache(const KVCacheConfig& config, std::shared_ptr<KVDeviceBackend> backend)
    : state_(std::make_unique<State>(resolve_device_config(config, backend.get()),
                                     std::move(backend))) {}
PagedKVCache::~PagedKVCache() = default;
PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;

const KVCacheConfig& PagedKVCache::config() const {
  return state_->config;
}

// --- sequences ---------------------------------------------------------------

void PagedKVCache::add_sequence(SeqId seq_id) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("add_sequence");
  require(!st.seqs.contains(seq_id), "PagedKVCache::add_sequence: seq_id = ", seq_id,
          " already exists");
  st.seqs.emplace(seq_id, Sequence{});
  st.notify({SequenceOp::Kind::kAdd, seq_id});
}

void PagedKVCache::remove_sequence(SeqId seq_id) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("remove_sequence");
  Sequence& s = st.find(seq_id, "remove_sequence", "seq_id");
  st.require_not_receiving(s, seq_id, "remove_sequence");
  st.release_pages(s);
  st.seqs.erase(seq_id);
  st.notify({SequenceOp::Kind::kRemove, seq_id});
}

void PagedKVCache::fork_sequence(SeqId parent_id, SeqId child_id, std::int64_t fork_pos) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("fork_sequence");
  const Sequence& parent = st.find(parent_id, "fork_sequence", "parent_id");
  st.require_not_receiving(parent, parent_id, "fork_sequence");
  require(!st.seqs.contains(child_id), "PagedKVCache::fork_sequence: child_id = ", child_id,
          " already exists");
  st.require_no_open_tree(parent, parent_id, "fork_sequence");
  st.require_not_swapped(parent, parent_id, "fork_sequence");
  if (fork_pos == -1) fork_pos = parent.length;
  require(fork_pos >= 0 && fork_pos <= parent.length,
          "PagedKVCache::fork_sequence: fork_pos = ", fork_pos, " is outside [0, ", parent.length,
          "] (length of parent_id = ", parent_id, "; -1 means the whole parent)");
  // A child of a windowed parent has no window; past the sinks it keeps the
  // parent's gap (frozen: nothing more is evicted) so the shared pages line up.
  Sequence child;
  child.length = fork_pos;
  if (parent.evicted > 0 && fork_pos > parent.sink_len) {
    child.sink_len = parent.sink_len;
    child.gap_len = parent.gap_len;
    child.evicted = parent.evicted;
  }
  if (child.prefix_trackable()) {  // told tokens up to the fork point
    child.salt = parent.salt;
    child.tokens.assign(parent.tokens.begin(),
                        parent.tokens.begin() + std::min(std::ssize(parent.tokens), fork_pos));
    child.chain.assign(parent.chain.begin(),
                       parent.chain.begin() + std::ssize(child.tokens) / st.page_size());
  }
  const std::int64_t shared_pages = child.used_slots() / st.page_size();
  const auto partial_slots = static_cast<std::int32_t>(child.used_slots() % st.page_size());
  st.require_free_pages(partial_slots > 0 ? 1 : 0, "fork_sequence");

  child.pages.reserve(static_cast<std::size_t>(shared_pages + 1));
  child.pages.assign(parent.pages.begin(), parent.pages.begin() + shared_pages);
  st.seqs.reserve(st.seqs.size() + 1);
  for (std::int32_t page : child.pages) st.pool.retain(page);
  if (partial_slots > 0) {
    const std::int32_t copy = st.take_page();
    st.storage.copy_page_prefix(parent.pages[shared_pages], copy, partial_slots);
    child.pages.push_back(copy);
  }
  st.seqs.emplace(child_id, std::move(child));
  st.notify({SequenceOp::Kind::kFork, child_id, parent_id, fork_pos});
}

void PagedKVCache::pop_n(SeqId seq_id, std::int64_t n) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("pop_n");
  Sequence& s = st.find(seq_id, "pop_n", "seq_id");
  st.require_not_receiving(s, seq_id, "pop_n");
  st.require_no_open_tree(s, seq_id, "pop_n");
  st.require_not_swapped(s, seq_id, "pop_n");
  require(n >= 0 && n <= s.poppable(), "PagedKVCache::pop_n: n = ", n, " is outside [0, ",
          s.poppable(), "] for seq_id = ", seq_id, " (length ", s.length,
          s.evicted > 0 ? "; attention sinks cannot be popped" : "", ")");
  s.length -= n;
  if (s.evicted > 0 && s.length == s.sink_len) s.gap_len = 0;  // nothing after the gap
  s.truncate_tokens(s.length, st.page_size());
  st.release_tail(s);
  st.notify({SequenceOp::Kind::kPopN, seq_id, 0, n});
}

void PagedKVCache::enable_sliding_window(SeqId seq_id, std::int64_t window_size,
                                         std::int64_t attn_sink_size) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward("enable_sliding_window");
  Sequence& s = st.find(seq_id, "enable_sliding_window", "seq_id");
  st.require_not_receiving(s, seq_id, "enable_sliding_window");
  require(st.config.support_sliding_window,
          "PagedKVCache::enable_sliding_window: the cache was "
          "built with KVCacheConfig.support_sliding_window = false");
  require(!s.windowed(), "PagedKVCache::enable_sliding_window: seq_id = ", seq_id,
          " already has a sliding window (window_size ", s.window_size, ")");
  require(s.evicted == 0, "PagedKVCache::enable_sliding_window: seq_id = ", seq_id,
          " was forked from a windowed sequence after it dropped ", s.evicted,
          " tokens; a new window on top of that gap is not supported");
  st.require_no_open_tree(s, seq_id, "enable_sliding_window");
  st.require_not_swapped(s, seq_id, "enable_sliding_window");
  require(window_size >= 1 && window_size <= kMaxInt32,
          "PagedKVCache::enable_sliding_window: window_size = ", window_size,
          " must be in [1, 2^31)");
  require(attn_sink_size >= 0 && attn_sink_size < window_size,
          "PagedKVCache::enable_sliding_window: attn_sink_size = ", attn_sink_size,
          " must be in [0, window_size = ", window_size, ")");
  s.window_size = window_size;
  s.sink_len = attn_sink_size;
  s.truncate_tokens(0, st.page_size());  // windowed sequences are not published
  st.slide_window(s);
  st.notify({SequenceOp::Kind::kSlidingWindow, seq_id, 0, window_size, attn_sink_size});
}

void PagedKVCache::apply(const SequenceOp& op) {
  switch (op.kind) {
    case SequenceOp::Kind::kAdd:
      return add_sequence(op.seq_id);
    case SequenceOp::Kind::kRemove:
      return remove_sequence(op.seq_id);
    case SequenceOp::Kind::kFork:
      return fork_sequence(op.parent_id, op.seq_id, op.count);
    case SequenceOp::Kind::kPopN:
      return pop_n(op.seq_id, op.count);
    case SequenceOp::Kind::kSlidingWindow:
      return enable_sliding_window(op.seq_id, op.count, op.sink_size);
    case SequenceOp::Kind::kAddWithPrefix: {
      // The logged call's result (count) must be this cache's too.
      const std::int64_t hit = match_prefix(op.token_ids, op.salt).num_tokens;
      require(hit == op.count, "PagedKVCache::apply: op.count = ", op.count,
              " prefix tokens taken by the logged add_sequence_with_prefix of seq_id = ", op.seq_id,
              ", this cache would take ", hit, " (the caches have diverged)");
      add_sequence_with_prefix(op.seq_id, op.token_ids, op.salt);
      return;
    }
    case SequenceOp::Kind::kTellTokens: {
      // set_sequence_tokens with the tokens told before and the logged new ones.
      State& st = *state_;
      const auto lock = st.lock();
      const Sequence& s = st.find(op.seq_id, "apply", "op.seq_id");
      require(op.count == std::ssize(s.tokens), "PagedKVCache::apply: op.count = ", op.count,
              " tokens told before the logged set_sequence_tokens of seq_id = ", op.seq_id,
              ", this cache was told ", s.tokens.size(), " (the caches have diverged)");
      std::vector<std::int32_t> told = s.tokens;
      told.insert(told.end(), op.token_ids.begin(), op.token_ids.end());
      st.set_tokens(op.seq_id, told);
      return;
    }
    case SequenceOp::Kind::kResetPrefixCache:
      return reset_prefix_cache();
    case SequenceOp::Kind::kSwapOut:
      return swap_out(op.seq_ids);
    case SequenceOp::Kind::kSwapIn:
      return swap_in(op.seq_ids);
    case SequenceOp::Kind::kBeginForward:
      require(op.count == 0 || op.count == 1, "PagedKVCache::apply: op.count = ", op.count,
              " of a kBeginForward must be 0 (no tree) or 1 (tree_parents apply)");
      if (op.count == 1)
        begin_forward(op.seq_ids, op.values, op.tree_parents);
      else
        begin_forward(op.seq_ids, op.values);
      return;
    case SequenceOp::Kind::kEndForward:
      return end_forward();
    case SequenceOp::Kind::kCancelForward:
      return cancel_forward();
    case SequenceOp::Kind::kCommitTree:
      return commit_accepted_token_tree_nodes(op.seq_ids, op.values);
  }
  throw InvalidArgument(detail::concat("PagedKVCache::apply: op.kind = ", static_cast<int>(op.kind),
                                       " is not a SequenceOp::Kind"));
}

void PagedKVCache::set_sequence_observer(SequenceObserver observer) {
  State& st = *state_;
  const auto lock = st.lock();
  // Pins of outgoing pages hold pages the log cannot describe.
  require<Unsupported>(!observer || st.outgoing.empty(),
                       "PagedKVCache::set_sequence_observer: ", st.outgoing.size(),
                       " outgoing page pins are not released (page transfer is not logged)");
  for (const auto& [id, s] : st.seqs)
    require<Unsupported>(!observer || !s.receiving,
                         "PagedKVCache::set_sequence_observer: seq_id = ", id,
                         " is receiving K/V (page transfer is not logged)");
  st.observer = std::move(observer);
}

void PagedKVCache::State::release_tail(Sequence& s) {
  const std::int64_t keep = cache::pages_for_slots(s.used_slots(), page_size());
  for (std::int64_t p = keep; p < std::ssize(s.pages); ++p) pool.release(s.pages[p]);
  s.pages.resize(static_cast<std::size_t>(keep));
}

void PagedKVCache::State::slide_window(Sequence& s) {
  const cache::WindowTrim trim = cache::plan_window_trim(s, page_size());
  if (trim.evict == 0) return;
  const auto first = s.pages.begin() + trim.first_page;
  for (auto it = first; it != first + trim.num_pages; ++it) pool.release(*it);
  s.pages.erase(first, first + trim.num_pages);
  s.length -= trim.evict;
  s.evicted += trim.evict;
  s.gap_len += trim.evict - trim.num_pages * page_size();
}

// --- steps -------------------------------------------------------------------

void PagedKVCache::State::require_unique_ids(std::span<const SeqId> ids, const char* call) const {
  std::vector<SeqId> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  require(dup == sorted.end(), "PagedKVCache::", call,
          ": seq_ids lists seq_id = ", dup == sorted.end() ? 0 : *dup, " more than once");
}

void PagedKVCache::State::require_no_open_tree(const Sequence& s, SeqId id,
                                               const char* call) const {
  require<InvalidState>(!s.tree_open, "PagedKVCache::", call, ": seq_id = ", id,
                        " has an uncommitted token tree (", s.tree_size(),
                        " nodes); call commit_accepted_token_tree_nodes first");
}

std::int64_t PagedKVCache::State::validate_forward(std::span<const SeqId> ids,
                                                   std::span<const std::int64_t> lens,
                                                   const char* call, bool tree,
                                                   bool dry_run) const {
  require(ids.size() == lens.size(), "PagedKVCache::", call, ": seq_ids has ", ids.size(),
          " entries but append_lengths has ", lens.size());
  require_unique_ids(ids, call);
  std::int64_t tokens = 0, pages = 0, page_entries = 0;
  std::unordered_map<std::int32_t, std::int32_t> released;  // see append_cost
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = seqs.find(ids[i]);
    require(it != seqs.end(), "PagedKVCache::", call, ": seq_ids[", i, "] = ", ids[i],
            " does not exist");
    const Sequence& s = it->second;
    require<InvalidState>(!s.swapped, "PagedKVCache::", call, ": seq_ids[", i, "] = ", ids[i],
                          " is swapped out to the host tier; call swap_in first");
    require_not_receiving(s, ids[i], call);
    if (!tree && !dry_run)
      require<InvalidState>(!s.tree_open, "PagedKVCache::", call, ": seq_ids[", i, "] = ", ids[i],
                            " has an uncommitted token tree (", s.tree_size(),
                            " nodes): pass token_tree_parents, or call "
                            "commit_accepted_token_tree_nodes first");
    require(lens[i] >= 0 && lens[i] <= kMaxInt32 - s.used_slots(), "PagedKVCache::", call,
            ": append_lengths[", i, "] = ", lens[i], " for seq_id = ", ids[i],
            " must be >= 0 and keep the sequence under 2^31 tokens");
    tokens += lens[i];
    require(tokens <= kMaxInt32, "PagedKVCache::", call, ": the batch appends ", tokens,
            " tokens, more than 2^31 - 1");
    const std::int64_t cost = append_cost(s, lens[i], released);
    pages += cost;
    page_entries += std::ssize(s.pages) + cost;
  }
  require(page_entries <= kMaxInt32, "PagedKVCache::", call, ": the batch's page table has ",
          page_entries, " entries, more than 2^31 - 1");
  return pages;
}

std::int64_t PagedKVCache::pages_needed(std::span<const SeqId> seq_ids,
                                        std::span<const std::int64_t> append_lengths) const {
  const auto lock = state_->lock();
  return state_->validate_forward(seq_ids, append_lengths, "pages_needed", false, true);
}

bool PagedKVCache::can_append(std::span<const SeqId> seq_ids,
                              std::span<const std::int64_t> append_lengths) const {
  const auto lock = state_->lock();
  return state_->validate_forward(seq_ids, append_lengths, "can_append", false, true) <=
         state_->pool.num_free();
}

const BatchPlan& PagedKVCache::begin_forward(std::span<const SeqId> seq_ids,
                                             std::span<const std::int64_t> append_lengths) {
  const auto lock = state_->lock();
  state_->begin(seq_ids, append_lengths);
  return state_->plan;
}

BatchPlan PagedKVCache::begin_forward_copy(std::span<const SeqId> seq_ids,
                                           std::span<const std::int64_t> append_lengths) {
  const auto lock = state_->lock();
  state_->begin(seq_ids, append_lengths);
  return state_->plan;
}

void PagedKVCache::State::begin(std::span<const SeqId> ids, std::span<const std::int64_t> lens) {
  require_no_forward("begin_forward");
  require_free_pages(validate_forward(ids, lens, "begin_forward"), "begin_forward");
  start_step(lens);
  build_plan(ids, lens, false, {});
  notify_list(SequenceOp::Kind::kBeginForward, ids, lens);
}

void PagedKVCache::State::build_plan(std::span<const SeqId> ids, std::span<const std::int64_t> lens,
                                     bool tree, std::span<const std::int64_t> parents) {
  plan.seq_ids.assign(ids.begin(), ids.end());
  plan.page_size = page_size();
  plan.has_gaps = false;
  plan.has_tree = false;
  for (auto* v :
       {&plan.qo_indptr, &plan.kv_indptr, &plan.kv_indices, &plan.kv_last_page_len, &plan.kv_lens,
        &plan.kv_sink_lens, &plan.kv_gap_lens, &plan.positions, &plan.tree_begin,
        &plan.tree_node_indptr, &plan.tree_enter, &plan.tree_exit, &plan.tree_positions})
    v->clear();
  plan.slot_mapping.clear();
  plan.qo_indptr.push_back(0);
  plan.kv_indptr.push_back(0);
  plan.tree_node_indptr.push_back(0);
  attention.invalidate_plan();
  std::size_t first_parent = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    Sequence& s = seqs.find(ids[i])->second;
    step.seqs_before.push_back({ids[i], s.length, s.pages.size(), -1,
                                static_cast<std::size_t>(s.tree_size()), s.tree_open});
    append_to_plan(s, lens[i]);
    if (!tree) continue;
    append_tree_to_plan(s, parents.subspan(first_parent, static_cast<std::size_t>(lens[i])));
    first_parent += static_cast<std::size_t>(lens[i]);
  }
  in_forward = true;
}

// Resets the step's record and write tracking and numbers the step; called
// by both begin_forward overloads after validation (a refused begin_forward
// uses no id), before build_plan (which fills the record).
void PagedKVCache::State::start_step(std::span<const std::int64_t> lens) {
  std::int64_t tokens = 0;
  for (std::int64_t n : lens) tokens += n;
  step.reset(config.num_layers, static_cast<std::int32_t>(tokens));
  plan.step_id = ++last_step_id;
}

// Reserves pages for `n` new tokens of `s` (copy-on-write first if its
// partial last page is shared) and appends its rows to the plan.
void PagedKVCache::State::append_to_plan(Sequence& s, std::int64_t n) {
  const std::int32_t ps = page_size();
  if (n > 0 && needs_copy_on_write(s)) {
    const std::int32_t copy = take_page();
    step.taken.push_back(copy);
    const std::int32_t old = s.pages.back();
    storage.copy_page_prefix(old, copy, static_cast<std::int32_t>(s.used_slots() % ps));
    StepRecord::SeqBefore& before = step.seqs_before.back();
    before.cow_page = old;
    before.cow_deferred = pool.refcount(old) == 1;  // a cached page only this sequence held
    if (before.cow_deferred)
      step.deferred.push_back(old);
    else
      pool.release(old);
    s.pages.back() = copy;
  }
  const std::int64_t first_slot = s.used_slots();
  s.length += n;
  while (std::ssize(s.pages) < cache::pages_for_slots(s.used_slots(), ps)) {
    s.pages.push_back(take_page());
    step.taken.push_back(s.pages.back());
  }

  // Positions and slot mapping, filled one page run at a time (no division
  // per token: prefill plans are dominated by this loop).
  const std::size_t base = plan.positions.size();
  plan.positions.resize(base + static_cast<std::size_t>(n));
  plan.slot_mapping.resize(base + static_cast<std::size_t>(n));
  std::int32_t* pos = plan.positions.data() + base;
  std::int64_t* map = plan.slot_mapping.data() + base;
  const auto first_pos = static_cast<std::int32_t>(s.length - n);
  for (std::int64_t t = 0; t < n; ++t) pos[t] = first_pos + static_cast<std::int32_t>(t);
  for (std::int64_t t = 0, slot = first_slot; t < n;) {
    const std::int64_t off = slot % ps;
    const std::int64_t run = std::min<std::int64_t>(ps - off, n - t);
    const std::int64_t start = std::int64_t{s.pages[slot / ps]} * ps + off;
    for (std::int64_t r = 0; r < run; ++r) map[t + r] = start + r;
    t += run;
    slot += run;
  }
  plan.qo_indptr.push_back(plan.qo_indptr.back() + static_cast<std::int32_t>(n));
  plan.kv_indices.insert(plan.kv_indices.end(), s.pages.begin(), s.pages.end());
  plan.kv_indptr.push_back(static_cast<std::int32_t>(plan.kv_indices.size()));
  const std::int64_t used = s.used_slots();
  plan.kv_last_page_len.push_back(
      static_cast<std::int32_t>(used == 0 ? 0 : used - (std::ssize(s.pages) - 1) * ps));
  plan.kv_lens.push_back(static_cast<std::int32_t>(s.length));
  plan.kv_sink_lens.push_back(static_cast<std::int32_t>(s.sink_len));
  plan.kv_gap_lens.push_back(static_cast<std::int32_t>(s.gap_len));
  plan.has_gaps |= s.gap_len != 0;
}

void PagedKVCache::end_forward(StepId step) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_step(step, "end_forward");
  // A skipped layer would leave the step's slots holding whatever the pages
  // held before: another sequence's K/V. The step stays open to finish.
  const std::int32_t missing = st.step.first_unwritten_layer();
  if (missing >= 0) {
    std::int32_t count = 0;
    for (char appended : st.step.layer_appended) count += appended ? 0 : 1;
    throw InvalidState(
        concat("PagedKVCache::end_forward: the K/V of layer ", missing,
               count > 1 ? concat(" (and ", count - 1, " more layers)") : std::string(),
               " was not appended this step (", st.plan.num_tokens(),
               " new tokens): call attention for every layer (or "
               "mark_layer_appended after writing it yourself), or cancel_forward"));
  }
  for (std::int32_t page : st.step.deferred) st.pool.release(page);
  st.step.deferred.clear();
  if (st.config.support_sliding_window)  // otherwise no sequence has a window
    for (SeqId id : st.plan.seq_ids) st.slide_window(st.seqs.find(id)->second);
  st.in_forward = false;
  st.notify({.kind = SequenceOp::Kind::kEndForward});
}

void PagedKVCache::cancel_forward(StepId step) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_step(step, "cancel_forward");
  st.undo_step();
  st.notify({.kind = SequenceOp::Kind::kCancelForward});
}

void PagedKVCache::State::undo_step() {
  for (const StepRecord::SeqBefore& before : step.seqs_before) {
    Sequence& s = seqs.find(before.id)->second;
    if (before.cow_page >= 0) {
      if (!before.cow_deferred) pool.retain(before.cow_page);
      s.pages[before.num_pages - 1] = before.cow_page;
    }
    s.pages.resize(before.num_pages);
    s.length = before.length;
    s.tree_parents.resize(before.tree_size);
    s.tree_depths.resize(before.tree_size);
    s.tree_open = before.tree_open;
  }
  for (auto it = step.taken.rbegin(); it != step.taken.rend(); ++it) pool.untake(*it);
  step.reset(0, 0);
  attention.invalidate_plan();
  in_forward = false;
}

void PagedKVCache::mark_layer_appended(std::int32_t layer, StepId step) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_step(step, "mark_layer_appended");
  require(layer >= 0 && layer < st.config.num_layers,
          "PagedKVCache::mark_layer_appended: layer = ", layer, " is outside [0, ",
          st.config.num_layers, ")");
  // The caller wrote the rows past append_paged_kv: their e4m3 NaN codes are
  // looked for once here, not by every later read.
  const PagedKVStorage s = st.storage.layer(layer);
  if (s.page_may_hold_nan)
    for (std::int64_t slot : st.plan.slot_mapping)
      if (slot >= 0) kernels::flag_e4m3_nan_slot(s, slot / s.page_size, slot % s.page_size);
  st.step.layer_appended[static_cast<std::size_t>(layer)] = 1;
}

bool PagedKVCache::in_forward() const {
  const auto lock = state_->lock();
  return state_->in_forward;
}

const BatchPlan& PagedKVCache::plan() const {
  const auto lock = state_->lock();
  require<InvalidState>(state_->in_forward, "PagedKVCache::plan: no forward is in progress");
  return state_->plan;
}

std::int64_t PagedKVCache::num_step_tokens() const {
  const auto lock = state_->lock();
  require<InvalidState>(state_->in_forward,
                        "PagedKVCache::num_step_tokens: no forward is in progress");
  return state_->plan.num_tokens();
}

StepId PagedKVCache::step_id() const {
  const auto lock = state_->lock();
  require<InvalidState>(state_->in_forward, "PagedKVCache::step_id: no forward is in progress");
  return state_->plan.step_id;
}

std::int32_t PagedKVCache::State::plan_index(SeqId id) const {
  if (!in_forward) return -1;
  for (std::size_t b = 0; b < plan.seq_ids.size(); ++b)
    if (plan.seq_ids[b] == id) return static_cast<std::int32_t>(b);
  return -1;
}

PagedKVTable BatchPlan::table() const {
  PagedKVTable t;
  t.batch_size = batch_size();
  t.page_size = page_size;
  t.qo_indptr = qo_indptr.data();
  t.kv_indptr = kv_indptr.data();
  t.kv_indices = kv_indices.data();
  t.kv_last_page_len = kv_last_page_len.data();
  t.kv_lens = kv_lens.data();
  t.kv_sink_lens = has_gaps ? kv_sink_lens.data() : nullptr;
  t.kv_gap_lens = has_gaps ? kv_gap_lens.data() : nullptr;
  return t;
}

}  // namespace pagedattn
