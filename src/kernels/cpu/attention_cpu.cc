// The optimised CPU attention kernel: Highway SIMD with dynamic dispatch once
// per call, OpenMP threads over the planner's work items.
//
// A work item is one sequence, one KV head, a tile of query tokens (rows =
// tokens x the group's query heads) and a key range. Keys go in blocks of
// kKeyBlock; each block's K/V rows are read straight from the pages and
// converted in registers (dequantisation scales are applied per key to the
// score and to the softmax weight, not per element), so each K/V byte is
// read once per group. When many rows share a block (prefill) the block is
// first converted to f32 scratch, keys transposed: QK then runs as outer
// products (a query element broadcast against a vector of keys) and PV on
// full-width vectors, register-blocked, with no horizontal reductions.
// With bf16 products allowed (AVX512-BF16), prefill blocks run on vdpbf16ps
// over packed blocks (bf16_dot-inl.h) and decode blocks over bf16, f16 and
// fp8 KV on vdpbf16ps over rows converted in registers (bf16_decode-inl.h).
// Online softmax per row: (m, l, o), finalised to (o / l, m + log l), the
// form merge_into combines.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attention_cpu.h"
#include "convert.h"
#include "core/team.h"
#include "kernels/attention_traits.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/softmax_state.h"
#include "prefetch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h (its own block: clang-format sorts within one).
#include <hwy/contrib/math/math-inl.h>

#include "kernels/cpu/amx_bf16-inl.h"
#include "kernels/cpu/bf16_decode-inl.h"
#include "kernels/cpu/bf16_dot-inl.h"
#include "kernels/cpu/convert-inl.h"
#include "kernels/cpu/f16_decode-inl.h"
#include "kernels/cpu/int8_dot-inl.h"
#include "kernels/cpu/online_softmax-inl.h"
#include "kernels/cpu/reduce16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = DF8;
using VF = hn::Vec<DF>;
constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
// Steps (a block of keys for one KV head) between reading a step's rows and
// prefetching them: the lines in flight must cover DRAM latency at the
// rate the loops consume them.
constexpr int kPrefetchSteps = 2;
constexpr int kStepRing = kPrefetchSteps + 1;  // steps whose rows are held at once
// Accumulators a tile keeps in registers: AVX-512 has 32 vector registers,
// the other targets 16 (room for the loaded operands beside them).
constexpr int kAccRegs = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 ? 16 : 8;

// --- a block of keys ------------------------------------------------------------------

struct BlockSlots;

// Row pointers and per-key dequantisation scales of up to kKB keys; keys past
// `count` point at a zero row with scale 0, so loops always run kKB keys.
struct KeyBlock {
  const void* k[kKB];
  const void* v[kKB];
  // The rows processed kPrefetchSteps steps after these (a step: one KV
  // head's block; heads inner, so the rows of a later head or block); zero
  // rows when nothing follows. QK prefetches k_next while it reads k, PV
  // v_next while it reads v, a line at a time (ConvertBlock: both). "The
  // next head's rows" below means these.
  const void* const* k_next = nullptr;
  const void* const* v_next = nullptr;
  float k_scale[kKB];
  float v_scale[kKB];
  std::int32_t first = 0;  // key index of entry 0
  std::int32_t count = 0;
  const BlockSlots* slots = nullptr;  // where the keys live (for the scales)
  std::int32_t head = 0;              // KV head
  // Token-tree blocks only (else null): per key DFS interval and position.
  const std::int32_t* tree_enter = nullptr;
  const std::int32_t* tree_exit = nullptr;
  const std::int32_t* tree_position = nullptr;
};

struct Scratch {
  float* q;              // [rows][dq] queries x softmax scale
  float* o;              // [rows][dv] unnormalised outputs
  float* m;              // [rows]
  float* l;              // [rows]
  float* s;              // [rows][kKB] scores, then weights
  float* k;              // [kKB][dq] f32 copy of a block (prefill)
  float* v;              // [kKB][dv]
  std::uint16_t* qh;     // [rows][dq] bf16 or f16 queries (the bf16 / f16 product paths)
  float* qh_inv;         // [rows] inverse factors of the f16 queries
  std::int8_t* q8;       // [rows][dq] int8 queries (the int8 dot-product path)
  float* q8_scale;       // [rows]
  std::int32_t* q8_sum;  // [rows]
  float* w_scale;        // [rows] scales of a block's u8 weights
  const void* zero;      // a zero row (any dtype)
};

struct Item {
  const AttentionParams* p;
  const AttentionWorkItem* w;
  const KernelContext* c;
  Scratch sc;
  std::byte* partials;
};

// Walks the keys of a sequence page by page without a division per key.
struct KeyCursor {
  const PagedKVTable* t;
  std::int32_t b;
  std::int64_t page_index = 0;  // into the sequence's kv_indices
  std::int32_t offset = 0;
  void seek(std::int64_t j) {
    const std::int64_t slot = t->slot_of_key(b, j);
    page_index = slot / t->page_size;
    offset = static_cast<std::int32_t>(slot % t->page_size);
  }
  std::int32_t page() const { return t->kv_indices[t->kv_indptr[b] + page_index]; }
  // Advances from key j to key j + 1.
  void next(std::int64_t j) {
    if (t->kv_sink_lens != nullptr && j + 1 == t->kv_sink_lens[b]) return seek(j + 1);
    if (++offset == t->page_size) {
      offset = 0;
      ++page_index;
    }
  }
};

// Where keys [first, first + count) live, shared by all heads: page, in-page
// slot and the element offsets of their K and V rows without the head term.
struct BlockSlots {
  std::int32_t first = 0, count = 0;
  std::int32_t page[kKB];
  std::int32_t slot[kKB];
  std::int64_t k_off[kKB];
  std::int64_t v_off[kKB];
  // int8 KV only: runs of keys in consecutive slots of one page, whose token
  // scales lie side by side. Run i starts at key run_first[i]
  // (run_first[runs] = count) and its scales at run_scale_index(i, head).
  std::int32_t runs = 0;
  std::int32_t run_first[kKB + 1];
  std::int64_t run_scale[kKB];  // token_scale_index(page, 0, slot) of the run's first key
  std::int64_t run_scale_index(std::int32_t i, std::int32_t head, std::int32_t page_size) const {
    return run_scale[i] + std::int64_t{head} * page_size;
  }
  // e4m3 storage with page_may_hold_nan: whether a page of the block may hold
  // a NaN code (kMaybe) or none can (kNone); kUnknown without the flags.
  enum class Nan : std::uint8_t { kUnknown, kNone, kMaybe } nan = Nan::kUnknown;
  // Set when the block holds token-tree nodes: prefix keys get the interval
  // that contains every node (always visible) and their index as position.
  bool tree = false;
  std::int32_t tree_enter[kKB];
  std::int32_t tree_exit[kKB];
  std::int32_t tree_position[kKB];
};

void LocateTreeKeys(const TokenTreeMask& m, std::int32_t b, BlockSlots& bs) {
  bs.tree = m.active() && bs.first + bs.count > m.tree_begin[b];
  if (!bs.tree) return;
  for (std::int32_t jj = 0; jj < kKB; ++jj) {
    const std::int64_t j = bs.first + jj;
    const bool node = jj < bs.count && j >= m.tree_begin[b];
    bs.tree_enter[jj] =
        node ? m.enter[m.node_of_key(b, j)] : std::numeric_limits<std::int32_t>::min();
    bs.tree_exit[jj] =
        node ? m.exit[m.node_of_key(b, j)] : std::numeric_limits<std::int32_t>::max();
    bs.tree_position[jj] = node ? m.positions[m.node_of_key(b, j)] : static_cast<std::int32_t>(j);
  }
}

void LocateBlock(const Item& it, std::int32_t j0, std::int32_t count, BlockSlots& bs) {
  bs.first = j0;
  bs.count = count;
  bs.tree = false;
  bs.nan = BlockSlots::Nan::kUnknown;
  if (count == 0) return;
  const PagedKVStorage& kv = it.p->kv;
  KeyCursor cur{&it.p->table, it.w->batch};
  cur.seek(j0);
  for (std::int32_t jj = 0; jj < count; ++jj) {
    bs.page[jj] = cur.page();
    bs.slot[jj] = cur.offset;
    bs.k_off[jj] = kv.k_offset(bs.page[jj], 0, cur.offset);
    bs.v_off[jj] = kv.v_offset(bs.page[jj], 0, cur.offset);
    if (jj + 1 < count) cur.next(j0 + jj);
  }
  bs.runs = 0;
  if (kv.dtype == DType::kINT8) {
    for (std::int32_t jj = 0; jj < count; ++jj)
      if (jj == 0 || bs.page[jj] != bs.page[jj - 1] || bs.slot[jj] != bs.slot[jj - 1] + 1) {
        bs.run_first[bs.runs] = jj;
        bs.run_scale[bs.runs++] = kv.token_scale_index(bs.page[jj], 0, bs.slot[jj]);
      }
  }
  bs.run_first[bs.runs] = count;
  if (kv.dtype == DType::kFP8E4M3 && kv.page_may_hold_nan) {
    bool maybe = false;
    for (std::int32_t jj = 0; jj < count; ++jj) maybe |= kv.page_may_hold_nan[bs.page[jj]] != 0;
    bs.nan = maybe ? BlockSlots::Nan::kMaybe : BlockSlots::Nan::kNone;
  }
  LocateTreeKeys(it.p->tree_mask, it.w->batch, bs);
}

// Stored K/V need a per-key dequantisation scale (int8 per token, fp8 per
// head or tensor times the e4m3 format scale); float storage does not.
template <DType kT>
constexpr bool kScaled = is_quantized(kT);

