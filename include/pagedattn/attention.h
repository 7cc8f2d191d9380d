// Paged attention over a ragged batch: one entry point serves decode
// (q_len 1), prefill, chunked prefill and mixed batches. Implements exactly
// the canonical definition in docs/semantics.md.
//
//   plan   = plan_attention(table, shape, num_threads)     host side, pure
//   bytes  = plan.workspace_bytes                           caller allocates
//   paged_attention(params, plan, workspace)                never allocates
//
// AttentionRunner bundles the three for callers that want one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn {

struct AttentionOptions {
  std::optional<float> scale;     // logit scale; none means 1 / sqrt(head_dim)
  bool causal = true;             // bottom-right aligned: query i sees keys j <= kv_len - q_len + i
  std::int32_t window_left = -1;  // -1 = off; W: query at p sees keys [p - W, p]
  float softcap = 0.0f;           // > 0: s = softcap * tanh(s / softcap)
  const float* alibi_slopes = nullptr;  // [num_qo_heads] or null: s += slope * (j - p)
  const float* sinks = nullptr;         // [num_qo_heads] or null: learned sink logits
  // Inline RoPE (TVM's INLINE mode): keys are stored unrotated and key j is
  // rotated at position j (its index in the cache; a token-tree node at its
  // tree position) before scoring. Queries must already be rotated. Null:
  // keys are used as stored.
  const RopeConfig* key_rope = nullptr;
};

// Token-tree (speculative decoding) visibility for a batch, as compact DFS
// intervals rather than a dense mask. For sequence b, keys
// [tree_begin[b], kv_lens[b]) are the nodes of an uncommitted token tree in
// node order (a parent's key index is below its child's); the keys before
// tree_begin[b] are the committed prefix, visible to every query. Every query
// of a tree sequence must be a tree node (kv_len - q_len >= tree_begin).
// Tree key k is visible to query node q iff k is an ancestor of q or q
// itself: enter[k] <= enter[q] <= exit[k]. tree_begin[b] == kv_lens[b]
// means b has no tree (ordinary causal attention, no extra cost).
// Positions (ALiBi, inline RoPE) of tree nodes are given per node; keys of
// the prefix sit at their index. Incompatible with window_left >= 0.
struct TokenTreeMask {
  const std::int32_t* tree_begin = nullptr;   // [batch_size] key index of the first node
  const std::int32_t* node_indptr = nullptr;  // [batch_size + 1] offsets of each sequence's nodes
  const std::int32_t* enter = nullptr;        // [nodes] DFS preorder index within its tree
  const std::int32_t* exit = nullptr;         // [nodes] last preorder index of its subtree
  const std::int32_t* positions = nullptr;    // [nodes] position: tree_begin + depth
  bool active() const { return tree_begin != nullptr; }
  // Index into enter/exit/positions of key j of sequence b (j >= tree_begin[b]).
  std::int64_t node_of_key(std::int32_t b, std::int64_t j) const {
    return node_indptr[b] + (j - tree_begin[b]);
  }
  // Position of key j of sequence b (also of a query: queries are keys).
  std::int64_t position(std::int32_t b, std::int64_t j) const {
    return !active() || j < tree_begin[b] ? j : positions[node_of_key(b, j)];
  }
  // Whether tree rules let query key q see key j (q's causal limit aside).
  bool visible(std::int32_t b, std::int64_t j, std::int64_t q) const {
    if (!active() || j < tree_begin[b]) return true;
    const std::int32_t at = enter[node_of_key(b, q)];
    return enter[node_of_key(b, j)] <= at && at <= exit[node_of_key(b, j)];
  }
};

struct AttentionParams {
  HeadTensor q;          // [num_tokens][num_qo_heads][head_dim]
  HeadTensor o;          // [num_tokens][num_qo_heads][v_head_dim]
  float* lse = nullptr;  // [num_tokens][num_qo_heads] natural-log LSE, or null
  std::int32_t num_qo_heads = 0;
  PagedKVTable table;  // ragged batch: qo_indptr and the CSR page table
  PagedKVStorage kv;   // the layer's pages (num_kv_heads, head dims, dtype)
  AttentionOptions options;
  TokenTreeMask tree_mask;  // inactive (all null) for ordinary batches
};

// --- planning (host side, pure) -------------------------------------------------

struct AttentionShape {
  std::int32_t num_qo_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t v_head_dim = 0;
};

