// plan_attention: a pure host-side function from the batch's shape to work
// items in the order threads take them, and KV splits.
#include <omp.h>

#include <algorithm>
#include <numeric>

#include "attention_traits.h"
#include "pagedattn/attention.h"
#include "pagedattn/errors.h"
#include "visible_keys.h"

namespace pagedattn {
namespace {

using kernels::AttentionTraits;
using kernels::visible_keys;

// Relative cost of an item: every key is read once per KV head and scored
// for each row.
std::int64_t item_cost(const AttentionWorkItem& w, std::int32_t group) {
  const std::int64_t heads = w.kv_head_end - w.kv_head_begin;
  const std::int64_t rows = heads * (w.q_end - w.q_begin) * group;
  return std::int64_t{w.kv_end - w.kv_begin} * (rows + 4 * heads) + 64;
}

// The most pieces kv_splits may cut `keys` into: exactly its fixed chunks,
// or as many as hold min_kv_chunk keys each (at least one).
std::int64_t most_kv_splits(std::int64_t keys, const AttentionPlanOptions& o) {
  if (o.fixed_kv_chunk > 0) return (keys + o.fixed_kv_chunk - 1) / o.fixed_kv_chunk;
  return std::max<std::int64_t>(1, keys / std::max(1, o.min_kv_chunk));
}

// A plan of fewer tiles than threads (one or a few sequences on many cores)
// may cut a tile's keys into chunks this much shorter than min_kv_chunk, so
// that every thread takes a part: an item's fixed cost (its queries loaded,
// its partial written and merged, its first pages' latency) is the work of a
// few dozen keys, small against the time the other threads would wait
// (docs/design.md, "Plan, then run").
constexpr std::int32_t kFewTilesChunkDivisor = 4;

// How many parts `keys` of a tile costing tile_cost (of total_cost in the
// plan) are cut into: enough that no part exceeds half a thread's fair share,
// so that longest-first assignment balances, in chunks of at least
// min_kv_chunk keys; and when the plan has fewer tiles than threads, at least
// `parts_wanted` (each tile's share of the threads) in chunks of at least
// min_kv_chunk / kFewTilesChunkDivisor.
std::int32_t kv_splits(std::int64_t keys, std::int64_t tile_cost, std::int64_t total_cost,
                       std::int32_t threads, std::int32_t parts_wanted,
                       const AttentionPlanOptions& o) {
  if (keys == 0) return 1;
  if (o.fixed_kv_chunk > 0) return static_cast<std::int32_t>(most_kv_splits(keys, o));
  if (threads == 1) return 1;
  const std::int64_t share = std::max<std::int64_t>(1, total_cost / (2 * threads));
  const std::int64_t by_cost = (tile_cost + share - 1) / share;
  const std::int64_t by_share = std::clamp<std::int64_t>(by_cost, 1, most_kv_splits(keys, o));
  const std::int64_t short_chunk = std::max(1, o.min_kv_chunk / kFewTilesChunkDivisor);
  const std::int64_t by_threads =
      std::clamp<std::int64_t>(parts_wanted, 1, std::max<std::int64_t>(1, keys / short_chunk));
  return static_cast<std::int32_t>(std::max(by_share, by_threads));
}

// Whether a tile's keys are too few to cut into chunks of min_kv_chunk keys:
// such a tile's heads are split first (split_heads).
bool keys_stay_whole(const AttentionWorkItem& w, const AttentionPlanOptions& o) {
  return most_kv_splits(w.kv_end - w.kv_begin, o) <= 1;
}

// Fewer tiles than threads (a few sequences on many cores): the KV heads of
// each tile whose keys stay whole in up to ceil(threads / tiles) parts, so
// that one short sequence's attention is not one thread's while the others
// wait. A row's result does not depend on the other heads of its item. A
// tile with more keys keeps its heads and is split by keys below: an item
// of every head reads each page's K and V whole (half of each page read
// per item measured slower on one long sequence: docs/design.md).
std::vector<AttentionWorkItem> split_heads(std::vector<AttentionWorkItem> tiles,
                                           std::int32_t threads, const AttentionPlanOptions& o) {
  const auto count = static_cast<std::int32_t>(tiles.size());
  const std::int32_t wanted = (threads + count - 1) / count;
  std::vector<AttentionWorkItem> parts;
  for (const AttentionWorkItem& tile : tiles) {
    const std::int32_t heads = tile.kv_head_end - tile.kv_head_begin;
    const std::int32_t n = keys_stay_whole(tile, o) ? std::min(wanted, heads) : 1;
    for (std::int32_t i = 0; i < n; ++i) {
      AttentionWorkItem part = tile;
      part.kv_head_begin = tile.kv_head_begin + heads * i / n;
      part.kv_head_end = tile.kv_head_begin + heads * (i + 1) / n;
      parts.push_back(part);
    }
  }
  return parts;
}

// Longest item first: threads take items in this order as each finishes its
// last (the kernel's shared cursor), so a thread slowed by another tenant
// (an SMT sibling on the same core, say) takes fewer items, not the same
// share. Equal costs keep their planned order, so the plan stays a pure
// function of its arguments.
void order_longest_first(AttentionPlan& plan, std::vector<AttentionWorkItem> items,
                         std::int32_t group) {
  std::vector<std::int64_t> cost(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) cost[i] = item_cost(items[i], group);
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return cost[a] > cost[b]; });
  plan.items.clear();
  plan.items.reserve(items.size());
  for (std::size_t i : order) plan.items.push_back(items[i]);
}

