// plan_cuda_attention: a pure host function from the batch's page table to
// the work items of the decode and prefill kernels, KV splits, merge tasks
// and the workspace layout. It needs a device only to read the SM count and
// shared-memory limit when the options do not give them.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "kernels/cuda/device_args.h"
#include "kernels/validate.h"
#include "kernels/visible_keys.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::cuda {
namespace {

using detail::kDecodeMaxRows;
using detail::kPrefillRows;

constexpr std::size_t kWorkspaceAlignment = 256;

std::size_t align_up(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// What the CUDA kernels do not serve, refused by name before any planning.
void refuse_unsupported(const AttentionParams& p) {
  require<Unsupported>(p.kv.dtype != DType::kF32,
                       "plan_cuda_attention: kv.dtype = float32 is not served on CUDA; store "
                       "K/V as float16, bfloat16, float8_e4m3fn, float8_e5m2 or int8");
  require<Unsupported>(p.options.key_rope == nullptr,
                       "plan_cuda_attention: options.key_rope (inline RoPE) is not served on "
                       "CUDA; rotate keys when appending them (cuda_apply_rope)");
  require<Unsupported>(!p.tree_mask.active(),
                       "plan_cuda_attention: token-tree masks are not served on CUDA");
}

std::int32_t rows_of(const CudaWorkItem& w) {
  return (w.q_end - w.q_begin) * (w.qo_head_end - w.qo_head_begin);
}

// A tile's cost for ordering and splitting: its keys are read once and
// scored for each row.
std::int64_t tile_cost(const CudaWorkItem& w) {
  return std::int64_t{w.kv_end - w.kv_begin} * (rows_of(w) + 8) + 64;
}

struct Tile {
  CudaWorkItem item;
  CudaKernel kernel;
};

// Decode tiles take every query head of a KV head and every query token of
// the sequence (at most kDecodeMaxRows rows); prefill tiles take
// kPrefillRows rows: whole groups of heads for as many tokens as fit, or,
// where one token's group is larger (MLA), kPrefillRows heads of one token.
std::vector<Tile> make_tiles(const AttentionParams& p, std::int32_t group) {
  std::vector<Tile> tiles;
  const PagedKVTable& t = p.table;
  for (std::int32_t b = 0; b < t.batch_size; ++b) {
    const std::int32_t q_len = t.q_len(b);
    if (q_len == 0) continue;
    const bool decode = std::int64_t{q_len} * group <= kDecodeMaxRows;
    const std::int32_t heads = decode ? group : std::min(group, kPrefillRows);
    const std::int32_t tokens = decode ? q_len : std::max(1, kPrefillRows / group);
    for (std::int32_t kv_head = 0; kv_head < p.kv.num_kv_heads; ++kv_head)
      for (std::int32_t h = kv_head * group; h < (kv_head + 1) * group; h += heads)
        for (std::int32_t q = 0; q < q_len; q += tokens) {
          CudaWorkItem w;
          w.batch = b;
          w.qo_head_begin = h;
          w.qo_head_end = std::min(h + heads, (kv_head + 1) * group);
          w.q_begin = q;
          w.q_end = std::min(q_len, q + tokens);
          std::tie(w.kv_begin, w.kv_end) =
              kernels::visible_keys(p.table, p.options, b, w.q_begin, w.q_end);
          tiles.push_back({w, decode ? CudaKernel::kDecode : CudaKernel::kPrefill});
        }
  }
  return tiles;
}

// Keys per chunk when tiles are split: fixed_kv_chunk when given; else
// chunks that give the SMs about two CTAs each over all tiles' keys, never
// shorter than min_kv_chunk. 0: no split.
std::int32_t kv_chunk(const std::vector<Tile>& tiles, const CudaPlanOptions& o,
                      std::int32_t num_sms) {
  if (o.fixed_kv_chunk > 0) return o.fixed_kv_chunk;
  const std::int64_t target_ctas = 2 * std::int64_t{num_sms};
  if (static_cast<std::int64_t>(tiles.size()) >= target_ctas) return 0;
  std::int64_t keys = 0;
  for (const Tile& tile : tiles) keys += tile.item.kv_end - tile.item.kv_begin;
  const std::int64_t chunk = (keys + target_ctas - 1) / target_ctas;
  return static_cast<std::int32_t>(std::max<std::int64_t>(chunk, o.min_kv_chunk));
}

void order_longest_first(std::vector<CudaWorkItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const CudaWorkItem& a, const CudaWorkItem& b) {
    return tile_cost(a) > tile_cost(b);
  });
}

// Splits tiles into items (chunks of `chunk` keys, each writing a partial
// slot, with a merge task per split tile).
void make_items(CudaAttentionPlan& plan, const std::vector<Tile>& tiles, std::int32_t chunk) {
  for (const Tile& tile : tiles) {
    auto& items = tile.kernel == CudaKernel::kDecode ? plan.decode_items : plan.prefill_items;
    const CudaWorkItem& w = tile.item;
    plan.max_rows = std::max(plan.max_rows, rows_of(w));
    const std::int32_t keys = w.kv_end - w.kv_begin;
    const std::int32_t splits = chunk > 0 && keys > chunk ? (keys + chunk - 1) / chunk : 1;
    if (splits == 1) {
      items.push_back(w);
      continue;
    }
    plan.merges.push_back({w.batch, w.qo_head_begin, w.qo_head_end, w.q_begin, w.q_end,
                           plan.num_partials, splits, 0});
    for (std::int32_t s = 0; s < splits; ++s) {
      CudaWorkItem part = w;
      part.kv_begin = w.kv_begin + s * chunk;
      part.kv_end = std::min(w.kv_end, part.kv_begin + chunk);
      part.partial = plan.num_partials++;
      items.push_back(part);
    }
  }
  order_longest_first(plan.decode_items);
  order_longest_first(plan.prefill_items);
}