struct AttentionPlanOptions {
  std::int32_t num_threads = 0;     // 0: OpenMP's maximum (1 for a batch too small to share)
  std::int32_t fixed_kv_chunk = 0;  // > 0: split KV into chunks of exactly this many keys,
                                    // whatever the batch, and compute every query row
                                    // the same way (deterministic mode: batch_invariant)
  std::int32_t min_kv_chunk = 256;  // smallest chunk the planner creates when it splits to
                                    // balance; a plan of fewer tiles than threads may cut
                                    // a tile into chunks down to min_kv_chunk / 4 keys
  // Prefill (more than 8 query rows per KV head) over KV of 16 bits or
  // fewer, and decode (at most 8 rows per KV head, no inline key RoPE) over
  // bf16, f16 and fp8 KV, may run on bf16 dot products where the CPU has
  // AVX512-BF16: queries, softmax weights and f16 K/V are then rounded to
  // bf16 (8 significant bits; up to about 2.5% of a row's largest output;
  // bf16 and fp8 K/V convert exactly), for about twice the multiply-add
  // rate. Where the CPU has AMX-BF16 (Intel Xeon from Sapphire Rapids on),
  // prefill with head dims that are multiples of 32 runs these products on
  // AMX tiles (several times the f32 prefill there), and decode keeps f32
  // products (vdpbf16ps is no faster than FMAs on those cores). Off: f32
  // products, except where fp8_fast_products or fast_prefill_products
  // (below, both on by default) allow these paths.
  bool bf16_products = false;
  // Decode (at most 8 query rows per KV head) over int8 KV may run on int8
  // dot products (vpdpbusd) where the CPU has AVX512-VNNI and both head
  // dims are multiples of 64: queries are rounded to int8 per row (absmax /
  // 127) and each block's softmax weights (x the V token scale, which must
  // be >= 0, as absmax / 127 is) to 8 bits against the block's largest;
  // K and V are used as stored. About 2% of a row's largest output at the
  // default scale (unit-variance q and k), growing with the spread of the
  // logits (scale x sqrt(head_dim)), for about a third of the instructions
  // per key. Off: f32 products.
  bool int8_products = false;
  // Decode (at most 8 query rows per KV head, no inline key RoPE) over fp8
  // e4m3 and f16 KV with head dims that are multiples of 32 up to 256 may
  // run on f16 multiply-adds where the CPU has AVX512-FP16 (Intel Xeon from
  // Sapphire Rapids on; not Zen 4 or 5): queries are scaled by a power of
  // two per row and rounded to f16 (11 significant bits), softmax weights
  // rounded to f16, K/V used as stored; a score is summed in f16 over up to
  // head_dim / 2 products before f32, PV over 16 keys. At most 0.75% of a
  // row's largest output in the kernel tests, for about half the
  // instructions per key of f32 products (e4m3 decodes to f16 in 3
  // instructions per 32 codes). Blocks the path cannot take keep f32
  // products: e4m3 NaN codes, f16 V elements of magnitude 2048 or more
  // (infinities and NaNs included), f16 scores that overflow f16 or meet
  // an infinity or NaN in K; so do work items whose queries are not
  // finite. Off: f32 products.
  bool f16_products = false;
  // Decode and prefill over fp8 KV (e4m3, e5m2) may take the bf16 paths
  // above without bf16_products, and e4m3 decode the f16 path without
  // f16_products: the queries and softmax weights are then rounded to 8 or
  // 11 significant bits, finer than the 3 or 2 of the K and V they meet, so
  // the results stay within the fp8 cache's own error (tested against the
  // unquantised K/V; docs/design.md, "Product paths"). false: f32 products
  // for fp8 KV unless a flag above allows others.
  bool fp8_fast_products = true;
  // Prefill over f16, bf16 and int8 KV may take the bf16 prefill tiles
  // above without bf16_products (as may decode rows of more than 16 query
  // heads per KV head, which run on the same tiles; other decode rows keep
  // f32 products unless bf16_products): queries, softmax weights and f16
  // K/V are rounded to bf16 (8 significant bits; bf16 and int8 K/V convert
  // exactly), products and sums stay f32. Each output element stays within
  // (F - 1) sum_j p_j |v_j| of the exact attention over the stored K/V, F
  // the factor of docs/design.md ("Product paths") built from 2^-8 per
  // rounded input (a worst case, about 12% of sum_j p_j |v_j| at head dim
  // 128 for f16 KV; measured errors stay near a tenth of it; tested against
  // a double reference). Prefill is compute-bound, where vdpbf16ps carries
  // twice an FMA's multiply-adds on Zen 4 and 5 and AMX far more. Like the
  // other fast paths, taken only where measured faster (measured_products).
  // false: f32 products for these KV dtypes unless bf16_products.
  bool fast_prefill_products = true;
  // The fast paths allowed above run only for the KV dtypes, head dims and
  // phases (decode rows, prefill tiles) where they measured faster than f32
  // products on this CPU: the first call for a shape times both on a small
  // batch, once per process. false: wherever the CPU has them (the tests
  // and benchmarks of one path).
  bool measured_products = true;