void validate_plan_inputs(const PagedKVTable& t, const AttentionShape& s,
                          const AttentionPlanOptions& o) {
  require(s.num_kv_heads >= 1 && s.num_qo_heads >= 1 && s.num_qo_heads % s.num_kv_heads == 0,
          "plan_attention: num_qo_heads = ", s.num_qo_heads,
          " must be a positive multiple of num_kv_heads = ", s.num_kv_heads);
  require(s.head_dim >= 1 && s.v_head_dim >= 1, "plan_attention: head_dim = ", s.head_dim,
          " and v_head_dim = ", s.v_head_dim, " must be >= 1");
  require(t.batch_size >= 0 && t.qo_indptr && t.kv_lens,
          "plan_attention: table needs batch_size >= 0, "
          "qo_indptr and kv_lens");
  require(o.num_threads >= 0 && o.fixed_kv_chunk >= 0 && o.min_kv_chunk >= 1,
          "plan_attention: num_threads = ", o.num_threads, ", fixed_kv_chunk = ", o.fixed_kv_chunk,
          ", min_kv_chunk = ", o.min_kv_chunk, " out of range");
  for (std::int32_t b = 0; b < t.batch_size; ++b)
    require(t.q_len(b) >= 0 && t.kv_lens[b] >= 0, "plan_attention: sequence ", b, " has q_len ",
            t.q_len(b), " and kv_len ", t.kv_lens[b]);
}

}  // namespace