template <class T>
void copy_into(std::vector<std::byte>& image, std::size_t offset, const std::vector<T>& values) {
  if (!values.empty()) std::memcpy(image.data() + offset, values.data(), values.size() * sizeof(T));
}

// The workspace offsets and the image of its first part.
void lay_out_workspace(CudaAttentionPlan& plan) {
  std::size_t at = 0;
  plan.decode_items_offset = at;
  at = align_up(at + plan.decode_items.size() * sizeof(CudaWorkItem));
  plan.prefill_items_offset = at;
  at = align_up(at + plan.prefill_items.size() * sizeof(CudaWorkItem));
  plan.merges_offset = at;
  at = align_up(at + plan.merges.size() * sizeof(CudaMergeTask));
  plan.partial_out_offset = at;
  const std::size_t rows = std::size_t(plan.num_partials) * std::size_t(plan.max_rows);
  at = align_up(at + rows * std::size_t(plan.shape.v_head_dim) * sizeof(float));
  plan.partial_lse_offset = at;
  plan.workspace_bytes = align_up(at + rows * sizeof(float));
  plan.host_image.assign(plan.partial_out_offset, std::byte{0});
  copy_into(plan.host_image, plan.decode_items_offset, plan.decode_items);
  copy_into(plan.host_image, plan.prefill_items_offset, plan.prefill_items);
  copy_into(plan.host_image, plan.merges_offset, plan.merges);
}

// The launch shapes, refusing shapes whose tiles do not fit the shared
// memory a CTA may use.
void choose_launches(CudaAttentionPlan& plan, std::int32_t max_shared) {
  const AttentionShape& s = plan.shape;
  if (!plan.decode_items.empty()) {
    plan.decode = detail::decode_launch(s.head_dim, s.v_head_dim, plan.kv_dtype);
    plan.decode.grid = static_cast<std::uint32_t>(plan.decode_items.size());
  }
  if (!plan.prefill_items.empty()) {
    plan.prefill = detail::prefill_launch(s.head_dim, s.v_head_dim, plan.kv_dtype);
    plan.prefill.grid = static_cast<std::uint32_t>(plan.prefill_items.size());
  }
  if (!plan.merges.empty()) {
    plan.merge = detail::merge_launch(s.v_head_dim);
    plan.merge.grid = static_cast<std::uint32_t>(plan.merges.size() * plan.max_rows);
  }
  for (const auto& [launch, name] :
       {std::pair{&plan.decode, "decode"}, std::pair{&plan.prefill, "prefill"}}) {
    require<Unsupported>(launch->grid == 0 || launch->shared_bytes <= std::uint32_t(max_shared),
                         "plan_cuda_attention: the ", name, " kernel needs ", launch->shared_bytes,
                         " bytes of shared memory for head_dim = ", s.head_dim,
                         ", v_head_dim = ", s.v_head_dim, "; the device allows ", max_shared);
  }
}

}  // namespace

CudaAttentionPlan plan_cuda_attention(const AttentionParams& p, const CudaPlanOptions& o) {
  kernels::validate_attention_params(p, "plan_cuda_attention");
  refuse_unsupported(p);
  require(o.num_sms >= 0 && o.max_shared_bytes >= 0 && o.min_kv_chunk >= 1 && o.fixed_kv_chunk >= 0,
          "plan_cuda_attention: options num_sms = ", o.num_sms,
          ", max_shared_bytes = ", o.max_shared_bytes, ", min_kv_chunk = ", o.min_kv_chunk,
          ", fixed_kv_chunk = ", o.fixed_kv_chunk, " out of range");
  std::int32_t num_sms = o.num_sms, max_shared = o.max_shared_bytes;
  if (num_sms == 0 || max_shared == 0) {
    const DeviceInfo device = current_device_info();
    if (num_sms == 0) num_sms = device.sm_count;
    if (max_shared == 0) max_shared = static_cast<std::int32_t>(device.max_shared_bytes_per_block);
  }

  CudaAttentionPlan plan;
  plan.shape = {p.num_qo_heads, p.kv.num_kv_heads, p.kv.head_dim, p.kv.v_head_dim};
  plan.kv_dtype = p.kv.dtype;
  plan.q_dtype = p.q.dtype;
  plan.batch_size = p.table.batch_size;
  plan.num_tokens = p.table.qo_indptr[p.table.batch_size];
  plan.num_table_pages = p.table.kv_indptr[p.table.batch_size];
  const std::int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  const std::vector<Tile> tiles = make_tiles(p, group);
  make_items(plan, tiles, kv_chunk(tiles, o, num_sms));
  lay_out_workspace(plan);
  choose_launches(plan, max_shared);
  return plan;
}

}  // namespace pagedattn::cuda