// K and V row pointers of KV head h for the keys of a block (up to count).
template <DType kT>
void RowPointers(const Item& it, const BlockSlots& bs, std::int32_t h, const void** k,
                 const void** v) {
  const PagedKVStorage& kv = it.p->kv;
  constexpr auto elem = static_cast<std::int64_t>(dtype_size(kT));
  const auto* kbase = static_cast<const std::byte*>(kv.k_data) + h * kv.k_head_stride * elem;
  const auto* vbase = static_cast<const std::byte*>(kv.v_data) + h * kv.v_head_stride * elem;
  for (std::int32_t jj = 0; jj < bs.count; ++jj) {
    k[jj] = kbase + bs.k_off[jj] * elem;
    v[jj] = vbase + bs.v_off[jj] * elem;
  }
  for (std::int32_t jj = bs.count; jj < kKB; ++jj) k[jj] = v[jj] = it.sc.zero;
}

// Row pointers of KV head h for the block. Its int8 token scales are only
// prefetched here, a head-block before ReadScales reads them (they lie apart
// from the rows, a line per page and head: read now, each would wait on
// DRAM).
template <DType kT>
void GatherBlock(const Item& it, const BlockSlots& bs, std::int32_t h, KeyBlock& kb) {
  const PagedKVStorage& kv = it.p->kv;
  kb.first = bs.first;
  kb.count = bs.count;
  kb.slots = &bs;
  kb.head = h;
  kb.tree_enter = bs.tree ? bs.tree_enter : nullptr;
  kb.tree_exit = bs.tree ? bs.tree_exit : nullptr;
  kb.tree_position = bs.tree ? bs.tree_position : nullptr;
  RowPointers<kT>(it, bs, h, kb.k, kb.v);
  if constexpr (kT == DType::kINT8) {
    constexpr std::int64_t kScalesPerLine = kLineBytes / sizeof(float);
    for (std::int32_t r = 0; r < bs.runs; ++r) {
      const std::int64_t first = bs.run_scale_index(r, h, kv.page_size);
      const std::int64_t last = first + bs.run_first[r + 1] - bs.run_first[r] - 1;
      for (std::int64_t line = first / kScalesPerLine; line <= last / kScalesPerLine; ++line) {
        PrefetchToL2(kv.k_token_scales + std::max(first, line * kScalesPerLine));
        PrefetchToL2(kv.v_token_scales + std::max(first, line * kScalesPerLine));
      }
    }
  }
}

// The dequantisation scales of a gathered block (quantised KV only).
template <DType kT>
void ReadScales(const Item& it, KeyBlock& kb) {
  const PagedKVStorage& kv = it.p->kv;
  const BlockSlots& bs = *kb.slots;
  if constexpr (is_fp8(kT)) {  // one scale per head (or tensor): no lookups per key
    const float k_scale = kv.k_dequant(0, kb.head, 0) * kFormatScale<kT>;
    const float v_scale = kv.v_dequant(0, kb.head, 0) * kFormatScale<kT>;
    for (std::int32_t jj = 0; jj < kKB; ++jj) {
      kb.k_scale[jj] = jj < bs.count ? k_scale : 0.0f;
      kb.v_scale[jj] = jj < bs.count ? v_scale : 0.0f;
    }
    return;
  }
  for (std::int32_t r = 0; r < bs.runs; ++r) {  // int8: runs of token scales side by side
    const std::int64_t first = bs.run_scale_index(r, kb.head, kv.page_size);
    const float* k_scales = kv.k_token_scales + first;
    const float* v_scales = kv.v_token_scales + first;
    const std::int32_t jj0 = bs.run_first[r], n = bs.run_first[r + 1] - jj0;
    for (std::int32_t t = 0; t < n; ++t) {
      kb.k_scale[jj0 + t] = k_scales[t] * kFormatScale<kT>;
      kb.v_scale[jj0 + t] = v_scales[t] * kFormatScale<kT>;
    }
  }
  for (std::int32_t jj = bs.count; jj < kKB; ++jj) kb.k_scale[jj] = kb.v_scale[jj] = 0.0f;
}

// Converts kKB rows of `dim` kT elements to f32 rows at out (row stride
// `stride`) and repoints them there; prefetches the rows `next` meanwhile.
template <DType kT>
void ConvertRows(const void** rows, const void* const* next, std::size_t dim, std::size_t stride,
                 float* out) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  for (std::int32_t jj = 0; jj < kKB; ++jj) {
    float* row = out + std::size_t(jj) * stride;
    for (std::size_t d = 0; d < dim; d += n) {
      PrefetchLine<kT>(next[jj], d, dim);
      hn::Store(LoadConvert<kT>(rows[jj], d), df, row + d);
    }
    rows[jj] = row;
  }
}

// Converts a gathered block's V rows to f32 scratch rows and repoints them there.
template <DType kT>
void ConvertValues(const Item& it, KeyBlock& kb) {
  ConvertRows<kT>(kb.v, kb.v_next, std::size_t(it.c->v_head_dim), std::size_t(it.c->dv), it.sc.v);
}

// Converts a gathered block to f32 scratch rows and repoints it there.
template <DType kT>
void ConvertBlock(const Item& it, KeyBlock& kb) {
  ConvertRows<kT>(kb.k, kb.k_next, std::size_t(it.c->head_dim), std::size_t(it.c->dq), it.sc.k);
  ConvertValues<kT>(it, kb);
}

#if HWY_TARGET != HWY_SCALAR
// Stores 8 rows of 8 lanes transposed: lane i of every row goes to the 8
// floats at out + i * stride (three rounds of interleaves, 24 shuffles).
HWY_INLINE void StoreTransposed8x8(const VF* r, float* HWY_RESTRICT out, std::size_t stride) {
  const DF df;
  const hn::Repartition<std::uint64_t, DF> d64;
  hn::Vec<decltype(d64)> u[8];
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3
    const VF* x = r + 4 * h;
    const auto t0 = hn::BitCast(d64, hn::InterleaveLower(df, x[0], x[1]));
    const auto t1 = hn::BitCast(d64, hn::InterleaveUpper(df, x[0], x[1]));
    const auto t2 = hn::BitCast(d64, hn::InterleaveLower(df, x[2], x[3]));
    const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(df, x[2], x[3]));
    // u[4h + i]: lanes i and i + 4 of the four rows.
    u[4 * h + 0] = hn::InterleaveLower(d64, t0, t2);
    u[4 * h + 1] = hn::InterleaveUpper(d64, t0, t2);
    u[4 * h + 2] = hn::InterleaveLower(d64, t1, t3);
    u[4 * h + 3] = hn::InterleaveUpper(d64, t1, t3);
  }
  for (int i = 0; i < 4; ++i) {
    const VF lo = hn::BitCast(df, u[i]), hi = hn::BitCast(df, u[4 + i]);
    hn::Store(hn::ConcatLowerLower(df, hi, lo), df, out + std::size_t(i) * stride);
    hn::Store(hn::ConcatUpperUpper(df, hi, lo), df, out + std::size_t(i + 4) * stride);
  }
}
#endif

// Converts the block's K rows into it.sc.k transposed, [head_dim][kKB]: the
// layout of the outer-product QK (ScoreRowsOuter). Prefetches the following
// K rows meanwhile, as ConvertBlock does.
template <DType kT>
void TransposeKeys(const Item& it, const KeyBlock& kb) {
  const DF df;
  const std::size_t dim = std::size_t(it.c->head_dim);
  float* kt = it.sc.k;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(df) == 8) {
    for (std::int32_t j0 = 0; j0 < kKB; j0 += 8)
      for (std::size_t d = 0; d < dim; d += 8) {
        VF r[8];
        for (int i = 0; i < 8; ++i) {
          PrefetchLine<kT>(kb.k_next[j0 + i], d, dim);
          r[i] = LoadConvert<kT>(kb.k[j0 + i], d);
        }
        StoreTransposed8x8(r, kt + d * kKB + std::size_t(j0), kKB);
      }
    return;
  }
#endif
  {  // 128-bit and scalar targets: lane by lane
    const std::size_t n = hn::Lanes(df);
    HWY_ALIGN float lanes[hn::MaxLanes(df)];
    for (std::int32_t jj = 0; jj < kKB; ++jj)
      for (std::size_t d = 0; d < dim; d += n) {
        PrefetchLine<kT>(kb.k_next[jj], d, dim);
        hn::Store(LoadConvert<kT>(kb.k[jj], d), df, lanes);
        for (std::size_t i = 0; i < n; ++i) kt[(d + i) * kKB + std::size_t(jj)] = lanes[i];
      }
  }
}

// Whether the K or V rows of a gathered e4m3 block hold a NaN code: blocks
// without one (all but poisoned data) convert in registers without the NaN
// select (LoadConvert kNanFree), the instructions e4m3 decode is bound by.
// The block's page flags when the storage keeps them, else its bytes.
bool BlockHasE4M3Nan(const Item& it, const KeyBlock& kb) {
  if (kb.slots->nan != BlockSlots::Nan::kUnknown) return kb.slots->nan == BlockSlots::Nan::kMaybe;
  return HasE4M3Nan(kb.k, kKB, std::size_t(it.c->head_dim)) ||
         HasE4M3Nan(kb.v, kKB, std::size_t(it.c->v_head_dim));
}