AttentionPlan plan_attention(const PagedKVTable& t, const AttentionShape& shape,
                             const AttentionOptions& options, const AttentionPlanOptions& o) {
  validate_plan_inputs(t, shape, o);
  AttentionPlan plan;
  plan.shape = shape;
  plan.batch_invariant = o.fixed_kv_chunk > 0;
  plan.bf16_products = o.bf16_products && !plan.batch_invariant;
  plan.int8_products = o.int8_products && !plan.batch_invariant;
  plan.f16_products = o.f16_products && !plan.batch_invariant;
  plan.fp8_fast_products = o.fp8_fast_products && !plan.batch_invariant;
  plan.fast_prefill_products = o.fast_prefill_products && !plan.batch_invariant;
  plan.measured_products = o.measured_products;
  const std::int32_t group = shape.num_qo_heads / shape.num_kv_heads;
  const std::int32_t tile = std::max(1, AttentionTraits::kTargetRows / group);

  // Tiles (batch, KV head range, q tile) with their visible key ranges. KV
  // heads are grouped until a tile has about kTargetRows rows (all heads for
  // decode), so a page's K and V are streamed as contiguous runs.
  std::vector<AttentionWorkItem> tiles;
  std::int64_t total = 0;
  for (std::int32_t b = 0; b < t.batch_size; ++b)
    for (std::int32_t q = 0; q < t.q_len(b); q += tile) {
      const std::int32_t q_end = std::min(t.q_len(b), q + tile);
      const auto [kv_begin, kv_end] = visible_keys(t, options, b, q, q_end);
      const std::int32_t per_head = (q_end - q) * group;
      const std::int32_t heads =
          std::clamp(AttentionTraits::kTargetRows / per_head, 1, shape.num_kv_heads);
      for (std::int32_t h = 0; h < shape.num_kv_heads; h += heads) {
        tiles.push_back(
            {b, h, std::min(shape.num_kv_heads, h + heads), q, q_end, kv_begin, kv_end, -1});
        total += item_cost(tiles.back(), group);
      }
    }

  // A batch this small runs on one thread unless told otherwise: waking a
  // team costs more than it saves (much more on a loaded machine). The bar
  // is a few thousand key-rows, so that a served step of a dozen short
  // sequences (each call of it mostly per-item set-up) already splits
  // (docs/engine.md, "Threads").
  constexpr std::int64_t kSerialCost = std::int64_t{1} << 12;
  plan.num_threads = o.num_threads > 0     ? o.num_threads
                     : total < kSerialCost ? 1
                                           : std::max(1, omp_get_max_threads());
  if (!tiles.empty() && std::int64_t(tiles.size()) < plan.num_threads)
    tiles = split_heads(std::move(tiles), plan.num_threads, o);

  // Each tile's share of the threads where there are fewer tiles than threads.
  const auto num_tiles = static_cast<std::int32_t>(tiles.size());
  const std::int32_t parts_wanted = num_tiles > 0 && num_tiles < plan.num_threads
                                        ? (plan.num_threads + num_tiles - 1) / num_tiles
                                        : 1;
  std::vector<AttentionWorkItem> items;
  plan.max_rows = 1;
  for (const AttentionWorkItem& tile_item : tiles) {
    plan.max_rows = std::max(plan.max_rows, (tile_item.kv_head_end - tile_item.kv_head_begin) *
                                                (tile_item.q_end - tile_item.q_begin) * group);
    const std::int32_t keys = tile_item.kv_end - tile_item.kv_begin;
    const std::int32_t splits =
        kv_splits(keys, item_cost(tile_item, group), total, plan.num_threads, parts_wanted, o);
    if (splits == 1) {
      items.push_back(tile_item);
      continue;
    }
    const std::int32_t chunk =
        o.fixed_kv_chunk > 0 ? o.fixed_kv_chunk : (keys + splits - 1) / splits;
    plan.merges.push_back({tile_item.batch, tile_item.kv_head_begin, tile_item.kv_head_end,
                           tile_item.q_begin, tile_item.q_end, plan.num_partials, splits});
    for (std::int32_t s = 0; s < splits; ++s) {
      AttentionWorkItem w = tile_item;
      w.kv_begin = tile_item.kv_begin + s * chunk;
      w.kv_end = std::min(tile_item.kv_end, w.kv_begin + chunk);
      w.partial = plan.num_partials++;
      items.push_back(w);
    }
  }
  order_longest_first(plan, std::move(items), group);

  plan.scratch_bytes_per_thread =
      kernels::scratch_layout(plan.max_rows, shape.head_dim, shape.v_head_dim).bytes;
  plan.partial_bytes = static_cast<std::size_t>(plan.num_partials) *
                       kernels::partial_slot_bytes(plan.max_rows, shape.v_head_dim);
  plan.workspace_bytes =
      plan.scratch_bytes_per_thread * static_cast<std::size_t>(plan.num_threads) +
      plan.partial_bytes;
  return plan;
}

}  // namespace pagedattn
