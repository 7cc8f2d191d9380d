// CacheDriver: a PagedKVCache and its ShadowModel driven in lockstep, for
// scenario tests that want to state specific expectations (page ids,
// refcounts, plan arrays) on top of the full model comparison.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "support/shadow_model.h"

namespace pagedattn::test {

// A small config: 2 layers, GQA 4:2, head_dim 4, v_head_dim 3, f32, HND.
KVCacheConfig small_config(std::int32_t page_size, std::int64_t num_pages,
                           bool sliding_window = false);

// The scenario suites' configs: small_config, in each attention kind (MLA:
// one KV head, its rows' head is V).
class ScenarioTest : public ::testing::TestWithParam<AttentionKind> {
 protected:
  KVCacheConfig config(std::int32_t page_size, std::int64_t num_pages,
                       bool sliding_window = false) const {
    KVCacheConfig c = small_config(page_size, num_pages, sliding_window);
    c.attention_kind = GetParam();
    if (c.attention_kind == AttentionKind::kMLA) c.num_kv_heads = 1;
    return c;
  }
};

// "MHA" / "MLA", for the suites' parameter names.
inline std::string kind_name(const ::testing::TestParamInfo<AttentionKind>& info) {
  return info.param == AttentionKind::kMLA ? "MLA" : "MHA";
}

enum class WriteVia { kSlots, kDebugSet };

class CacheDriver {
 public:
  explicit CacheDriver(const KVCacheConfig& config);

  PagedKVCache& kv() { return kv_; }
  const PagedKVCache& kv() const { return kv_; }
  const ShadowModel& model() const { return model_; }

  void add(SeqId id);
  void remove(SeqId id);
  void fork(SeqId parent, SeqId child, std::int64_t fork_pos = -1);
  void pop(SeqId id, std::int64_t n);
  void enable_window(SeqId id, std::int64_t window, std::int64_t sink);

  // One begin_forward/end_forward step appending fresh tokens, checked
  // against the model (plan arrays, positions, slot mapping); the values are
  // written through the slot mapping or with debug_set_kv. Returns a copy of
  // the step's plan.
  BatchPlan step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens,
                 WriteVia via = WriteVia::kSlots);

  // Full comparison with the model (see expect_cache_matches).
  void expect_matches() const;

  // uids of the retained tokens of a sequence, in order.
  std::vector<std::uint64_t> uids(SeqId id) const { return model_.uids(id); }

 private:
  PagedKVCache kv_;
  ShadowModel model_;
  std::uint64_t next_uid_ = 1;
};

}  // namespace pagedattn::test