// Inline RoPE: rotates the f32 key rows of the block at their positions.
void RotateKeys(const Item& it, const KeyBlock& kb) {
  const RopeConfig& rope = *it.p->options.key_rope;
  const KernelContext& c = *it.c;
  const std::int32_t r = rope.rotary_dim ? rope.rotary_dim : c.head_dim, half = r / 2;
  const bool neox = rope.style == RopeStyle::kNeox;
  for (std::int32_t jj = 0; jj < kb.count; ++jj) {
    float* k = it.sc.k + std::size_t(jj) * c.dq;
    const std::int64_t pos = kb.tree_position ? kb.tree_position[jj] : kb.first + jj;
    for (std::int32_t i = 0; i < half; ++i) {
      float cs, sn;
      rope_cos_sin(rope, r, pos, i, cs, sn);
      float& a = k[neox ? i : 2 * i];
      float& b = k[neox ? i + half : 2 * i + 1];
      const float x = a, y = b;
      a = x * cs - y * sn;
      b = y * cs + x * sn;
    }
  }
}

// --- QK ---------------------------------------------------------------------------------

// Sums each of 8 vectors: out[i] = sum of lanes of a[i].
HWY_INLINE void Reduce8(const VF* a, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  for (int i = 0; i < 8; ++i) out[i] = hn::GetLane(a[i]);
#else
  const DF df;
  constexpr std::size_t kMaxLanes = hn::MaxLanes(df);
  static_assert(kMaxLanes == 4 || kMaxLanes == 8, "DF has 4 or 8 f32 lanes");
  // Per 128-bit block: pairwise interleave-adds leave [s0 s1 s2 s3] partials.
  const hn::Repartition<std::uint64_t, DF> d64;
  VF partial[2];
  for (int half = 0; half < 2; ++half) {
    const VF* x = a + 4 * half;
    const VF t01 =
        hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
    const VF t23 =
        hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
    const auto u01 = hn::BitCast(d64, t01), u23 = hn::BitCast(d64, t23);
    partial[half] = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, u01, u23)),
                            hn::BitCast(df, hn::InterleaveUpper(d64, u01, u23)));
  }
  if constexpr (kMaxLanes == 8) {
    // Two 128-bit blocks per vector: add them, half 0's sums in the low block.
    hn::StoreU(hn::Add(hn::ConcatLowerLower(df, partial[1], partial[0]),
                       hn::ConcatUpperUpper(df, partial[1], partial[0])),
               df, out);
  } else {
    hn::StoreU(partial[0], df, out);
    hn::StoreU(partial[1], df, out + 4);
  }
#endif
}

// Pins a loaded vector to a register: GCC otherwise folds a load used by
// several FMAs into each of them as a memory operand, one load per FMA, and
// the QK tile becomes bound by the load ports instead of the FMA units.
// The operand is the raw intrinsic vector; "v" (any of xmm/ymm/zmm 0-31) also
// takes 512-bit vectors, which clang >= 16 refuses under "x" (SSE/AVX only).
template <class V>
HWY_INLINE V InRegister(V v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// The vector over K/V rows read from the cache for head dim kDim: the
// target's full width (16 lanes on AVX-512) where kDim is a multiple of 16,
// else at most 8 lanes (head dims are multiples of 8: rows never have tails).
template <int kDim>
using DRow = hn::CappedTag<float, (kDim > 0 && kDim % 16 == 0) ? 16 : 8>;

// Score accumulators a decode tile keeps: a tile of rows x keys fills them.
constexpr int kTileAccs = kAccRegs;

// Keys a score tile of `rows` rows takes: the most that fit kTileAccs
// accumulators, a power of two (tiles cover the block). Rows that do not
// divide kTileAccs (3, 5, 6, 7: GQA groups of SmolLM2, Llama 3.2 3B and
// Qwen2.5) leave some accumulators unused rather than split the group and
// read the keys twice.
constexpr int TileKeys(int rows) {
  return PowerOfTwoTileWidth(rows, kTileAccs);
}

// Row groups of the decode tiles, largest first: every group size up to 8
// where the registers hold 16 accumulators (a group of a KV head's query
// heads then reads each K and V vector once: GQA 3, 5, 6 and 7 no longer
// split into 2 + 1, 4 + 1, 4 + 2 and 4 + 2 + 1), else 4, 2, 1. A row's
// results do not depend on the group it falls in (every sum runs in the
// same order).
using DecodeRowGroups = std::conditional_t<kAccRegs >= 16, EveryRowGroup, RowGroups<4, 2, 1>>;

// Sums each of kN vectors of D (kN a multiple of 8; 16 on AVX-512 rows).
template <int kN, class D>
HWY_INLINE void ReduceAll(const hn::Vec<D>* a, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) == 16) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    static_assert(kN % 16 == 0, "16-lane tiles hold 16 accumulators");
    for (int i = 0; i < kN; i += 16) {
      __m512 raw[16];
      for (int j = 0; j < 16; ++j) raw[j] = a[i + j].raw;
      _mm512_storeu_ps(out + i, Reduce16(raw));
    }
#else
    static_assert(kN < 0, "16-lane rows only on AVX-512");
#endif
  } else {
    for (int i = 0; i < kN; i += 8) Reduce8(a + i, out + i);
  }
}

// Scores kRows rows x kKeys keys (kTileAccs of them) starting at key jj,
// loading keys as kLoad (kT, or f32 from the converted block) straight from
// their rows. kDim > 0 fixes the head dim at compile time (fully unrolled
// fast paths, full-width vectors). kPrefetch: the keys are read from the
// cache, so the next head's K rows (KeyBlock::k_next) are prefetched meanwhile.
// kNanFree: the rows hold no NaN code (LoadConvert).
template <DType kLoad, bool kScale, bool kPrefetch, int kDim, int kRows, int kKeys, bool kNanFree>
HWY_INLINE void ScoreTile(const Item& it, const KeyBlock& kb, std::int32_t row0, std::int32_t jj) {
  using D = DRow<kDim>;
  const D df;
  constexpr std::size_t n = hn::MaxLanes(df);
  const KernelContext& c = *it.c;
  // ReduceAll sums whole groups of 16 (or 8) vectors: the accumulators past
  // the tile's stay zero.
  constexpr int kReduceGroup = n == 16 ? 16 : 8;
  constexpr int kAccs = (kRows * kKeys + kReduceGroup - 1) / kReduceGroup * kReduceGroup;
  hn::Vec<D> acc[kAccs];
  for (auto& a : acc) a = hn::Zero(df);
  const float* q = it.sc.q + std::size_t(row0) * c.dq;
  const std::size_t dim = kDim > 0 ? std::size_t(kDim) : std::size_t(c.head_dim);
  for (std::size_t d = 0; d < dim; d += n) {
    hn::Vec<D> k[kKeys];
    for (int e = 0; e < kKeys; ++e) k[e] = LoadConvert<kLoad, kNanFree>(df, kb.k[jj + e], d);
    if constexpr (kPrefetch)
      for (int e = 0; e < kKeys; ++e) PrefetchLine<kLoad>(kb.k_next[jj + e], d, dim);
    for (int r = 0; r < kRows; ++r) {
      const auto qv = InRegister(hn::Load(df, q + std::size_t(r) * c.dq + d));
      for (int e = 0; e < kKeys; ++e) acc[r * kKeys + e] = hn::MulAdd(qv, k[e], acc[r * kKeys + e]);
    }
  }
  HWY_ALIGN float dots[kAccs];
  ReduceAll<kAccs, D>(acc, dots);
  // Each row's kKeys dots, times the keys' scales, in vectors of up to
  // kKeys lanes (a scalar loop here was 16 multiplies and stores a tile).
  const hn::CappedTag<float, kKeys> dk;
  constexpr int kStep = int(hn::MaxLanes(dk));
  static_assert(kKeys % kStep == 0, "whole vectors of a row's dots");
  for (int r = 0; r < kRows; ++r) {
    float* out = it.sc.s + std::size_t(row0 + r) * kKB + jj;
    for (int e = 0; e < kKeys; e += kStep) {
      const auto x = hn::LoadU(dk, dots + r * kKeys + e);
      hn::StoreU(kScale ? hn::Mul(x, hn::LoadU(dk, kb.k_scale + jj + e)) : x, dk, out + e);
    }
  }
}

// Scores kRows rows against the whole block, TileKeys(kRows) keys a tile.
// noipa (GCC): with this loop inlined into its caller, GCC 12 at -O3 computed
// wrong scores for the 7-row tile over scaled keys in f32 scratch rows (int8
// and fp8 K/V with inline RoPE; DecodeRowKeepsItsBitsInAnyGqaGroup and the
// random matrix found it; clang's build and GCC's with the loop kept apart
// are exact). A call per group and block costs nothing measurable.
#ifndef PAGEDATTN_SCORE_ROWS_ATTR
#if defined(__GNUC__) && !defined(__clang__)
#define PAGEDATTN_SCORE_ROWS_ATTR __attribute__((noipa))
#else
#define PAGEDATTN_SCORE_ROWS_ATTR HWY_INLINE
#endif
#endif
template <DType kLoad, bool kScale, bool kPrefetch, int kDim, int kRows, bool kNanFree>
PAGEDATTN_SCORE_ROWS_ATTR void ScoreRows(const Item& it, const KeyBlock& kb, std::int32_t r) {
  constexpr int kKeys = TileKeys(kRows);
  static_assert(kKB % kKeys == 0, "tiles cover the block");
  for (std::int32_t jj = 0; jj < kKB; jj += kKeys)
    ScoreTile<kLoad, kScale, kPrefetch, kDim, kRows, kKeys, kNanFree>(it, kb, r, jj);
}

// Scores the next group of rows from r against the block, the largest of
// DecodeRowGroups that fits; returns how many.
template <DType kLoad, bool kScale, bool kPrefetch, int kDim, bool kNanFree>
std::int32_t ScoreGroup(const Item& it, const KeyBlock& kb, std::int32_t r, std::int32_t row_end) {
  return DecodeRowGroups::VisitFirst(r, row_end, [&](auto rows, std::int32_t row) {
    ScoreRows<kLoad, kScale, kPrefetch, kDim, rows(), kNanFree>(it, kb, row);
  });
}

