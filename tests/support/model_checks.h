// Comparisons of a PagedKVCache against a ShadowModel, reported as gtest
// failures (non-fatal; callers stop on HasFailure()).
#pragma once

#include <span>

#include "pagedattn/kv_cache.h"
#include "support/shadow_model.h"

namespace pagedattn::test {

// Every observable of the cache: check_invariants(), the sequence set and
// lengths, page lists matched one-to-one with the model's pages (so sharing
// and copy-on-write are exactly as modelled), refcounts, free pages, empty(),
// and the K/V values of every retained token (debug_get_kv).
void expect_cache_matches(const PagedKVCache& kv, const ShadowModel& model);

// The plan of begin_forward(ids, lens) against the model after its append
// (before sliding): CSR arrays, lengths, sinks and gaps, positions (the
// retained length before the append + i), table().slot_of_key of every key,
// and slot_mapping = page_of_key * page_size + offset_of_key of each new token.
void expect_plan_matches(const PagedKVCache& kv, const BatchPlan& plan, const ShadowModel& model,
                         std::span<const SeqId> ids, std::span<const std::int64_t> lens);

}  // namespace pagedattn::test
