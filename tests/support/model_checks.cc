#include "support/model_checks.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "support/kv_values.h"

namespace pagedattn::test {

namespace {

void expect_invariants_hold(const PagedKVCache& kv) {
  try {
    kv.check_invariants();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "check_invariants: " << e.what();
  }
}

void expect_sequences_match(const PagedKVCache& kv, const ShadowModel& model) {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : model.seqs()) ids.push_back(id);
  EXPECT_EQ(kv.sequence_ids(), ids);
  EXPECT_EQ(kv.num_sequences(), static_cast<std::int64_t>(ids.size()));
  EXPECT_EQ(kv.total_sequence_length(), model.total_length());
  for (const auto& [id, s] : model.seqs()) {
    EXPECT_TRUE(kv.has_sequence(id)) << "seq " << id;
    if (kv.has_sequence(id)) {
      EXPECT_EQ(kv.sequence_length(id), s.length()) << "seq " << id;
    }
  }
}

// Real page ids must correspond one-to-one to model page ids.
void expect_pages_match(const PagedKVCache& kv, const ShadowModel& model) {
  std::map<std::int64_t, std::int32_t> model_to_real;
  std::map<std::int32_t, std::int64_t> real_to_model;
  for (const auto& [id, s] : model.seqs()) {
    if (!kv.has_sequence(id)) continue;
    const std::vector<std::int32_t> real = kv.sequence_pages(id);
    const std::int64_t ps = kv.config().page_size;
    EXPECT_EQ(std::ssize(real), (s.length() + model.gap(id) + ps - 1) / ps)
        << "seq " << id << " must hold ceil((length + gap) / page_size) pages";
    if (real.size() != s.pages.size()) {
      ADD_FAILURE() << "seq " << id << " holds " << real.size() << " pages, expected "
                    << s.pages.size() << " (length " << s.length() << ")";
      continue;
    }
    for (std::size_t i = 0; i < real.size(); ++i) {
      const auto [it1, new1] = model_to_real.emplace(s.pages[i].id, real[i]);
      const auto [it2, new2] = real_to_model.emplace(real[i], s.pages[i].id);
      if (it1->second != real[i] || it2->second != s.pages[i].id) {
        ADD_FAILURE() << "seq " << id << " page " << i << " is real page " << real[i]
                      << ": sharing differs from the model (copy-on-write or fork sharing)";
        return;
      }
    }
  }
  for (const auto& [model_id, real] : model_to_real)
    EXPECT_EQ(kv.page_refcount(real), model.refcount(model_id)) << "refcount of page " << real;
  EXPECT_EQ(kv.num_free_pages(), kv.num_pages() - model.pages_in_use());
  EXPECT_EQ(kv.num_free_pages(), kv.num_pages() - static_cast<std::int64_t>(real_to_model.size()));
  EXPECT_EQ(kv.empty(), model.seqs().empty());
}

void expect_data_matches(const PagedKVCache& kv, const ShadowModel& model) {
  for (const auto& [id, s] : model.seqs()) {
    if (!kv.has_sequence(id) || kv.sequence_length(id) != s.length()) continue;
    const std::string d = check_tokens(kv, id, 0, model.uids(id));
    if (!d.empty()) ADD_FAILURE() << d;
  }
}

}  // namespace

void expect_cache_matches(const PagedKVCache& kv, const ShadowModel& model) {
  expect_invariants_hold(kv);
  expect_sequences_match(kv, model);
  expect_pages_match(kv, model);
  expect_data_matches(kv, model);
}

namespace {

void expect_entry_matches(const PagedKVCache& kv, const BatchPlan& plan, const PagedKVTable& table,
                          const ShadowModel& model, std::int32_t b, std::int64_t n) {
  const SeqId id = plan.seq_ids[b];
  const std::int64_t len = model.seq(id).length();
  const std::int32_t ps = plan.page_size;
  EXPECT_EQ(table.q_len(b), n);
  const std::vector<std::int32_t> pages = kv.sequence_pages(id);
  EXPECT_EQ(std::vector<std::int32_t>(plan.kv_indices.begin() + plan.kv_indptr[b],
                                      plan.kv_indices.begin() + plan.kv_indptr[b + 1]),
            pages);
  EXPECT_EQ(plan.kv_lens[b], len);
  EXPECT_EQ(plan.kv_sink_lens[b], model.sink(id));
  EXPECT_EQ(plan.kv_gap_lens[b], model.gap(id));
  const std::int64_t used = len == 0 ? 0 : model.physical_slot(id, len - 1) + 1;
  EXPECT_EQ(plan.kv_last_page_len[b], used == 0 ? 0 : (used - 1) % ps + 1);
  EXPECT_EQ(static_cast<std::int64_t>(pages.size()), (used + ps - 1) / ps);
  for (std::int64_t j = 0; j < len; ++j) {
    if (table.slot_of_key(b, j) == model.physical_slot(id, j)) continue;
    ADD_FAILURE() << "seq " << id << " key " << j << ": slot_of_key " << table.slot_of_key(b, j)
                  << ", expected " << model.physical_slot(id, j);
    break;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t q = plan.qo_indptr[b] + static_cast<std::int32_t>(i);
    const std::int64_t key = len - n + i;
    EXPECT_EQ(plan.positions[q], key) << "seq " << id << " new token " << i;
    EXPECT_EQ(plan.slot_mapping[q],
              std::int64_t{table.page_of_key(b, key)} * ps + table.offset_of_key(b, key))
        << "seq " << id << " new token " << i;
  }
}

}  // namespace

void expect_plan_matches(const PagedKVCache& kv, const BatchPlan& plan, const ShadowModel& model,
                         std::span<const SeqId> ids, std::span<const std::int64_t> lens) {
  const auto batch = static_cast<std::int32_t>(ids.size());
  ASSERT_EQ(plan.seq_ids, std::vector<SeqId>(ids.begin(), ids.end()));
  ASSERT_EQ(plan.qo_indptr.size(), ids.size() + 1);
  ASSERT_EQ(plan.kv_indptr.size(), ids.size() + 1);
  ASSERT_EQ(plan.kv_indices.size(), static_cast<std::size_t>(plan.kv_indptr.back()));
  for (auto* v : {&plan.kv_last_page_len, &plan.kv_lens, &plan.kv_sink_lens, &plan.kv_gap_lens})
    ASSERT_EQ(v->size(), ids.size());
  std::int64_t tokens = 0;
  for (std::int64_t n : lens) tokens += n;
  ASSERT_EQ(plan.num_tokens(), tokens);
  ASSERT_EQ(plan.positions.size(), static_cast<std::size_t>(tokens));
  ASSERT_EQ(plan.slot_mapping.size(), static_cast<std::size_t>(tokens));
  EXPECT_EQ(plan.page_size, kv.config().page_size);
  EXPECT_EQ(plan.qo_indptr[0], 0);
  EXPECT_EQ(plan.kv_indptr[0], 0);
  bool gaps = false;
  for (std::int32_t b = 0; b < batch; ++b) gaps |= model.gap(ids[b]) != 0;
  EXPECT_EQ(plan.has_gaps, gaps);
  const PagedKVTable table = plan.table();
  EXPECT_EQ(table.batch_size, batch);
  EXPECT_EQ(table.kv_gap_lens == nullptr, !gaps);
  for (std::int32_t b = 0; b < batch; ++b) expect_entry_matches(kv, plan, table, model, b, lens[b]);
}

}  // namespace pagedattn::test