// Scores rows [row0, row_end) against the block; only the first group of
// rows prefetches (when reading from the cache): the lines are fetched once.
template <DType kLoad, bool kScale, bool kPrefetch, int kDim, bool kNanFree = false>
void ScoreBlock(const Item& it, const KeyBlock& kb, std::int32_t row0, std::int32_t row_end) {
  std::int32_t r = row0;
  if (r < row_end) r += ScoreGroup<kLoad, kScale, kPrefetch, kDim, kNanFree>(it, kb, r, row_end);
  while (r < row_end) r += ScoreGroup<kLoad, kScale, false, kDim, kNanFree>(it, kb, r, row_end);
}

// --- QK of many rows: outer products on transposed keys -------------------------------

// f32 vectors over scratch only (rows padded to 16 floats, blocks of 32
// keys), so full width on every target: 16 lanes on AVX-512.
using DW = hn::CappedTag<float, 16>;
using VW = hn::Vec<DW>;
constexpr int kKeyVecs = kKB / int(hn::MaxLanes(DW()));  // vectors per row of scores

// Scores kRows rows from row0 against the transposed block (TransposeKeys):
// per dimension, each row's query element is broadcast against kKeyVecs
// vectors of keys, so scores build up in lanes with no reductions.
template <bool kScale, int kDim, int kRows>
HWY_INLINE void ScoreRowsOuter(const Item& it, const KeyBlock& kb, std::int32_t row0) {
  const DW dw;
  constexpr std::size_t kN = hn::MaxLanes(dw);
  const KernelContext& c = *it.c;
  const std::size_t dim = kDim > 0 ? std::size_t(kDim) : std::size_t(c.head_dim);
  const float* q = it.sc.q + std::size_t(row0) * c.dq;
  const float* kt = it.sc.k;
  VW acc[kRows][kKeyVecs];
  for (auto& row : acc)
    for (auto& a : row) a = hn::Zero(dw);
  for (std::size_t d = 0; d < dim; ++d) {
    VW k[kKeyVecs];
    for (int e = 0; e < kKeyVecs; ++e) k[e] = InRegister(hn::Load(dw, kt + d * kKB + e * kN));
    for (int r = 0; r < kRows; ++r) {
      const VW qb = hn::Set(dw, q[std::size_t(r) * c.dq + d]);
      for (int e = 0; e < kKeyVecs; ++e) acc[r][e] = hn::MulAdd(qb, k[e], acc[r][e]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* out = it.sc.s + std::size_t(row0 + r) * kKB;
    for (int e = 0; e < kKeyVecs; ++e) {
      const VW x = kScale ? hn::Mul(acc[r][e], hn::LoadU(dw, kb.k_scale + e * kN)) : acc[r][e];
      hn::Store(x, dw, out + e * kN);
    }
  }
}

// Scores rows [row0, row_end) against the transposed block, kAccRegs /
// kKeyVecs rows at a time, then one at a time.
template <bool kScale, int kDim>
void ScoreBlockOuter(const Item& it, const KeyBlock& kb, std::int32_t row0, std::int32_t row_end) {
  constexpr int kRows = kAccRegs / kKeyVecs > 0 ? kAccRegs / kKeyVecs : 1;
  std::int32_t r = row0;
  for (; r + kRows <= row_end; r += kRows) ScoreRowsOuter<kScale, kDim, kRows>(it, kb, r);
  for (; r < row_end; ++r) ScoreRowsOuter<kScale, kDim, 1>(it, kb, r);
}

// --- masks, softcap, ALiBi, online softmax -----------------------------------------------

// A query row: its key index (causal and window limits), its position
// (ALiBi; differs from the index for token-tree nodes) and, for tree nodes,
// its DFS enter index.
struct RowQuery {
  std::int64_t index = 0;
  std::int64_t position = 0;
  std::int32_t tree_enter = 0;
};

RowQuery QueryOf(const Item& it, std::int64_t index) {
  const TokenTreeMask& m = it.p->tree_mask;
  const std::int32_t b = it.w->batch;
  if (!m.active() || index < m.tree_begin[b]) return {index, index, 0};
  const std::int64_t node = m.node_of_key(b, index);
  return {index, m.positions[node], m.enter[node]};
}

// Applies softcap, ALiBi and visibility to one row's scores (vectorised over keys).
void TransformRow(const Item& it, const KeyBlock& kb, std::int32_t row, const RowQuery& q,
                  std::int32_t head) {
  const DW df;
  const hn::RebindToSigned<DW> di;
  const std::size_t n = hn::Lanes(df);
  const AttentionOptions& opt = it.p->options;
  float* s = it.sc.s + std::size_t(row) * kKB;
  // Visible keys of this row within the block: [lo, hi).
  std::int64_t hi = kb.first + kb.count;
  if (opt.causal) hi = std::min<std::int64_t>(hi, q.index + 1);
  std::int64_t lo = kb.first;
  if (opt.window_left >= 0) lo = std::max<std::int64_t>(lo, q.index - opt.window_left);
  // Every key visible and no score transform: the common decode block.
  if (lo == kb.first && hi == kb.first + kKB && opt.softcap <= 0.0f && !opt.alibi_slopes &&
      !kb.tree_enter)
    return;
  // idx > lo - 1 and idx < hi, relative to the block (clamped to fit int32).
  const auto vlo =
      hn::Set(di, static_cast<std::int32_t>(std::clamp<std::int64_t>(lo - kb.first, 0, kKB) - 1));
  const auto vhi =
      hn::Set(di, static_cast<std::int32_t>(std::clamp<std::int64_t>(hi - kb.first, -1, kKB)));
  const float slope = opt.alibi_slopes ? opt.alibi_slopes[head] : 0.0f;
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) {
    VW x = hn::LoadU(df, s + i);
    if (opt.softcap > 0.0f) {
      const VW cap = hn::Set(df, opt.softcap);
      x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
    }
    const auto idx = hn::Iota(di, static_cast<std::int32_t>(i));
    if (opt.alibi_slopes) {
      // Key position minus query position (tree blocks carry key positions).
      const auto key_pos = kb.tree_position
                               ? hn::LoadU(di, kb.tree_position + i)
                               : hn::Add(idx, hn::Set(di, static_cast<std::int32_t>(kb.first)));
      const VW dist =
          hn::ConvertTo(df, hn::Sub(key_pos, hn::Set(di, static_cast<std::int32_t>(q.position))));
      x = hn::MulAdd(hn::Set(df, slope), dist, x);
    }
    auto visible = hn::And(hn::Gt(idx, vlo), hn::Lt(idx, vhi));
    if (kb.tree_enter) {  // ancestor-or-self: enter[k] <= enter[q] <= exit[k]
      const auto above = hn::Set(di, q.tree_enter + 1), below = hn::Set(di, q.tree_enter - 1);
      visible = hn::And(visible, hn::And(hn::Lt(hn::LoadU(di, kb.tree_enter + i), above),
                                         hn::Gt(hn::LoadU(di, kb.tree_exit + i), below)));
    }
    hn::StoreU(hn::IfThenElse(hn::RebindMask(df, visible), x, hn::Set(df, kNegInf)), df, s + i);
  }
}

// Online-softmax update of one row; leaves the weights (x value scale when
// kScale) in s. A NaN score makes l NaN for good: the row's output and LSE
// come out NaN (Max and Exp would drop it).
template <bool kScale>
void SoftmaxRow(const Item& it, const KeyBlock& kb, std::int32_t row) {
  const DW df;
  const std::size_t n = hn::Lanes(df);
  const KernelContext& c = *it.c;
  float* s = it.sc.s + std::size_t(row) * kKB;
  VW vmax = hn::Set(df, kNegInf);
  auto nan = hn::FirstN(df, 0);
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) {
    const VW x = hn::LoadU(df, s + i);
    vmax = hn::Max(vmax, x);
    nan = hn::Or(nan, hn::IsNaN(x));
  }
  if (!hn::AllFalse(df, nan)) it.sc.l[row] = std::numeric_limits<float>::quiet_NaN();
  const float m_old = it.sc.m[row];
  const float m_new = std::max(hn::GetLane(hn::MaxOfLanes(df, vmax)), m_old);
  if (m_new == kNegInf) {  // nothing visible yet
    std::fill_n(s, kKB, 0.0f);
    return;
  }
  const VW vm = hn::Set(df, m_new);
  VW vsum = hn::Zero(df);
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) {
    const VW e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm));
    vsum = hn::Add(vsum, e);
    hn::StoreU(kScale ? hn::Mul(e, hn::LoadU(df, kb.v_scale + i)) : e, df, s + i);
  }
  const float corr = m_old == m_new ? 1.0f : m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
  it.sc.l[row] = it.sc.l[row] * corr + hn::GetLane(hn::SumOfLanes(df, vsum));
  it.sc.m[row] = m_new;
  if (corr != 1.0f) {
    float* o = it.sc.o + std::size_t(row) * c.dv;
    const VW vc = hn::Set(df, corr);
    for (std::size_t d = 0; d < std::size_t(c.v_head_dim); d += n)
      hn::Store(hn::Mul(hn::Load(df, o + d), vc), df, o + d);
  }
}

