#include "scheduler.h"

#include <algorithm>
#include <array>

namespace pagedattn::engine {

std::int32_t reserved_seqs(const SequenceGroup& g) {
  std::int32_t finished = 0;
  for (const Sequence& s : g.seqs) finished += s.finished() ? 1 : 0;
  return g.params.n - finished;
}

// What one schedule() call has handed out so far.
struct Scheduler::StepState {
  Schedule out;
  std::int32_t budget = 0;     // tokens left
  std::int64_t reserved = 0;   // pages promised to planned chunks
};

Scheduler::Scheduler(const SchedulerConfig& config, PagedKVCache& cache)
    : config_(config), cache_(cache), page_size_(cache.config().page_size) {}

void Scheduler::add(std::unique_ptr<SequenceGroup> group) { waiting_.push_back(std::move(group)); }
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
  return nullptr;
}

Schedule Scheduler::schedule() {
  for (;;) {
    StepState st;
    st.budget = config_.max_num_batched_tokens;
    const std::int64_t preemptions = num_preemptions_;
    const bool decodes_done = schedule_decodes(st);
    if (decodes_done) schedule_prefills(st);
    // No admissions in a step that had to preempt: memory is short.
    if (num_preemptions_ == preemptions) admit_waiting(st);
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
  const std::int64_t held = s.in_cache ? (s.num_computed + page_size_ - 1) / page_size_ : 0;
  const std::int64_t room = (held + std::max<std::int64_t>(pages, 0)) * page_size_ - s.num_computed;
  const std::int32_t fit = static_cast<std::int32_t>(std::clamp<std::int64_t>(room, 0, want));
  if (fit == want || config_.chunked_prefill) return fit;
  return 0;  // without chunking a prompt runs whole or not at all
}

// Partially computed sequences of running groups, oldest first.
void Scheduler::schedule_prefills(StepState& st) {
  for (auto& gp : running_) {
    SequenceGroup& g = *gp;
    for (std::int32_t k = 0; k < std::ssize(g.seqs) && st.budget > 0; ++k) {
      const Sequence& s = g.seqs[k];
      if (!s.in_cache || s.finished() || s.remaining() <= 1) continue;
      const std::int32_t want =
          config_.chunked_prefill ? std::min(s.remaining(), st.budget)
                                  : (s.remaining() <= st.budget ? s.remaining() : 0);
      const std::int32_t len = chunk_that_fits(s, want, cache_.num_free_pages() - st.reserved);
      if (len > 0) add_chunk(st, g, k, len);
    }
  }
}

// Waiting requests in order while sequence slots, tokens and pages allow.
void Scheduler::admit_waiting(StepState& st) {
  std::int32_t seqs = num_running_seqs();
  while (!waiting_.empty() && st.budget > 0) {
    SequenceGroup& g = *waiting_.front();
    if (seqs + reserved_seqs(g) > config_.max_num_seqs) return;
    Sequence& lead = *g.lead();
    lead.num_computed = 0;  // not in the cache: the chunk fit is computed from 0
    const std::int32_t total = lead.remaining();
    const std::int32_t want =
        config_.chunked_prefill ? std::min(total, st.budget) : (total <= st.budget ? total : 0);
    const std::int64_t watermark = running_.empty() ? 0 : config_.watermark_pages;
    const std::int32_t len =
        chunk_that_fits(lead, want, cache_.num_free_pages() - st.reserved - watermark);
    if (len == 0) return;
    cache_.add_sequence(lead.id);
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
  for (const ScheduledChunk& c : schedule.chunks) c.group->seqs[c.seq].num_computed += c.length;
}

void Scheduler::release_group_pages(SequenceGroup& g) {
  for (Sequence& s : g.seqs) {
    if (s.in_cache) cache_.remove_sequence(s.id);
    s.in_cache = false;
  }
}

// Recompute: the group's pages go back; it waits at the front of the queue.
void Scheduler::preempt_last() {
  std::unique_ptr<SequenceGroup> g = std::move(running_.back());
  running_.pop_back();
  for (Sequence& s : g->seqs) {
    preempted_tokens_ += s.in_cache ? s.num_computed : 0;
    s.num_computed = 0;
  }
  release_group_pages(*g);
  ++num_preemptions_;
  waiting_.push_front(std::move(g));
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
  return take(waiting_);
}

}  // namespace pagedattn::engine
