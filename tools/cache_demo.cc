// A scripted tour of PagedKVCache: batched prefill, decode, parallel sampling
// by fork, speculative rollback by pop_n, a streaming sequence with a sliding
// window and sinks, and a comparison with contiguous per-request reservation.
#include "cache_demo.h"

#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::tools {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

// Pages referenced by any sequence (shared pages counted once).
std::int64_t distinct_pages(const PagedKVCache& kv) {
  std::set<std::int32_t> pages;
  for (SeqId id : kv.sequence_ids())
    for (std::int32_t p : kv.sequence_pages(id)) pages.insert(p);
  return static_cast<std::int64_t>(pages.size());
}

// Page references summed over sequences (a shared page counted once per reader).
std::int64_t page_references(const PagedKVCache& kv) {
  std::int64_t refs = 0;
  for (SeqId id : kv.sequence_ids()) refs += std::ssize(kv.sequence_pages(id));
  return refs;
}

void report(const PagedKVCache& kv, const char* stage) {
  kv.check_invariants();
  const std::int64_t used = kv.num_pages() - kv.num_free_pages();
  const double reserved_tokens = double(used) * kv.config().page_size;
  const double per_slot = used == 0 ? 0.0 : double(kv.total_sequence_length()) / reserved_tokens;
  std::printf("%-44s %5lld seqs %8lld tokens %6lld pages (%6.1f MiB) %5.2f tokens/slot\n", stage,
              static_cast<long long>(kv.num_sequences()),
              static_cast<long long>(kv.total_sequence_length()), static_cast<long long>(used),
              double(used * kv.bytes_per_page()) / kMiB, per_slot);
}

void step(PagedKVCache& kv, const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens) {
  kv.begin_forward(ids, lens);
  kv.end_forward();
}

void decode(PagedKVCache& kv, const std::vector<SeqId>& ids, int steps) {
  const std::vector<std::int64_t> ones(ids.size(), 1);
  for (int s = 0; s < steps; ++s) step(kv, ids, ones);
}

}  // namespace

int run_cache_demo() {
  KVCacheConfig config;  // the KV shape of an 8B Llama-3 model
  config.num_layers = 32;
  config.num_qo_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.page_size = 16;
  config.kv_dtype = DType::kF16;
  config.memory_budget_bytes = 2048 * kMiB;
  config.support_sliding_window = true;
  PagedKVCache kv(config);
  std::printf("pagedattn cache demo: 32 layers, 8 KV heads x 128, f16, page 16 tokens\n");
  std::printf(
      "2 GiB budget -> %lld pages of %lld KiB (all layers, K+V)\n"
      "tokens/slot = tokens held / page slots in use; above 1.00 when pages are shared\n\n",
      static_cast<long long>(kv.num_pages()), static_cast<long long>(kv.bytes_per_page() / 1024));

  const std::vector<std::int64_t> prompts = {183, 57, 412, 96, 250, 31, 128, 77};
  std::vector<SeqId> ids(prompts.size());
  std::iota(ids.begin(), ids.end(), 0);
  for (SeqId id : ids) kv.add_sequence(id);
  step(kv, ids, prompts);
  report(kv, "1. prefill 8 prompts in one ragged batch");
  decode(kv, ids, 40);
  report(kv, "2. 40 decode steps for all 8");

  // Parallel sampling: 4 samples of request 0 share its prompt pages.
  const std::int64_t before = kv.num_free_pages();
  for (SeqId child = 100; child < 104; ++child) kv.fork_sequence(0, child);
  report(kv, "3. fork request 0 into 4 samples");
  std::printf("   the 4 forks took %lld new pages (only the partial last page is copied)\n",
              static_cast<long long>(before - kv.num_free_pages()));
  decode(kv, {0, 100, 101, 102, 103}, 20);
  report(kv, "   20 decode steps for the 5 samples");

  // Speculative decoding: 6 draft tokens, 2 accepted, the rest rolled back.
  step(kv, {1}, {6});
  kv.pop_n(1, 4);
  report(kv, "4. request 1 drafts 6 tokens, keeps 2");

  // Streaming: 4 sink tokens + the most recent 252, however long it runs.
  kv.enable_sliding_window(2, 256, 4);
  decode(kv, {2}, 2000);
  report(kv, "5. request 2 streams 2000 tokens, window 256");
  std::printf("   request 2 holds %lld tokens in %zu pages\n",
              static_cast<long long>(kv.sequence_length(2)), kv.sequence_pages(2).size());

  // What a contiguous cache reserving max_len = 4096 per request would use.
  // Efficiency counts each stored token state once: a page shared by forks
  // holds its tokens once however many sequences read it (forks share only
  // full pages, so every reference beyond the first repeats page_size tokens).
  const std::int64_t seen_tokens = kv.total_sequence_length();
  const std::int64_t pages = distinct_pages(kv);
  const std::int64_t stored_tokens = seen_tokens - config.page_size * (page_references(kv) - pages);
  const std::int64_t contiguous = kv.num_sequences() * 4096;
  std::printf(
      "\ncontiguous reservation (4096 tokens per request) would reserve %lld token slots for"
      " %lld tokens: %.1f%% efficient;\npaged stores %lld distinct tokens in %lld pages (%lld "
      "slots): "
      "%.1f%% efficient,\nand the %lld sequences read %lld tokens because forks share prompt "
      "pages\n",
      static_cast<long long>(contiguous), static_cast<long long>(seen_tokens),
      100.0 * double(seen_tokens) / double(contiguous), static_cast<long long>(stored_tokens),
      static_cast<long long>(pages), static_cast<long long>(pages * config.page_size),
      100.0 * double(stored_tokens) / double(pages * config.page_size),
      static_cast<long long>(kv.num_sequences()), static_cast<long long>(seen_tokens));

  try {
    kv.fork_sequence(7, 8, 500);
  } catch (const InvalidArgument& e) {
    std::printf("\nbad input is refused, state untouched: %s\n", e.what());
  }
  for (SeqId id : kv.sequence_ids()) kv.remove_sequence(id);
  report(kv, "6. all requests finished");
  std::printf("every page returned: %s\n", kv.empty() ? "yes" : "NO");
  return kv.empty() ? 0 : 1;
}

}  // namespace pagedattn::tools