// Masks and score transforms of rows [row0, row_end) of a scored block
// (rows of one KV head, tokens in order). A whole block visible to every
// row, with no transform, returns at once (what TransformRow does row by
// row): most of a long prefill.
void TransformRows(const Item& it, const RowMap& map, const KeyBlock& kb, std::int32_t row0,
                   std::int32_t row_end, std::int64_t first_pos) {
  const AttentionOptions& opt = it.p->options;
  const std::int64_t first_query = first_pos + map.token_in_tile(row0);
  if (kb.count == kKB && opt.window_left < 0 && opt.softcap <= 0.0f && !opt.alibi_slopes &&
      !kb.tree_enter && (!opt.causal || kb.first + kKB <= first_query + 1))
    return;
  for (std::int32_t row = row0; row < row_end; ++row)
    TransformRow(it, kb, row, QueryOf(it, first_pos + map.token_in_tile(row)),
                 static_cast<std::int32_t>(map.qo_head(row)));
}

// Masks, score transforms and the online-softmax update of rows [row0,
// row_end) of a scored block: every path's step between QK and PV. On
// AVX-512, 16 rows at a time (softmax16::Update), else row by row.
// kRoundedWeights: the caller rounds the weights to bf16 or u8 next
// (softmax16::StoreWeightsF32Rounded on AVX-512).
template <bool kScale, bool kRoundedWeights = false>
void SoftmaxRows(const Item& it, const RowMap& map, const KeyBlock& kb, std::int32_t row0,
                 std::int32_t row_end, std::int64_t first_pos) {
  TransformRows(it, map, kb, row0, row_end, first_pos);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  using Store = std::conditional_t<kRoundedWeights, softmax16::StoreWeightsF32Rounded,
                                   softmax16::StoreWeightsF32>;
  const KernelContext& c = *it.c;
  for (std::int32_t r = row0; r < row_end; r += softmax16::kMaxRows)
    softmax16::Update<Store>(it.sc.s + std::size_t(r) * kKB, it.sc.m + r, it.sc.l + r,
                             it.sc.o + std::size_t(r) * c.dv, std::size_t(c.dv),
                             std::size_t(c.v_head_dim), kScale ? kb.v_scale : nullptr,
                             std::min<std::int32_t>(softmax16::kMaxRows, row_end - r));
#else
  for (std::int32_t row = row0; row < row_end; ++row) SoftmaxRow<kScale>(it, kb, row);
#endif
}

// --- PV -----------------------------------------------------------------------------------

