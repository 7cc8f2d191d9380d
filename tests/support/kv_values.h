// Per-token K/V test values and helpers to move them in and out of a cache.
//
// A token is identified by a 64-bit uid; every (layer, head, dim) element of
// its K and V is a hash of the uid, so two different tokens differ almost
// everywhere and a misplaced token is caught. All values are multiples of 1/2
// in [-64, 63.5]: exactly representable in f32, f16 and bf16, so a write and a
// read back must round-trip bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::test {

// The shapes of debug_get_kv / debug_set_kv buffers for a config.
struct KVShape {
  std::int32_t num_layers = 1;
  std::int32_t num_kv_heads = 1;
  std::int32_t head_dim = 1;
  std::int32_t v_head_dim = 1;
  bool v_in_k = false;  // MLA: V is the head of each K row, and written with it

  static KVShape of(const KVCacheConfig& resolved_config);
  std::size_t k_floats(std::int64_t tokens) const;
  std::size_t v_floats(std::int64_t tokens) const;
};

// The value of element `dim` of head `head` of a token's K (or V) in `layer`.
float token_value(std::uint64_t uid, std::int32_t layer, std::int32_t head, std::int32_t dim,
                  bool is_v);
// V's value in a cache of this shape: K's for MLA, whose V is K's head.
float v_value(const KVShape& shape, std::uint64_t uid, std::int32_t layer, std::int32_t head,
              std::int32_t dim);

// K and V of a run of tokens in debug buffer order:
// [num_layers][tokens][num_kv_heads][head_dim or v_head_dim].
struct KVBuffers {
  std::vector<float> k;
  std::vector<float> v;
};

KVBuffers make_kv(const KVShape& shape, std::span<const std::uint64_t> uids);

// debug_get_kv of tokens [start, end) of a sequence.
KVBuffers read_kv(const PagedKVCache& kv, SeqId id, std::int64_t start, std::int64_t end);

// debug_set_kv of the tokens `uids` at [start, start + uids.size()).
void write_kv(PagedKVCache& kv, SeqId id, std::int64_t start, std::span<const std::uint64_t> uids);

// Declares every layer of the current step appended (the test wrote the
// K/V through the plan's slots, or does not read it) and ends the step.
void end_metadata_step(PagedKVCache& kv);
// Writes new token i of batch entry b of `plan` (its slot_mapping entry) in
// every layer directly into layer_storage(), as an append kernel would.
// uids.size() must equal the entry's number of new tokens.
void write_kv_through_slots(const PagedKVCache& kv, const BatchPlan& plan, std::int32_t b,
                            std::span<const std::uint64_t> uids);

// The first difference between two buffers, described for a failure message
// ("" when equal). Values are compared exactly.
std::string first_difference(const KVShape& shape, const KVBuffers& expected,
                             const KVBuffers& actual);

// A plan-independent expected value check: "" when tokens [start, end) of `id`
// hold exactly the values of `uids`.
std::string check_tokens(const PagedKVCache& kv, SeqId id, std::int64_t start,
                         std::span<const std::uint64_t> uids);

// uids first, first + 1, ..., first + n - 1.
std::vector<std::uint64_t> uid_range(std::uint64_t first, std::int64_t n);

}  // namespace pagedattn::test
