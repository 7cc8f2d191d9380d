#include "support/cache_driver.h"

#include <gtest/gtest.h>

#include "support/kv_values.h"
#include "support/model_checks.h"

namespace pagedattn::test {

KVCacheConfig small_config(std::int32_t page_size, std::int64_t num_pages, bool sliding_window) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.v_head_dim = 3;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.kv_dtype = DType::kF32;
  c.layout = KVLayout::kHND;
  c.support_sliding_window = sliding_window;
  return c;
}

CacheDriver::CacheDriver(const KVCacheConfig& config) : kv_(config), model_(config.page_size) {}

void CacheDriver::add(SeqId id) {
  kv_.add_sequence(id);
  model_.add(id);
}

void CacheDriver::remove(SeqId id) {
  kv_.remove_sequence(id);
  model_.remove(id);
}

void CacheDriver::fork(SeqId parent, SeqId child, std::int64_t fork_pos) {
  kv_.fork_sequence(parent, child, fork_pos);
  model_.fork(parent, child, fork_pos == -1 ? model_.seq(parent).length() : fork_pos);
}

void CacheDriver::pop(SeqId id, std::int64_t n) {
  kv_.pop_n(id, n);
  model_.pop(id, n);
}

void CacheDriver::enable_window(SeqId id, std::int64_t window, std::int64_t sink) {
  kv_.enable_sliding_window(id, window, sink);
  model_.enable_window(id, window, sink);
}

BatchPlan CacheDriver::step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens,
                            WriteVia via) {
  const std::int64_t cost = model_.append_cost(ids, lens);
  EXPECT_EQ(kv_.pages_needed(ids, lens), cost);
  const std::int64_t free_before = kv_.num_free_pages();
  const BatchPlan& plan = kv_.begin_forward(ids, lens);
  EXPECT_EQ(free_before - kv_.num_free_pages(), cost);
  for (std::size_t b = 0; b < ids.size(); ++b) {
    const std::vector<std::uint64_t> uids = uid_range(next_uid_, lens[b]);
    next_uid_ += static_cast<std::uint64_t>(lens[b]);
    model_.append(ids[b], uids);
    if (via == WriteVia::kSlots)
      write_kv_through_slots(kv_, plan, static_cast<std::int32_t>(b), uids);
    else
      write_kv(kv_, ids[b], model_.seq(ids[b]).length() - lens[b], uids);
  }
  expect_plan_matches(kv_, plan, model_, ids, lens);
  BatchPlan copy = plan;
  end_metadata_step(kv_);
  for (SeqId id : ids) model_.slide(id);
  return copy;
}

void CacheDriver::expect_matches() const {
  expect_cache_matches(kv_, model_);
}

}  // namespace pagedattn::test