// The largest divisor of n that is at most cap (n, cap >= 1).
constexpr int LargestDivisorAtMost(int n, int cap) {
  for (int d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

// o[row0 .. row0 + kRows) += weights x V over the block, on vectors of D:
// kRows x kVecs output vectors stay in registers over the block's keys (4 x 4
// x 16 lanes on AVX-512), each weight broadcast straight from the scores
// once per row, key and pass; dims left over 8 lanes at a time (head dims
// are multiples of 8). V rows are read as kLoad: kT from the cache, or f32
// from converted scratch rows. kPrefetch: the V rows are read from the
// cache, so the next head's V rows (KeyBlock::v_next) are prefetched meanwhile.
// kNanFree: the rows hold no NaN code (LoadConvert).
template <class D, DType kLoad, bool kPrefetch, int kDim, int kRows, bool kNanFree>
HWY_INLINE void AccumulateRows(const Item& it, const KeyBlock& kb, std::int32_t row0) {
  const D df;
  constexpr std::size_t n = hn::MaxLanes(df);
  constexpr int kMaxVecs = kAccRegs / kRows > 0 ? kAccRegs / kRows : 1;
  // A fixed head dim: passes of equal width over it (3 rows: 4 of the 5
  // vectors that fit, not 5 and a tail of 8-lane passes).
  constexpr int kVecs =
      kDim > 0 ? LargestDivisorAtMost(kDim / int(n), kMaxVecs) : std::min(kMaxVecs, 4);
  // Vectors start at multiples of n, so PrefetchLine sees every line start.
  static_assert(kLineBytes / dtype_size(kLoad) % n == 0, "a line holds whole vectors");
  const std::size_t stride = std::size_t(it.c->dv);
  const std::int32_t count = kb.count;
  const float* w = it.sc.s + std::size_t(row0) * kKB;
  float* o = it.sc.o + std::size_t(row0) * stride;
  const std::size_t dv = kDim > 0 ? std::size_t(kDim) : std::size_t(it.c->v_head_dim);
  std::size_t d = 0;
  for (; d + kVecs * n <= dv; d += kVecs * n) {
    hn::Vec<D> acc[kRows][kVecs];
    for (int r = 0; r < kRows; ++r)
      for (int e = 0; e < kVecs; ++e) acc[r][e] = hn::Load(df, o + r * stride + d + e * n);
    for (std::int32_t jj = 0; jj < count; ++jj) {
      hn::Vec<D> x[kVecs];
      for (int e = 0; e < kVecs; ++e) {
        if constexpr (kPrefetch) PrefetchLine<kLoad>(kb.v_next[jj], d + e * n, dv);
        x[e] = InRegister(LoadConvert<kLoad, kNanFree>(df, kb.v[jj], d + e * n));
      }
      for (int r = 0; r < kRows; ++r) {
        const auto wr = hn::Set(df, w[r * kKB + jj]);
        for (int e = 0; e < kVecs; ++e) acc[r][e] = hn::MulAdd(wr, x[e], acc[r][e]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int e = 0; e < kVecs; ++e) hn::Store(acc[r][e], df, o + r * stride + d + e * n);
  }
  if constexpr (kDim == 0 || kDim % (kVecs * n) != 0) {
    const DF d8;
    for (; d < dv; d += hn::Lanes(d8)) {
      VF acc[kRows];
      for (int r = 0; r < kRows; ++r) acc[r] = hn::Load(d8, o + r * stride + d);
      for (std::int32_t jj = 0; jj < count; ++jj) {
        if constexpr (kPrefetch) PrefetchLine<kLoad>(kb.v_next[jj], d, dv);
        const VF x = LoadConvert<kLoad, kNanFree>(d8, kb.v[jj], d);
        for (int r = 0; r < kRows; ++r)
          acc[r] = hn::MulAdd(hn::Set(d8, w[r * kKB + jj]), x, acc[r]);
      }
      for (int r = 0; r < kRows; ++r) hn::Store(acc[r], d8, o + r * stride + d);
    }
  }
}

// o[row] += weights x V for the next group of rows from r (DecodeRowGroups
// if kMaxRows allows 8, else 4, 2 or 1); returns how many.
template <class D, DType kLoad, bool kPrefetch, int kDim, int kMaxRows, bool kNanFree>
std::int32_t AccumulateGroup(const Item& it, const KeyBlock& kb, std::int32_t r,
                             std::int32_t row_end) {
  using Groups = std::conditional_t<kMaxRows >= 8, DecodeRowGroups, RowGroups<4, 2, 1>>;
  return Groups::VisitFirst(r, row_end, [&](auto rows, std::int32_t row) {
    AccumulateRows<D, kLoad, kPrefetch, kDim, rows(), kNanFree>(it, kb, row);
  });
}

// o[row] += weights x V for rows [row0, row_end), V read from the cache as
// kLoad: groups of up to 8 rows on AVX-512 (a GQA-8 group converts each V
// vector once), else 4; only the first group prefetches (the lines are
// fetched once).
template <DType kLoad, bool kPrefetch, int kDim, bool kNanFree = false>
void AccumulateBlock(const Item& it, const KeyBlock& kb, std::int32_t row0, std::int32_t row_end) {
  using D = DRow<kDim>;
  constexpr int kMaxRows = kAccRegs >= 16 ? 8 : 4;
  std::int32_t r = row0;
  if (r < row_end)
    r += AccumulateGroup<D, kLoad, kPrefetch, kDim, kMaxRows, kNanFree>(it, kb, r, row_end);
  while (r < row_end)
    r += AccumulateGroup<D, kLoad, false, kDim, kMaxRows, kNanFree>(it, kb, r, row_end);
}

// o[row] += weights x V for rows [row0, row_end) over f32 scratch rows
// (padded to 16 floats: full width whatever the head dim), 4 rows at a time.
template <int kDim>
void AccumulateBlockWide(const Item& it, const KeyBlock& kb, std::int32_t row0,
                         std::int32_t row_end) {
  std::int32_t r = row0;
  while (r < row_end)
    r += AccumulateGroup<DW, DType::kF32, false, kDim, 4, false>(it, kb, r, row_end);
}

// --- one work item -------------------------------------------------------------------------

void InitRows(const Item& it, const RowMap& map, std::int32_t rows) {
  const AttentionParams& p = *it.p;
  const KernelContext& c = *it.c;
  for (std::int32_t row = 0; row < rows; ++row) {
    const std::int64_t off = map.token(row) * p.q.token_stride + map.qo_head(row) * p.q.head_stride;
    const auto* q_in =
        static_cast<const std::byte*>(p.q.data) + off * std::int64_t(dtype_size(p.q.dtype));
    convert_row(q_in, p.q.dtype, it.sc.q + std::size_t(row) * c.dq, DType::kF32, c.head_dim,
                c.scale);
    std::fill_n(it.sc.o + std::size_t(row) * c.dv, c.dv, 0.0f);
    it.sc.m[row] = kNegInf;
    it.sc.l[row] = 0.0f;
  }
}

// Finalises each row to (o / l, lse) and writes it to the partial slot or,
// through the sink, to the output.
void FinishRows(const Item& it, const RowMap& map, std::int32_t rows) {
  const KernelContext& c = *it.c;
  const AttentionWorkItem& w = *it.w;
  for (std::int32_t row = 0; row < rows; ++row) {
    float* o = it.sc.o + std::size_t(row) * c.dv;
    // l == 0: no key visible (o = 0, lse = -inf). A NaN l (a NaN logit)
    // stays NaN in o and lse, as the reference gives it.
    const float l = it.sc.l[row];
    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
    for (std::int32_t d = 0; d < c.v_head_dim; ++d) o[d] *= inv;
    const float lse = l == 0.0f ? kNegInf : it.sc.m[row] + std::log(l);
    if (w.partial >= 0) {
      std::byte* slot = it.partials + std::size_t(w.partial) * c.partial_slot_bytes;
      std::memcpy(slot + std::size_t(row) * c.dv * sizeof(float), o,
                  std::size_t(c.dv) * sizeof(float));
      reinterpret_cast<float*>(slot + c.partial_lse_offset)[row] = lse;
      continue;
    }
    write_output_row(*it.p, map.token(row), map.qo_head(row), o, lse);
  }
}

// Rows per head above which a block is converted to f32 scratch once (keys
// transposed) rather than converted in registers for every group of 4 rows.
constexpr std::int32_t kConvertRows = 8;

// Up to this many decode rows (one query token, a row per query head) per KV
// head score straight from the K rows: for them the outer products'
// transposed copy of every block costs more than it saves (multi-head
// latent attention's 16 heads over 576-wide rows, docs/benchmarks.md).
constexpr std::int32_t kDecodeDotRows = 16;

// Whether an item's blocks take the outer-product path: many rows share a
// block (prefill, or decode with more than kDecodeDotRows heads per KV
// head). Keys to rotate need f32 scratch rows, and a batch-invariant plan (a
// row's bits independent of its batch mates) keeps every row on the decode
// path's summation order.
bool OuterProducts(const Item& it, std::int32_t rows_per_head) {
  const bool decode = it.w->q_end - it.w->q_begin == 1;
  return rows_per_head > (decode ? kDecodeDotRows : kConvertRows) &&
         it.p->options.key_rope == nullptr && !it.c->batch_invariant;
}

// Whether the outer products (prefill tiles) run on bf16 dot products: where
// the plan allows them and they pay (KernelContext::bf16_dot), on AVX-512
// targets of CPUs with AVX512-BF16, for KV stored in 16 bits or fewer (f32
// KV keeps f32 products).
template <DType kT>
bool Bf16Dot(const Item& it) {
#if PAGEDATTN_BF16_DOT_TARGET
  return kT != DType::kF32 && it.c->bf16_dot;
#else
  (void)it;
  return false;
#endif
}

// KV types whose decode rows run on bf16 dot products (bf16_decode-inl.h)
// when Bf16Decode allows them (bf16_decode_kernel): those that convert to
// bf16 exactly, and f16 (rounded to bf16, as prefill does). int8 stays on
// f32 FMAs.
template <DType kT>
constexpr bool kBf16DecodeType = bf16_decode_type(kT);

// KV types whose decode rows run on f16 multiply-adds (f16_decode-inl.h)
// when F16Decode allows them.
template <DType kT>
constexpr bool kF16DecodeType = f16_decode_type(kT);

// Whether an item's decode blocks may take the f16 path: e4m3 or f16 KV,
// few rows per head (not the outer products), no keys to rotate, and the
// plan, CPU and head dims allow it (KernelContext::f16_decode). Blocks the
// path cannot take (BlockProbe), and items whose queries are not finite,
// keep f32 products.
template <DType kT>
bool F16Decode(const Item& it, std::int32_t rows_per_head) {
  return kF16DecodeType<kT> && it.c->f16_decode && it.p->options.key_rope == nullptr &&
         !OuterProducts(it, rows_per_head);
}

// Whether an item's blocks take the bf16 decode path: few rows per head (not
// the outer products), no keys to rotate, a kernel for the KV type, and the
// plan allowing it where it pays (KernelContext::bf16_decode).
template <DType kT>
bool Bf16Decode(const Item& it, std::int32_t rows_per_head) {
#if PAGEDATTN_BF16_DOT_TARGET
  return kBf16DecodeType<kT> && it.c->bf16_decode && !F16Decode<kT>(it, rows_per_head) &&
         it.p->options.key_rope == nullptr && !OuterProducts(it, rows_per_head);
#else
  (void)it;
  (void)rows_per_head;
  return false;
#endif
}

#if PAGEDATTN_F16_DECODE_TARGET
// One e4m3 or f16 decode block for rows [row0, row_end) on f16
// multiply-adds (f16_decode-inl.h): QK on the f16 queries (RoundQueries)
// against K rows read (or converted) in registers, masks and the online
// softmax in f32 (weights without the V scale, which is uniform over the
// head's keys and applied as the f16 sums are widened), PV on the weights
// rounded to f16. Returns false, having changed no state, when QK's probe
// finds what the path cannot take (an e4m3 NaN code; f16 V past its bound,
// or f16 scores that came out infinite or NaN): the f32 path takes the block.
template <DType kT, int kDim>
bool ProcessHeadBlockF16Decode(const Item& it, const RowMap& map, KeyBlock& kb, std::int32_t row0,
                               std::int32_t row_end, std::int64_t first_pos) {
  const KernelContext& c = *it.c;
  const std::int32_t rows = row_end - row0;
  // e4m3 blocks on pages the writers flagged free of NaN codes: nothing for
  // the probe of their bytes to find (f16 rows are probed for their bound).
  const bool probe_rows = kT != DType::kFP8E4M3 || kb.slots->nan != BlockSlots::Nan::kNone;
  if (!f16dec::ScoreBlock<kT, kDim>(
          it.sc.qh + std::size_t(row0) * c.dq, std::size_t(c.dq), it.sc.qh_inv + row0, kb.k, kb.v,
          kb.k_next, std::size_t(c.head_dim), std::size_t(c.v_head_dim),
          kScaled<kT> ? kb.k_scale : nullptr, it.sc.s + std::size_t(row0) * kKB, rows, probe_rows))
    return false;
  SoftmaxRows<false>(it, map, kb, row0, row_end, first_pos);
  f16dec::RoundWeights(it.sc.s, row0, row_end);
  f16dec::AccumulateBlock<kT, kDim>(it.sc.s + std::size_t(row0) * kKB, kb.v, kb.v_next, kb.count,
                                    std::size_t(c.v_head_dim), kScaled<kT> ? kb.v_scale[0] : 1.0f,
                                    it.sc.o + std::size_t(row0) * c.dv, std::size_t(c.dv), rows);
  return true;
}
#endif

#if PAGEDATTN_BF16_DOT_TARGET
// One decode block for rows [row0, row_end) on bf16 dot products
// (bf16_decode-inl.h): QK on K rows converted in registers, masks and the
// online softmax in f32, PV on the weights rounded to bf16. QK prefetches the
// next head's K rows, PV its V rows (a head ahead, into L2).
template <DType kT, int kDim>
void ProcessHeadBlockBf16Decode(const Item& it, const RowMap& map, KeyBlock& kb, std::int32_t row0,
                                std::int32_t row_end, std::int64_t first_pos) {
  const KernelContext& c = *it.c;
  const std::int32_t rows = row_end - row0;
  const std::size_t dk = std::size_t(c.head_dim), dv = std::size_t(c.v_head_dim);
  if constexpr (kBf16DecodeType<kT>) {
    bf16dec::ScoreBlock<kT, kDim>(it.sc.qh + std::size_t(row0) * c.dq, std::size_t(c.dq), kb.k,
                                  kb.k_next, dk, kScaled<kT> ? kb.k_scale : nullptr,
                                  it.sc.s + std::size_t(row0) * kKB, rows);
    SoftmaxRows<kScaled<kT>, true>(it, map, kb, row0, row_end, first_pos);
    bf16dot::RoundWeights(it.sc.s, row0, row_end);
    bf16dec::AccumulateBlock<kT, kDim>(it.sc.s + std::size_t(row0) * kKB, kb.v, kb.v_next, kb.count,
                                       dv, it.sc.o + std::size_t(row0) * c.dv, std::size_t(c.dv),
                                       rows);
  }
}

// One block for rows [row0, row_end) on bf16 dot products (vdpbf16ps,
// bf16_dot-inl.h): packs K and V, scores, applies masks and the online
// softmax in f32, then PV on the weights rounded to bf16. (On AMX tiles,
// ProcessTileSteps takes several blocks a step.)
template <DType kT, int kDim>
void ProcessHeadBlockBf16(const Item& it, const RowMap& map, KeyBlock& kb, std::int32_t row0,
                          std::int32_t row_end, std::int64_t first_pos) {
  const KernelContext& c = *it.c;
  auto* kt = reinterpret_cast<std::uint32_t*>(it.sc.k);
  auto* vp = reinterpret_cast<std::uint32_t*>(it.sc.v);
  if constexpr (kT != DType::kF32) {
    bf16dot::PackKeys<kT>(kb.k, kb.k_next, std::size_t(c.head_dim), kt);
    bf16dot::PackValues<kT>(kb.v, kb.v_next, std::size_t(c.v_head_dim), std::size_t(c.dv), vp);
  }
  bf16dot::ScoreBlock<kDim>(it.sc.qh, std::size_t(c.dq), kt, std::size_t(c.head_dim),
                            kScaled<kT> ? kb.k_scale : nullptr, it.sc.s, row0, row_end);
  SoftmaxRows<kScaled<kT>, true>(it, map, kb, row0, row_end, first_pos);
  bf16dot::RoundWeights(it.sc.s, row0, row_end);
  bf16dot::AccumulateBlock<kDim>(it.sc.s, vp, std::size_t(c.dv), kb.count, it.sc.o, row0, row_end);
}

constexpr std::int32_t kTileBlocks = AttentionTraits::kTileBlocks;

// The item's blocks on AMX tiles (prefill with bf16 products; ProcessItem
// configures the tiles): per KV head, steps of up to kTileBlocks blocks (256
// keys). Each block is packed (bf16dot::PackKeys / PackValues, prefetching
// the next block's rows), scored and masked into its own score array
// ([kTileBlocks][rows][kKB] scratch), then one online-softmax update over
// the step's blocks (amx::SoftmaxStep, which leaves bf16 weights), and PV
// loads and stores each output tile once a step (amx::AccumulateStep), not
// once a block.
template <DType kT>
void ProcessTileSteps(const Item& it, const RowMap& map, std::int32_t rows,
                      std::int64_t first_pos) {
  const AttentionWorkItem& w = *it.w;
  const KernelContext& c = *it.c;
  const std::size_t dq = std::size_t(c.dq), dv = std::size_t(c.dv);
  const std::size_t s_block = std::size_t(rows) * kKB, k_block = dq / 2 * kKB,
                    v_block = kKB / 2 * dv;
  auto* kt = reinterpret_cast<std::uint32_t*>(it.sc.k);
  auto* vp = reinterpret_cast<std::uint32_t*>(it.sc.v);
  const std::int32_t blocks = (w.kv_end - w.kv_begin + kKB - 1) / kKB;
  BlockSlots slots[kTileBlocks];
  KeyBlock kbs[kTileBlocks];
  for (std::int32_t first_block = 0; first_block < blocks; first_block += kTileBlocks) {
    const int n = std::min(kTileBlocks, blocks - first_block);
    for (int b = 0; b < n; ++b) {
      const std::int32_t j0 = w.kv_begin + (first_block + b) * kKB;
      LocateBlock(it, j0, std::min(w.kv_end - j0, kKB), slots[b]);
    }
    for (std::int32_t head = 0; head < w.kv_head_end - w.kv_head_begin; ++head) {
      const std::int32_t row0 = head * map.per_head, row_end = row0 + map.per_head;
      for (int b = 0; b < n; ++b) GatherBlock<kT>(it, slots[b], w.kv_head_begin + head, kbs[b]);
      const float* k_scales[kTileBlocks];
      const float* v_scales[kTileBlocks];
      std::int32_t counts[kTileBlocks];
      for (int b = 0; b < n; ++b) {
        KeyBlock& kb = kbs[b];
        if constexpr (kScaled<kT>) ReadScales<kT>(it, kb);
        const KeyBlock& next = kbs[(b + 1) % n];  // the step's last block: rows already read
        bf16dot::PackKeys<kT>(kb.k, next.k, std::size_t(c.head_dim), kt + b * k_block);
        bf16dot::PackValues<kT>(kb.v, next.v, std::size_t(c.v_head_dim), dv, vp + b * v_block);
        k_scales[b] = kb.k_scale;
        v_scales[b] = kb.v_scale;
        counts[b] = kb.count;
      }
      amx::ScoreStep(it.sc.qh, dq, std::size_t(c.head_dim),
                     {kt, k_block, it.sc.s, s_block, kScaled<kT> ? k_scales : nullptr, n}, row0,
                     row_end);
      for (int b = 0; b < n; ++b) {
        Item block_item = it;  // the block's own score rows
        block_item.sc.s = it.sc.s + b * s_block;
        TransformRows(block_item, map, kbs[b], row0, row_end, first_pos);
      }
      amx::SoftmaxStep(it.sc.s, s_block, n, it.sc.m, it.sc.l, it.sc.o, dv,
                       std::size_t(c.v_head_dim), kScaled<kT> ? v_scales : nullptr, row0, row_end);
      amx::AccumulateStep({it.sc.s, s_block, vp, v_block, n}, counts, dv, it.sc.o, row0, row_end);
    }
  }
}
#endif

// Whether an item with `rows_per_head` rows per KV head takes the int8
// dot-product path: int8 KV, decode rows (the non-outer-product path), no
// keys to rotate, and the plan, CPU and head dims allow it (int8_dot).
template <DType kT>
bool Int8Dot(const Item& it, std::int32_t rows_per_head) {
#if PAGEDATTN_INT8_DOT_TARGET
  return kT == DType::kINT8 && it.c->int8_dot && rows_per_head <= kConvertRows &&
         it.p->options.key_rope == nullptr;
#else
  (void)it;
  (void)rows_per_head;
  return false;
#endif
}

#if PAGEDATTN_INT8_DOT_TARGET
// One block for rows [row0, row_end) on int8 dot products (int8_dot-inl.h):
// packs K, scores (prefetching the next head's K rows), applies masks and
// the online softmax in f32, rounds the weights to u8 and runs PV on V
// packed in key quads (prefetching the next head's V rows).
template <int kDim>
void ProcessHeadBlockInt8(const Item& it, const RowMap& map, KeyBlock& kb, std::int32_t row0,
                          std::int32_t row_end, std::int64_t first_pos) {
  const KernelContext& c = *it.c;
  auto* kt = reinterpret_cast<std::uint32_t*>(it.sc.k);
  auto* vp = reinterpret_cast<std::uint32_t*>(it.sc.v);
  int8dot::PackKeys(kb.k, std::size_t(c.head_dim), kt);
  int8dot::ScoreBlock<kDim>(it.sc.q8, std::size_t(c.dq), it.sc.q8_scale, it.sc.q8_sum, kt,
                            std::size_t(c.head_dim), kb.k_scale, it.sc.s, row0, row_end, kb.k_next);
  SoftmaxRows<true, true>(it, map, kb, row0, row_end, first_pos);
  int8dot::QuantizeWeights(it.sc.s, it.sc.w_scale, row0, row_end);
  int8dot::AccumulateBlock<kDim>(it.sc.s, it.sc.w_scale, kb.v, vp, std::size_t(c.v_head_dim),
                                 std::size_t(c.dv), it.sc.o, row0, row_end, kb.v_next);
}
#endif

// One block of keys for one KV head's rows [row0, row_end). f16_queries:
// the item's queries are rounded to f16 (F16Decode, RoundQueries).
template <DType kT, int kDim>
void ProcessHeadBlock(const Item& it, const RowMap& map, KeyBlock& kb, std::int32_t row0,
                      std::int32_t row_end, std::int64_t first_pos, bool f16_queries) {
  if constexpr (kScaled<kT>) ReadScales<kT>(it, kb);
#if PAGEDATTN_F16_DECODE_TARGET
  if constexpr (kF16DecodeType<kT>)
    if (f16_queries && ProcessHeadBlockF16Decode<kT, kDim>(it, map, kb, row0, row_end, first_pos))
      return;
#else
  (void)f16_queries;
#endif
#if PAGEDATTN_INT8_DOT_TARGET
  if (Int8Dot<kT>(it, row_end - row0))
    return ProcessHeadBlockInt8<kDim>(it, map, kb, row0, row_end, first_pos);
#endif
  const bool rotate_keys = it.p->options.key_rope != nullptr;
  // Many rows share the block (prefill): outer-product QK on transposed
  // keys (bf16 dot products, or f32), PV on converted values. Keys to
  // rotate: f32 scratch rows.
  const bool outer = OuterProducts(it, row_end - row0);
#if PAGEDATTN_BF16_DOT_TARGET
  if (outer && Bf16Dot<kT>(it))
    return ProcessHeadBlockBf16<kT, kDim>(it, map, kb, row0, row_end, first_pos);
  if (Bf16Decode<kT>(it, row_end - row0))
    return ProcessHeadBlockBf16Decode<kT, kDim>(it, map, kb, row0, row_end, first_pos);
#endif
  // e4m3 decode: blocks with no NaN code skip the NaN select (kE4M3: only
  // e4m3 instantiates those loops).
  constexpr bool kE4M3 = kT == DType::kFP8E4M3;
  const bool nan_free = kE4M3 && !outer && !rotate_keys && !BlockHasE4M3Nan(it, kb);
  if (outer) {
    TransposeKeys<kT>(it, kb);
    ConvertValues<kT>(it, kb);
    ScoreBlockOuter<kScaled<kT>, kDim>(it, kb, row0, row_end);
  } else if (rotate_keys) {
    ConvertBlock<kT>(it, kb);
    RotateKeys(it, kb);
    ScoreBlock<DType::kF32, kScaled<kT>, false, kDim>(it, kb, row0, row_end);
  } else if (nan_free) {
    ScoreBlock<kT, kScaled<kT>, true, kDim, kE4M3>(it, kb, row0, row_end);
  } else {
    ScoreBlock<kT, kScaled<kT>, true, kDim>(it, kb, row0, row_end);
  }
  SoftmaxRows<kScaled<kT>>(it, map, kb, row0, row_end, first_pos);
  if (outer || rotate_keys)
    AccumulateBlockWide<kDim>(it, kb, row0, row_end);
  else if (nan_free)
    AccumulateBlock<kT, true, kDim, kE4M3>(it, kb, row0, row_end);
  else
    AccumulateBlock<kT, true, kDim>(it, kb, row0, row_end);
}

template <DType kT, int kDim>
void ProcessItem(const Item& it) {
  const AttentionWorkItem& w = *it.w;
  const PagedKVTable& t = it.p->table;
  const RowMap map = row_map(*it.p, *it.c, w.batch, w.kv_head_begin, w.q_begin, w.q_end);
  const std::int32_t rows = map.per_head * (w.kv_head_end - w.kv_head_begin);
  const std::int64_t first_pos = std::int64_t{t.kv_lens[w.batch]} - t.q_len(w.batch) + w.q_begin;
  InitRows(it, map, rows);
#if PAGEDATTN_BF16_DOT_TARGET
  const bool outer_bf16 = OuterProducts(it, map.per_head) && Bf16Dot<kT>(it);
  const bool bf16_decode = Bf16Decode<kT>(it, map.per_head);
  if (outer_bf16 || bf16_decode)
    bf16dot::RoundRows(it.sc.q, rows, std::size_t(it.c->head_dim), std::size_t(it.c->dq), it.sc.qh);
  if constexpr (bf16dec::kQueriesInBlockOrder<kT>)
    if (bf16_decode)
      bf16dec::PrepareQueries(it.sc.qh, rows, std::size_t(it.c->head_dim), std::size_t(it.c->dq));
  if constexpr (bf16dec::kQueriesInRowGroups<kT>)
    if (bf16_decode)
      bf16dec::PrepareRowGroups<kT>(it.sc.qh, w.kv_head_end - w.kv_head_begin, map.per_head,
                                    std::size_t(it.c->head_dim), std::size_t(it.c->dq));
  if (outer_bf16 && it.c->amx_bf16) {
    amx::ConfigureTiles();
    ProcessTileSteps<kT>(it, map, rows, first_pos);
    amx::ReleaseTiles();
    return FinishRows(it, map, rows);
  }
#endif
  bool f16_queries = false;
#if PAGEDATTN_F16_DECODE_TARGET
  if constexpr (kF16DecodeType<kT>)
    if (F16Decode<kT>(it, map.per_head))
      f16_queries = f16dec::RoundQueries<kT>(it.sc.q, rows, std::size_t(it.c->head_dim),
                                             std::size_t(it.c->dq), it.sc.qh, it.sc.qh_inv);
#endif
#if PAGEDATTN_INT8_DOT_TARGET
  if (Int8Dot<kT>(it, map.per_head))
    int8dot::QuantizeRows(it.sc.q, rows, std::size_t(it.c->head_dim), std::size_t(it.c->dq),
                          it.sc.q8, it.sc.q8_scale, it.sc.q8_sum);
#endif
  // Steps walk (block, KV head) pairs, heads inner. The rows of the step
  // kPrefetchSteps ahead are prefetched while a step runs: rings hold the
  // gathered row pointers of the steps in between and the located slots of
  // their blocks (the blocks of steps past the end are empty: zero rows).
  const std::int32_t heads_per_block = w.kv_head_end - w.kv_head_begin;
  const std::int64_t steps =
      std::int64_t{(w.kv_end - w.kv_begin + kKB - 1) / kKB} * heads_per_block;
  BlockSlots slots[kStepRing];
  KeyBlock heads[kStepRing];
  auto gather = [&](std::int64_t step) {
    const auto block = static_cast<std::int32_t>(step / heads_per_block);
    const auto head = static_cast<std::int32_t>(step % heads_per_block);
    BlockSlots& bs = slots[block % kStepRing];
    const std::int32_t j0 = w.kv_begin + block * kKB;
    if (head == 0) LocateBlock(it, j0, std::clamp(w.kv_end - j0, 0, kKB), bs);
    GatherBlock<kT>(it, bs, w.kv_head_begin + head, heads[step % kStepRing]);
  };
  for (std::int64_t step = 0; step < kPrefetchSteps; ++step) gather(step);
  for (std::int64_t step = 0; step < steps; ++step) {
    gather(step + kPrefetchSteps);
    KeyBlock& kb = heads[step % kStepRing];
    const KeyBlock& ahead = heads[(step + kPrefetchSteps) % kStepRing];
    kb.k_next = ahead.k;
    kb.v_next = ahead.v;
    const auto row0 = static_cast<std::int32_t>(step % heads_per_block) * map.per_head;
    ProcessHeadBlock<kT, kDim>(it, map, kb, row0, row0 + map.per_head, first_pos, f16_queries);
  }
  FinishRows(it, map, rows);
}

// Head dims fixed at compile time pay on 256- and 512-bit vectors (unrolled
// rows; 16 lanes on AVX-512). On 128-bit targets (SSE4, and the portable
// fallback) a fixed dim would only unroll the same 4-lane loops, summing in
// the same order: they run the generic dim alone, so the targets few CPUs
// still run compile one kernel per K/V type instead of four.
constexpr bool kFixedHeadDims = HWY_MAX_BYTES > 16;

// Fast paths for the common head dims (K and V equal); others run generic.
template <DType kT>
void ProcessItemAnyDim(const Item& it) {
  if constexpr (kFixedHeadDims) {
    const std::int32_t d = it.c->head_dim == it.c->v_head_dim ? it.c->head_dim : 0;
    if (d == 64) return ProcessItem<kT, 64>(it);
    if (d == 128) return ProcessItem<kT, 128>(it);
    if (d == 256) return ProcessItem<kT, 256>(it);
  }
  ProcessItem<kT, 0>(it);
}

void ProcessItemAnyType(const Item& it) {
  switch (it.p->kv.dtype) {
    case DType::kF32:
      return ProcessItemAnyDim<DType::kF32>(it);
    case DType::kF16:
      return ProcessItemAnyDim<DType::kF16>(it);
    case DType::kBF16:
      return ProcessItemAnyDim<DType::kBF16>(it);
    case DType::kFP8E4M3:
      return ProcessItemAnyDim<DType::kFP8E4M3>(it);
    case DType::kFP8E5M2:
      return ProcessItemAnyDim<DType::kFP8E5M2>(it);
    case DType::kINT8:
      return ProcessItemAnyDim<DType::kINT8>(it);
  }
}

Scratch ThreadScratch(std::byte* base, const KernelContext& c) {
  const ScratchLayout& l = c.layout;
  auto at = [&](std::size_t off) { return reinterpret_cast<float*>(base + off); };
  return {at(l.q),        at(l.o),
          at(l.m),        at(l.l),
          at(l.s),        at(l.k),
          at(l.v),        reinterpret_cast<std::uint16_t*>(base + l.qh),
          at(l.qh_inv),   reinterpret_cast<std::int8_t*>(base + l.q8),
          at(l.q8_scale), reinterpret_cast<std::int32_t*>(base + l.q8_sum),
          at(l.w_scale),  base + l.zero};
}

// Thread `thread`'s slot of the workspace, its zeroed part cleared.
Scratch ZeroedScratch(std::byte* workspace, const AttentionPlan& plan, const KernelContext& ctx,
                      int thread) {
  std::byte* base = workspace + plan.scratch_bytes_per_thread * std::size_t(thread);
  std::memset(base + ctx.layout.zero, 0, ctx.layout.zero_bytes);
  return ThreadScratch(base, ctx);
}

// The items, then the merges, on a team's threads (core/team.h): the
// team's own worksharing, no region of its own. Each thread's scratch is its
// slot of the workspace.
void RunInTeam(const AttentionParams& p, const AttentionPlan& plan, std::byte* workspace,
               const KernelContext& ctx, std::byte* partials) {
  if (omp_get_num_threads() > plan.num_threads) {  // more threads than scratch slots
    core::on_one_thread([&] {
      const Scratch sc = ZeroedScratch(workspace, plan, ctx, 0);
      for (const AttentionWorkItem& item : plan.items)
        ProcessItemAnyType({&p, &item, &ctx, sc, partials});
      for (const AttentionMergeTask& m : plan.merges)
        merge_partials(p, ctx, m, partials, 0, plan.max_rows);
    });
    return;
  }
  const Scratch sc = ZeroedScratch(workspace, plan, ctx, omp_get_thread_num());
  // Items are ordered longest first: dynamic chunks of one even the threads out.
#pragma omp for schedule(dynamic) nowait
  for (std::size_t i = 0; i < plan.items.size(); ++i)
    ProcessItemAnyType({&p, &plan.items[i], &ctx, sc, partials});
  core::team_barrier();
  if (plan.merges.empty()) return;  // every thread has the same plan: none waits below
  const std::size_t merge_blocks = plan.merges.size() * merge_blocks_per_merge(plan);
#pragma omp for schedule(dynamic) nowait
  for (std::size_t b = 0; b < merge_blocks; ++b) merge_block(p, ctx, plan, partials, b);
  core::team_barrier();
}

void RunAttention(const AttentionParams& p, const AttentionPlan& plan, std::byte* workspace) {
  const KernelContext ctx = make_kernel_context(p, plan);
  std::byte* partials = workspace + plan.scratch_bytes_per_thread * std::size_t(plan.num_threads);
  if (core::in_team()) return RunInTeam(p, plan, workspace, ctx, partials);
  // The next item to take: threads share it, so however fast each runs (or
  // however few threads OpenMP gives), all finish close together.
  std::atomic<std::size_t> next_item{0};
#pragma omp parallel num_threads(plan.num_threads)
  {
    const Scratch sc = ZeroedScratch(workspace, plan, ctx, omp_get_thread_num());
    for (std::size_t i = next_item.fetch_add(1, std::memory_order_relaxed); i < plan.items.size();
         i = next_item.fetch_add(1, std::memory_order_relaxed))
      ProcessItemAnyType({&p, &plan.items[i], &ctx, sc, partials});
    if (!plan.merges.empty()) {  // the same on every thread
#pragma omp barrier
      const std::size_t merge_blocks = plan.merges.size() * merge_blocks_per_merge(plan);
#pragma omp for schedule(dynamic)
      for (std::size_t b = 0; b < merge_blocks; ++b) merge_block(p, ctx, plan, partials, b);
    }
  }
}

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::kernels {
HWY_EXPORT(RunAttention);

void run_attention_cpu(const AttentionParams& params, const AttentionPlan& plan,
                       std::byte* workspace) {
  HWY_DYNAMIC_DISPATCH(RunAttention)(params, plan, workspace);
}
}  // namespace pagedattn::kernels
#endif
