// Iteration-level scheduler (Orca / vLLM): decides, before each step, which
// tokens of which sequences run, and keeps the cache's sequences in step with
// that decision (add, fork, remove, swap). It never runs a model, so it is
// tested with a bare cache. Every page it hands out is checked with the
// cache's dry runs (pages_needed, match_prefix, swap_in_pages_needed) first;
// no step is planned that could run out of pages.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "preemption_cost.h"
#include "sequence_group.h"

namespace pagedattn::engine {

struct SchedulerConfig {
  std::int32_t max_num_seqs = 256;             // sequences (samples) running at once
  std::int32_t max_num_batched_tokens = 2048;  // tokens per step, >= max_num_seqs
  bool chunked_prefill = true;
  std::int64_t watermark_pages = 0;  // pages left free when admitting while others run
  // Admission takes the prompt's cached prefix (the cache must have been
  // built with prefix caching), and computed full pages are published.
  bool prefix_caching = false;
  // > 0: admitted single-sample requests get a sliding window of this many
  // tokens (the model's ModelSpec::sliding_window), so pages behind it are
  // freed. Requests with n > 1 keep every token: their samples fork the
  // prompt, possibly after the source has moved on.
  std::int32_t sliding_window = 0;
};

// Tokens [begin, begin + length) of group->seqs[seq] run this step.
struct ScheduledChunk {
  SequenceGroup* group = nullptr;
  std::int32_t seq = 0;
  std::int32_t begin = 0;
  std::int32_t length = 0;
  bool samples = false;  // reaches the sequence's last token: its logits pick the next one
};

struct Schedule {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<SeqId> seq_ids;          // [chunks.size()] for begin_forward
  std::vector<std::int64_t> lengths;   // [chunks.size()]
  std::int32_t num_tokens = 0;
  std::int32_t num_decodes = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, PagedKVCache& cache);

  // Queues a new request at the back of the waiting queue.
  void add(std::unique_ptr<SequenceGroup> group);
  // Adds a request whose sequence is already in the cache with its prompt
  // computed (imported from a prefill instance) as the newest running one.
  void add_running(std::unique_ptr<SequenceGroup> group);
  // Plans the next step: forks waiting samples, preempts when pages run out,
  // admits waiting requests FCFS. May change the cache's sequences.
  Schedule schedule();
  // Marks a planned step's chunks as computed (after its forward) and
  // publishes their new full pages to the prefix cache.
  void complete(const Schedule& schedule);
  // The step's forward time, for the swap-or-recompute estimate.
  void observe_forward(std::int32_t tokens, double seconds) {
    costs_.observe_forward(tokens, seconds);
  }
  // The host copy rate, measured when the engine starts.
  void set_copy_seconds_per_byte(double seconds_per_byte) {
    costs_.set_copy_seconds_per_byte(seconds_per_byte);
  }
  // Returns the pages of finished sequences and drops finished requests.
  void release_finished();
  // Removes a request wherever it is, returning its pages; null if unknown.
  std::unique_ptr<SequenceGroup> remove(RequestId id);

  SequenceGroup* find(RequestId id);
  bool has_unfinished() const {
    return !running_.empty() || !waiting_.empty() || !swapped_.empty();
  }
  std::int32_t num_running_seqs() const;
  std::int32_t num_waiting() const { return static_cast<std::int32_t>(waiting_.size()); }
  std::int64_t num_preemptions() const { return num_preemptions_; }
  std::int64_t preempted_tokens() const { return preempted_tokens_; }  // by recompute
  std::int64_t num_swap_outs() const { return num_swap_outs_; }
  std::int64_t num_swap_ins() const { return num_swap_ins_; }
  std::int64_t swapped_tokens() const { return swapped_tokens_; }
  std::int32_t num_swapped() const { return static_cast<std::int32_t>(swapped_.size()); }
  const PreemptionCostModel& cost_model() const { return costs_; }
  // Groups in admission order (oldest first).
  const std::vector<std::unique_ptr<SequenceGroup>>& running() const { return running_; }
  const std::deque<std::unique_ptr<SequenceGroup>>& waiting() const { return waiting_; }
  // Groups whose pages are in the host tier, to resume first (oldest first).
  const std::deque<std::unique_ptr<SequenceGroup>>& swapped() const { return swapped_; }

 private:
  struct StepState;
  bool schedule_decodes(StepState& st);
  void schedule_prefills(StepState& st);
  void schedule_group_prefills(StepState& st, SequenceGroup& g);
  void swap_in_groups(StepState& st);
  void admit_waiting(StepState& st);
  void publish(Sequence& s);
  void fork_waiting_samples(SequenceGroup& g);
  std::int64_t decode_pages(const SequenceGroup& g) const;
  std::int32_t chunk_that_fits(const Sequence& s, std::int32_t want, std::int64_t pages) const;
  void add_chunk(StepState& st, SequenceGroup& g, std::int32_t seq, std::int32_t length);
  void preempt_last();
  bool try_swap_out(SequenceGroup& g);
  void release_group_pages(SequenceGroup& g);

  SchedulerConfig config_;
  PagedKVCache& cache_;
  std::int32_t page_size_;
  std::vector<std::unique_ptr<SequenceGroup>> running_;
  std::deque<std::unique_ptr<SequenceGroup>> waiting_;
  std::deque<std::unique_ptr<SequenceGroup>> swapped_;
  PreemptionCostModel costs_;
  std::int64_t num_preemptions_ = 0;
  std::int64_t preempted_tokens_ = 0;
  std::int64_t num_swap_outs_ = 0, num_swap_ins_ = 0, swapped_tokens_ = 0;
};

// Prefix caching: whether a group takes cached pages at admission and
// publishes its own. Not with prompt_logprobs: the request computes every
// prompt position for its logits, and a sequence added without a prefix
// would publish under the default salt instead of its own.
bool shares_cached_pages(const SequenceGroup& g);

// In-cache sequence ids of a group.
std::vector<SeqId> cached_seq_ids(const SequenceGroup& g);

// Sequences a group holds a running slot for: n minus its finished samples.
std::int32_t reserved_seqs(const SequenceGroup& g);

}  // namespace pagedattn::engine