  friend bool operator==(const AttentionPlanOptions&, const AttentionPlanOptions&) = default;
};

// One unit of work: query tokens [q_begin, q_end) of sequence `batch` (offsets
// within the sequence), all query heads of KV heads [kv_head_begin,
// kv_head_end), against keys [kv_begin, kv_end). partial >= 0: write a
// partial state to that slot. Decode items take every KV head of a sequence,
// so each page's K and V are read as whole contiguous runs, except that in a
// batch of fewer (sequence, query tile) pairs than the plan has threads, the
// heads of a sequence too short to split by keys are split instead.
struct AttentionWorkItem {
  std::int32_t batch = 0, kv_head_begin = 0, kv_head_end = 1;
  std::int32_t q_begin = 0, q_end = 0;
  std::int32_t kv_begin = 0, kv_end = 0;
  std::int32_t partial = -1;
};

// Merges partial slots [first_partial, first_partial + num_partials), in
// order, into the output rows of one (batch, KV head range, q tile).
struct AttentionMergeTask {
  std::int32_t batch = 0, kv_head_begin = 0, kv_head_end = 1;
  std::int32_t q_begin = 0, q_end = 0;
  std::int32_t first_partial = 0, num_partials = 0;
};

struct AttentionPlan {
  AttentionShape shape;
  std::int32_t num_threads = 1;
  std::int32_t max_rows = 0;  // rows (heads x tokens x group) of the largest item
  // A row's result does not depend on its item's size: the kernel keeps one
  // summation order for decode and prefill rows (set by fixed_kv_chunk > 0).
  bool batch_invariant = false;
  bool bf16_products = false;  // AttentionPlanOptions::bf16_products (never with batch_invariant)
  bool int8_products = false;  // AttentionPlanOptions::int8_products (never with batch_invariant)
  bool f16_products = false;   // AttentionPlanOptions::f16_products (never with batch_invariant)
  bool fp8_fast_products = false;      // AttentionPlanOptions::fp8_fast_products (never with
                                       // batch_invariant)
  bool fast_prefill_products = false;  // AttentionPlanOptions::fast_prefill_products (never
                                       // with batch_invariant)
  bool measured_products = true;       // AttentionPlanOptions::measured_products
  // Longest first; each thread takes the next item as it finishes its last,
  // so a thread slowed by another tenant takes fewer. A row's result does
  // not depend on which thread runs its item.
  std::vector<AttentionWorkItem> items;
  std::vector<AttentionMergeTask> merges;
  std::int32_t num_partials = 0;
  std::size_t scratch_bytes_per_thread = 0;
  std::size_t partial_bytes = 0;    // all partial slots
  std::size_t workspace_bytes = 0;  // scratch for every thread + partials
};

// Splits the batch into work items (KV split where a few long sequences
// would leave threads idle) and orders them longest first, the order
// threads take them in. Depends only on its arguments.
AttentionPlan plan_attention(const PagedKVTable& table, const AttentionShape& shape,
                             const AttentionOptions& options,
                             const AttentionPlanOptions& plan_options = {});

// --- the optimised kernel (Highway SIMD, OpenMP threads) --------------------------
// `plan` must come from plan_attention on the same table, shape and options;
// `workspace` must hold plan.workspace_bytes, 64-byte aligned.
void paged_attention(const AttentionParams& params, const AttentionPlan& plan,
                     std::span<std::byte> workspace);

// Forces every paged_attention call onto the scalar reference (also set by
// the environment variable PAGEDATTN_FORCE_REFERENCE=1).
void set_force_reference_kernels(bool force);
bool force_reference_kernels();

// Owns a workspace and plans per call: the convenient entry point.
class AttentionRunner {
 public:
  explicit AttentionRunner(AttentionPlanOptions plan_options = {});
  void run(const AttentionParams& params);
  const AttentionPlan& last_plan() const { return plan_; }

 private:
  AttentionPlanOptions plan_options_;
  AttentionPlan plan_;
  std::vector<std::byte, std::allocator<std::byte>> storage_;
};

// --- the canonical reference (double accumulation; the oracle) ---------------
void paged_attention_reference(const AttentionParams& params);

// --- merging partial softmax states (split-KV, cascade) ------------------------
// v_* [num_rows][dim] normalised outputs, s_* [num_rows] natural-log LSE; an
// empty state has s = -inf. Writes the merged state to v_out, s_out (which may
// alias a). Validates sizes (InvalidArgument).
void merge_states(std::span<const float> v_a, std::span<const float> s_a,
                  std::span<const float> v_b, std::span<const float> s_b, std::span<float> v_out,
                  std::span<float> s_out, std::int32_t dim);

}  // namespace pagedattn
