#include "scheduler.h"

#include "core/seconds_since.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <unordered_set>

namespace pagedattn::engine {

std::int32_t reserved_seqs(const SequenceGroup& g) {
  std::int32_t finished = 0;
  for (const Sequence& s : g.seqs) finished += s.finished() ? 1 : 0;
  return g.params.n - finished;
}

bool shares_cached_pages(const SequenceGroup& g) {
  return !g.params.prompt_logprobs.has_value();
}

std::vector<SeqId> cached_seq_ids(const SequenceGroup& g) {
  std::vector<SeqId> ids;
  for (const Sequence& s : g.seqs)
    if (s.in_cache) ids.push_back(s.id);
  return ids;
}

// What one schedule() call has handed out so far.
struct Scheduler::StepState {
  Schedule out;
  std::int32_t budget = 0;    // tokens left
  std::int64_t reserved = 0;  // pages promised to planned chunks
};

Scheduler::Scheduler(const SchedulerConfig& config, PagedKVCache& cache)
    : config_(config), cache_(cache), page_size_(cache.config().page_size) {}

void Scheduler::add(std::unique_ptr<SequenceGroup> group) {
  waiting_.push_back(std::move(group));
}
void Scheduler::add_running(std::unique_ptr<SequenceGroup> group) {
  running_.push_back(std::move(group));
}

std::int32_t Scheduler::num_running_seqs() const {
  std::int32_t n = 0;
  for (const auto& g : running_) n += reserved_seqs(*g);
  return n;
}

SequenceGroup* Scheduler::find(RequestId id) {
  for (auto& g : running_)
    if (g->id == id) return g.get();
  for (auto& g : waiting_)
    if (g->id == id) return g.get();
  for (auto& g : swapped_)
    if (g->id == id) return g.get();
  return nullptr;
}

Schedule Scheduler::schedule() {
  for (;;) {
    StepState st;
    st.budget = config_.max_num_batched_tokens;
    const std::int64_t preemptions = num_preemptions_;
    const bool decodes_done = schedule_decodes(st);
    if (decodes_done) schedule_prefills(st);
    // No resumptions or admissions in a step that had to preempt: memory is
    // short. Swapped-out requests resume before new ones are admitted.
    if (num_preemptions_ == preemptions) swap_in_groups(st);
    if (num_preemptions_ == preemptions && swapped_.empty()) admit_waiting(st);
    // Nothing could run (every running prefill waits for pages): free the
    // most recent request's pages and try again.
    if (!st.out.empty() || running_.empty()) return std::move(st.out);
    preempt_last();
  }
}

// Running samples whose fork source holds the prompt get their pages now;
// finished sources are released once nobody waits on them.
void Scheduler::fork_waiting_samples(SequenceGroup& g) {
  const Sequence* source = g.fork_source();
  if (source == nullptr) return;
  for (Sequence& s : g.seqs) {
    if (!g.waits_for_fork(s)) continue;
    cache_.fork_sequence(source->id, s.id, g.prompt_len);
    s.in_cache = true;
    s.num_computed = g.prompt_len;
    s.published = g.prompt_len;  // the prompt's full pages are the source's
  }
}

// Pages a group's forks and decodes take this step (an upper bound before
// the forks, exact after them: the cache never shares a partial page).
std::int64_t Scheduler::decode_pages(const SequenceGroup& g) const {
  const bool has_source = g.fork_source() != nullptr;
  std::int64_t pages = 0;
  for (const Sequence& s : g.seqs) {
    if (s.finished()) continue;
    if (s.in_cache && s.remaining() == 1) {
      const std::array<SeqId, 1> id{s.id};
      const std::array<std::int64_t, 1> one{1};
      pages += cache_.pages_needed(id, one);
    } else if (!s.in_cache && has_source) {
      // After the fork a single new token needs one page (the copied partial
      // page, or a fresh one); a longer recompute pays the copy here and
      // its chunk's pages in the prefill phase.
      const bool decode = std::ssize(s.tokens) - g.prompt_len == 1;
      pages += decode || g.prompt_len % page_size_ != 0 ? 1 : 0;
    }
  }
  return pages;
}

// Decodes of every running group, oldest first. When pages run short the
// most recently admitted group is preempted (possibly this one). Returns
// false when the group being served was itself preempted.
bool Scheduler::schedule_decodes(StepState& st) {
  for (std::size_t i = 0; i < running_.size(); ++i) {
    SequenceGroup& g = *running_[i];
    while (decode_pages(g) > cache_.num_free_pages() - st.reserved) {
      const bool self = i + 1 == running_.size();
      preempt_last();
      if (self) return false;
    }
    fork_waiting_samples(g);
    for (std::int32_t k = 0; k < std::ssize(g.seqs); ++k) {
      const Sequence& s = g.seqs[k];
      if (s.in_cache && !s.finished() && s.remaining() == 1) add_chunk(st, g, k, 1);
    }
  }
  release_finished();
  st.out.num_decodes = static_cast<std::int32_t>(st.out.chunks.size());
  return true;
}

// The longest prefix of `want` tokens of `s` whose pages fit in `pages`.
std::int32_t Scheduler::chunk_that_fits(const Sequence& s, std::int32_t want,
                                        std::int64_t pages) const {
  // Outside the cache num_computed is 0 or a cached prefix: whole pages.
  const std::int64_t held = (s.num_computed + page_size_ - 1) / page_size_;
  const std::int64_t room = (held + std::max<std::int64_t>(pages, 0)) * page_size_ - s.num_computed;
  const std::int32_t fit = static_cast<std::int32_t>(std::clamp<std::int64_t>(room, 0, want));
  if (fit == want || config_.chunked_prefill) return fit;
  return 0;  // without chunking a prompt runs whole or not at all
}

// Partially computed sequences of running groups, oldest first.
void Scheduler::schedule_prefills(StepState& st) {
  for (auto& g : running_) schedule_group_prefills(st, *g);
}

void Scheduler::schedule_group_prefills(StepState& st, SequenceGroup& g) {
  for (std::int32_t k = 0; k < std::ssize(g.seqs) && st.budget > 0; ++k) {
    const Sequence& s = g.seqs[k];
    if (!s.in_cache || s.finished() || s.remaining() <= 1) continue;
    const std::int32_t want = config_.chunked_prefill
                                  ? std::min(s.remaining(), st.budget)
                                  : (s.remaining() <= st.budget ? s.remaining() : 0);
    const std::int32_t len = chunk_that_fits(s, want, cache_.num_free_pages() - st.reserved);
    if (len > 0) add_chunk(st, g, k, len);
  }
}

// Swapped-out groups in order while sequence slots, tokens and pages allow:
// the host pages come back, then the group decodes (and prefills) at once.
void Scheduler::swap_in_groups(StepState& st) {
  std::int32_t seqs = num_running_seqs();
  while (!swapped_.empty()) {
    SequenceGroup& g = *swapped_.front();
    const std::int32_t reserved = reserved_seqs(g);
    if (seqs + reserved > config_.max_num_seqs || st.budget < reserved) return;
    const std::vector<SeqId> ids = cached_seq_ids(g);
    const std::int64_t watermark = running_.empty() ? 0 : config_.watermark_pages;
    // Each unfinished sample's next token takes at most one page (a fork's
    // copied partial page, or a decode's new page).
    const std::int64_t pages = cache_.swap_in_pages_needed(ids);
    if (pages + reserved > cache_.num_free_pages() - st.reserved - watermark) return;
    const auto start = std::chrono::steady_clock::now();
    cache_.swap_in(ids);
    costs_.observe_copy(pages * cache_.bytes_per_page(), seconds_since(start));
    ++num_swap_ins_;
    seqs += reserved;
    running_.push_back(std::move(swapped_.front()));
    swapped_.pop_front();
    fork_waiting_samples(g);
    for (std::int32_t k = 0; k < std::ssize(g.seqs); ++k) {
      const Sequence& s = g.seqs[k];
      if (s.in_cache && !s.finished() && s.remaining() == 1) add_chunk(st, g, k, 1);
    }
    schedule_group_prefills(st, g);
  }
}

// Waiting requests in order while sequence slots, tokens and pages allow.
void Scheduler::admit_waiting(StepState& st) {
  std::int32_t seqs = num_running_seqs();
  while (!waiting_.empty() && st.budget > 0) {
    SequenceGroup& g = *waiting_.front();
    if (seqs + reserved_seqs(g) > config_.max_num_seqs) return;
    Sequence& lead = *g.lead();
    // The cached prefix is taken, not computed (it never covers every token).
    const bool take_prefix = config_.prefix_caching && shares_cached_pages(g);
    const PrefixMatch hit =
        take_prefix ? cache_.match_prefix(lead.tokens, g.params.cache_salt) : PrefixMatch{};
    lead.num_computed = static_cast<std::int32_t>(hit.num_tokens);
    const std::int32_t total = lead.remaining();
    const std::int32_t want =
        config_.chunked_prefill ? std::min(total, st.budget) : (total <= st.budget ? total : 0);
    const std::int64_t watermark = running_.empty() ? 0 : config_.watermark_pages;
    const std::int32_t len = chunk_that_fits(
        lead, want, cache_.num_free_pages() - st.reserved - watermark - hit.pages_taken);
    if (len == 0) {
      lead.num_computed = 0;
      return;
    }
    if (take_prefix)
      cache_.add_sequence_with_prefix(lead.id, lead.tokens, g.params.cache_salt);
    else
      cache_.add_sequence(lead.id);
    // Parallel samples fork the prompt once it is computed, and a windowed
    // source may already have dropped what a later fork needs: keep them whole.
    if (config_.sliding_window > 0 && g.params.n == 1)
      cache_.enable_sliding_window(lead.id, config_.sliding_window, 0);
    lead.published = lead.num_computed;
    lead.in_cache = true;
    seqs += reserved_seqs(g);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add_chunk(st, g, static_cast<std::int32_t>(&lead - g.seqs.data()), len);
  }
}

void Scheduler::add_chunk(StepState& st, SequenceGroup& g, std::int32_t seq, std::int32_t length) {
  const Sequence& s = g.seqs[seq];
  const std::array<SeqId, 1> id{s.id};
  const std::array<std::int64_t, 1> len{length};
  st.reserved += cache_.pages_needed(id, len);
  st.budget -= length;
  st.out.chunks.push_back({&g, seq, s.num_computed, length, length == s.remaining()});
  st.out.seq_ids.push_back(s.id);
  st.out.lengths.push_back(length);
  st.out.num_tokens += length;
}

void Scheduler::complete(const Schedule& schedule) {
  for (const ScheduledChunk& c : schedule.chunks) {
    Sequence& s = c.group->seqs[c.seq];
    s.num_computed += c.length;
    if (config_.prefix_caching && shares_cached_pages(*c.group)) publish(s);
  }
}

// Tells the cache the tokens of a sequence's computed pages once a new page
// has filled (a partial page is never published).
void Scheduler::publish(Sequence& s) {
  if (s.num_computed / page_size_ <= s.published / page_size_) return;
  cache_.set_sequence_tokens(s.id, std::span(s.tokens.data(), std::size_t(s.num_computed)));
  s.published = s.num_computed;
}

void Scheduler::release_group_pages(SequenceGroup& g) {
  for (Sequence& s : g.seqs) {
    if (s.in_cache) cache_.remove_sequence(s.id);
    s.in_cache = false;
    s.published = 0;
  }
}

// Swap (when the host tier has room and the estimate favours it): the
// group's pages move to host memory and it waits to be swapped back in.
// Recompute: its pages go back; it waits at the front of the queue.
void Scheduler::preempt_last() {
  std::unique_ptr<SequenceGroup> g = std::move(running_.back());
  running_.pop_back();
  ++num_preemptions_;
  // A lone group is never swapped: it would come straight back to the same
  // shortage; recompute lets it restart in smaller chunks.
  if (!running_.empty() && try_swap_out(*g)) {
    swapped_.push_front(std::move(g));
    return;
  }
  for (Sequence& s : g->seqs) {
    preempted_tokens_ += s.in_cache ? s.num_computed : 0;
    s.num_computed = 0;
  }
  release_group_pages(*g);
  waiting_.push_front(std::move(g));
}

bool Scheduler::try_swap_out(SequenceGroup& g) {
  const std::vector<SeqId> ids = cached_seq_ids(g);
  if (ids.empty() || cache_.num_free_host_pages() == 0) return false;
  // Distinct pages the group holds (forks share the prompt's), and the
  // tokens a recompute would run: the lead's, then each fork's own tail.
  std::unordered_set<std::int32_t> pages;
  std::int64_t tokens = 0;
  bool lead = true;
  for (const Sequence& s : g.seqs) {
    if (!s.in_cache) continue;
    for (std::int32_t p : cache_.sequence_pages(s.id)) pages.insert(p);
    tokens += lead ? s.num_computed : std::max(0, s.num_computed - g.prompt_len);
    lead = false;
  }
  const std::int64_t n = std::ssize(pages);
  const PreemptionCosts c =
      preemption_costs(n, cache_.bytes_per_page(), tokens, costs_.copy_seconds_per_byte(),
                       costs_.forward_seconds_per_token());
  if (choose_preemption(c, n <= cache_.num_free_host_pages()) != PreemptionMode::kSwap)
    return false;
  const auto start = std::chrono::steady_clock::now();
  try {
    cache_.swap_out(ids);
  } catch (const OutOfPages&) {
    return false;  // the host tier is fuller than counted (shared pages): nothing changed
  }
  costs_.observe_copy(n * cache_.bytes_per_page(), seconds_since(start));
  ++num_swap_outs_;
  for (const Sequence& s : g.seqs) swapped_tokens_ += s.in_cache ? s.num_computed : 0;
  return true;
}

void Scheduler::release_finished() {
  for (auto& gp : running_) {
    SequenceGroup& g = *gp;
    bool someone_waits = false;
    for (const Sequence& s : g.seqs) someone_waits |= g.waits_for_fork(s);
    if (someone_waits && g.fork_source() != nullptr) continue;  // keep the source
    for (Sequence& s : g.seqs)
      if (s.finished() && s.in_cache) {
        cache_.remove_sequence(s.id);
        s.in_cache = false;
      }
  }
  std::erase_if(running_, [](const auto& g) { return g->finished(); });
}

std::unique_ptr<SequenceGroup> Scheduler::remove(RequestId id) {
  auto take = [&](auto& queue) -> std::unique_ptr<SequenceGroup> {
    auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& g) { return g->id == id; });
    if (it == queue.end()) return nullptr;
    std::unique_ptr<SequenceGroup> g = std::move(*it);
    queue.erase(it);
    release_group_pages(*g);
    return g;
  };
  if (auto g = take(running_)) return g;
  if (auto g = take(swapped_)) return g;
  return take(waiting_);
}

}  // namespace pagedattn::engine
