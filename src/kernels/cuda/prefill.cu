// Prefill attention on tensor cores, FlashAttention-2 style: one CTA per
// work item, four warps that each own 16 of the item's kPrefillRows packed
// (token, query head) rows. Every K/V tile is loaded once into shared
// memory, converted to the compute type (bf16 for bf16 pages, else f16: f16,
// fp8 and int8 codes convert exactly), and serves all rows, so a GQA group
// reads its KV head once. Per key tile a warp forms S = Q K^T, runs the
// online softmax in f32 on its rows in registers (mask, scale, softcap,
// ALiBi in the order of docs/semantics.md), rounds P to the compute type
// and accumulates P V in f32.
//
// The products are mma.sync.m16n8k16 with ldmatrix operands, not wmma:
// their register layouts are specified by the PTX ISA (so the softmax and
// the per-row rescaling work on the accumulators directly), and wmma's bf16
// loads compile to generic loads instead of ldmatrix. Fragment layouts, with
// g = lane / 4 and t = lane % 4 (PTX ISA, "mma.m16n8k16"):
//   A (16x16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16x8, f32):  c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
// A lane of a warp thus holds rows g and g + 8 of its 16; the four lanes of
// a quad (same g) hold the rest of those rows.
//
// Wide V heads (v_head_dim > 256, MLA's 512) are served in column slices of
// at most 256: the key loop runs once per slice, recomputing the same
// softmax statistics, so the output accumulators always fit in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_args.h"
#include "kernels/cuda/dtype.cuh"
#include "pagedattn/errors.h"

namespace pagedattn::cuda::detail {
namespace {

constexpr int kWarpRows = 16;  // rows of one warp (the mma's M)
constexpr int kWarps = kPrefillRows / kWarpRows;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 8;  // compute-type elements per 16-byte chunk (an ldmatrix row)
constexpr int kMaxKeyTile = 64;
constexpr int kMaxHeadDim = 16384;
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

// n8 tiles of the output accumulators per V slice: 8, 16 or 32 (64, 128 or
// 256 columns). The key tile shrinks with the accumulators so registers
// and shared memory stay bounded.
constexpr int key_tile_for(int v_tiles) {
  return v_tiles > 16 ? 32 : kMaxKeyTile;
}

// --- shared memory layout (host and device) ----------------------------------

// Addresses of one key tile's rows and their dequantisation, filled once per
// tile so the loaders and the softmax need no page-table lookups.
struct KeyInfo {
  std::int64_t k_offset[kMaxKeyTile];  // element offset of the K row; -1: a zero row
  std::int64_t v_offset[kMaxKeyTile];
  float k_scale[kMaxKeyTile];  // int8: K dequantisation (0 for zero rows)
  float v_ratio[kMaxKeyTile];  // int8: V dequantisation / the CTA's v_ref (0 for zero rows)
};

// The kernel's tile shape and shared-memory carve-up, a function of the head
// dims only (prefill_launch sizes it without knowing the storage).
struct PrefillLayout {
  int key_tile = 0;    // keys per tile: 64 or 32
  int qk_cols = 0;     // head_dim rounded up to 16 (zero padded)
  int v_tiles = 0;     // n8 accumulator tiles per V slice: 8, 16 or 32
  int v_cols = 0;      // columns of a V tile: min(8 v_tiles, v_head_dim rounded up to 16)
  int num_slices = 0;  // V slices of 8 v_tiles columns
  // Row strides in elements, padded by one 16-byte chunk so the eight rows
  // an ldmatrix reads fall in distinct banks.
  int q_stride = 0, k_stride = 0, v_stride = 0;
  // Byte offsets: Q [64][q_stride], K [key_tile][k_stride], V
  // [key_tile][v_stride] (compute type), KeyInfo[2], f32 reduce[kWarps].
  int q_at = 0, k_at = 0, v_at = 0, info_at = 0, reduce_at = 0;
  int bytes = 0;
};

constexpr int round_up(int x, int to) {
  return (x + to - 1) / to * to;
}

PrefillLayout prefill_layout(int head_dim, int v_head_dim) {
  require(head_dim >= 1 && v_head_dim >= 1, "prefill: head dims must be >= 1, got head_dim ",
          head_dim, ", v_head_dim ", v_head_dim);
  // Far beyond any shared memory; keeps the byte counts below in range.
  require<Unsupported>(head_dim <= kMaxHeadDim && v_head_dim <= kMaxHeadDim,
                       "prefill: head dims above ", kMaxHeadDim, " are not served, got head_dim ",
                       head_dim, ", v_head_dim ", v_head_dim);
  PrefillLayout l;
  l.qk_cols = round_up(head_dim, 16);
  const int v_padded = round_up(v_head_dim, 16);
  l.v_tiles = v_padded <= 64 ? 8 : (v_padded <= 128 ? 16 : 32);
  l.key_tile = key_tile_for(l.v_tiles);
  l.v_cols = v_padded < l.v_tiles * 8 ? v_padded : l.v_tiles * 8;
  l.num_slices = (v_padded + l.v_tiles * 8 - 1) / (l.v_tiles * 8);
  l.q_stride = l.k_stride = l.qk_cols + kChunk;
  l.v_stride = l.v_cols + kChunk;
  constexpr int kCompute = 2, kAlign = 128;  // bytes per compute-type element
  int at = 0;
  const auto region = [&at](int bytes) {
    const int begin = at;
    at = round_up(at + bytes, kAlign);
    return begin;
  };
  l.q_at = region(kPrefillRows * l.q_stride * kCompute);
  l.k_at = region(l.key_tile * l.k_stride * kCompute);
  l.v_at = region(l.key_tile * l.v_stride * kCompute);
  l.info_at = region(2 * static_cast<int>(sizeof(KeyInfo)));
  l.reduce_at = region(kWarps * static_cast<int>(sizeof(float)));
  l.bytes = at;
  return l;
}

// --- element conversions --------------------------------------------------------

template <DType kKv>
using ComputeType = std::conditional_t<kKv == DType::kBF16, __nv_bfloat16, __half>;

template <DType kKv>
constexpr bool kSixteenBit = kKv == DType::kF16 || kKv == DType::kBF16;

template <DType kKv>
using StoredCode = std::conditional_t<kSixteenBit<kKv>, unsigned short, unsigned char>;

template <class CT>
__device__ __forceinline__ CT to_compute(float x) {
  if constexpr (std::is_same_v<CT, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// Two f32 rounded to the compute type, `lo` in the low half (the element
// with the lower column index, as mma operands want it).
template <class CT>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<CT, __half>) {
    const __half2 pair = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&pair);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&pair);
  }
}

template <DType kKv>
constexpr __nv_fp8_interpretation_t kFp8Kind = kKv == DType::kFP8E4M3 ? __NV_E4M3 : __NV_E5M2;

// Stored code `code` (the raw bits of one K/V element) in the compute type,
// exactly (every fp8 and int8 value is an f16; NaN codes stay NaN).
template <DType kKv>
__device__ __forceinline__ ComputeType<kKv> code_to_compute(unsigned code) {
  if constexpr (kKv == DType::kF16) {
    return __ushort_as_half(static_cast<unsigned short>(code));
  } else if constexpr (kKv == DType::kBF16) {
    return __ushort_as_bfloat16(static_cast<unsigned short>(code));
  } else if constexpr (kKv == DType::kINT8) {
    return __int2half_rn(static_cast<std::int8_t>(code));
  } else {
    return __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), kFp8Kind<kKv>);
  }
}

// Two 8-bit codes (the first in the low byte) as two f16, the first in the
// low half; fp8 pairs convert in one instruction on sm_89 and newer.
template <DType kKv>
__device__ __forceinline__ unsigned code_pair_to_half2(unsigned codes) {
  if constexpr (kKv == DType::kINT8) {
    const unsigned short lo = __half_as_ushort(code_to_compute<kKv>(codes & 0xffu));
    const unsigned short hi = __half_as_ushort(code_to_compute<kKv>((codes >> 8) & 0xffu));
    return lo | (static_cast<unsigned>(hi) << 16);
  } else {
    const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), kFp8Kind<kKv>);
    return pair.x | (static_cast<unsigned>(pair.y) << 16);
  }
}

// --- tensor-core primitives (PTX) ----------------------------------------------------

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 16-bit matrices; lanes 8i..8i+7 address the rows of matrix i, and
// register i of lane L receives row L / 4, columns 2 (L % 4) and + 1 of it.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each matrix transposed: register i of lane L receives rows
// 2 (L % 4) and + 1, column L / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a b for a 16x16 A, a 16x8 B and a 16x8 f32 accumulator.
template <class CT>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (std::is_same_v<CT, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// --- tile loads --------------------------------------------------------------------

__device__ __forceinline__ void store_zero_chunk(void* dst) {
  *static_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
}

// Eight compute-type elements at `dst` (shared, 16-byte aligned) from the
// stored elements src[0, valid), zeros after. 16-bit pages go by cp.async
// when the chunk is whole and aligned; other chunks convert through registers.
template <DType kKv>
__device__ __forceinline__ void load_chunk(ComputeType<kKv>* dst, const StoredCode<kKv>* src,
                                           int valid) {
  const auto address = reinterpret_cast<std::uintptr_t>(src);
  if constexpr (kSixteenBit<kKv>) {
    if (valid >= kChunk && address % 16 == 0) {
      __pipeline_memcpy_async(dst, src, 16);
      return;
    }
  } else {
    if (valid >= kChunk && address % 8 == 0) {
      const uint2 raw = *reinterpret_cast<const uint2*>(src);  // codes 0-3, 4-7 (little endian)
      *reinterpret_cast<uint4*>(dst) =
          make_uint4(code_pair_to_half2<kKv>(raw.x), code_pair_to_half2<kKv>(raw.x >> 16),
                     code_pair_to_half2<kKv>(raw.y), code_pair_to_half2<kKv>(raw.y >> 16));
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kChunk; ++e)
    dst[e] = e < valid ? code_to_compute<kKv>(src[e]) : to_compute<ComputeType<kKv>>(0.0f);
}

// Rows [0, key_tile) of a K or V tile: columns [0, cols) of `tile` get the
// stored elements [col0, col0 + valid) of each key's row (zeros after), and
// the rows of keys no row may see (offset -1) are zeros, never read.
template <DType kKv>
__device__ void load_tile(ComputeType<kKv>* tile, int stride, int cols, const void* data,
                          const std::int64_t* row_offset, int col0, int valid, int key_tile) {
  const auto* base = static_cast<const StoredCode<kKv>*>(data);
  const int chunks_per_row = cols / kChunk;
  for (int idx = threadIdx.x; idx < key_tile * chunks_per_row; idx += kThreads) {
    const int r = idx / chunks_per_row, d0 = (idx - r * chunks_per_row) * kChunk;
    ComputeType<kKv>* dst = tile + r * stride + d0;
    const std::int64_t offset = row_offset[r];
    if (offset < 0 || d0 >= valid) {
      store_zero_chunk(dst);
    } else {
      load_chunk<kKv>(dst, base + offset + col0 + d0, valid - d0);
    }
  }
}

// --- the work item ---------------------------------------------------------------

struct ItemGeometry {
  int batch = 0, kv_head = 0, head_begin = 0, heads = 0, rows = 0;
  int kv_len = 0;
  std::int64_t token0 = 0;  // global index of the item's first query token
  std::int64_t q_pos0 = 0;  // that token's absolute position (bottom-right causal)
  // Keys some row may see: every row's visible keys within [kv_begin,
  // kv_end) lie in [lo, hi) (both visibility limits grow with the
  // position), and only these keys are ever read.
  int lo = 0, hi = 0;
  const std::int32_t* pages = nullptr;  // the sequence's page ids
};

__device__ ItemGeometry item_geometry(const AttentionArgs& a, const CudaWorkItem& item) {
  ItemGeometry g;
  g.batch = item.batch;
  g.head_begin = item.qo_head_begin;
  g.heads = item.qo_head_end - item.qo_head_begin;
  g.kv_head = item.qo_head_begin / a.group;
  const int tokens = item.q_end - item.q_begin;
  g.rows = tokens > 0 && g.heads > 0 ? min(tokens * g.heads, kPrefillRows) : 0;
  const int q_len = a.qo_indptr[g.batch + 1] - a.qo_indptr[g.batch];
  g.kv_len = a.kv_lens[g.batch];
  g.token0 = static_cast<std::int64_t>(a.qo_indptr[g.batch]) + item.q_begin;
  g.q_pos0 = static_cast<std::int64_t>(g.kv_len) - q_len + item.q_begin;
  const std::int64_t q_pos_last = g.q_pos0 + tokens - 1;
  const std::int64_t lo =
      max(first_visible_key(a, g.q_pos0), static_cast<std::int64_t>(item.kv_begin));
  const std::int64_t hi = min(end_visible_key(a, q_pos_last, g.kv_len),
                              static_cast<std::int64_t>(min(item.kv_end, g.kv_len)));
  g.lo = static_cast<int>(max(lo, std::int64_t{0}));
  g.hi = static_cast<int>(max(hi, static_cast<std::int64_t>(g.lo)));
  g.pages = a.kv_indices + a.kv_indptr[g.batch];
  return g;
}

// Physical slot of key j within the sequence's pages: page slot / page_size
// at offset slot % page_size. 32-bit, as the page table's counts are (a
// 64-bit division is a slow library call on the GPU).
__device__ __forceinline__ unsigned slot_of(const AttentionArgs& a, const ItemGeometry& g, int j) {
  return static_cast<unsigned>(slot_of_key(a, g.batch, j));
}

// Page id holding key j, or -1 for keys outside [lo, hi) (never read). The
// kernel loads it a tile before fill_key_info uses it, so the page-table
// read does not stall the warps that fill the key info.
__device__ __forceinline__ int page_of_key(const AttentionArgs& a, const ItemGeometry& g, int j) {
  if (j < g.lo || j >= g.hi) return -1;
  return g.pages[slot_of(a, g, j) / static_cast<unsigned>(a.kv.page_size)];
}

// Dequantisation common to the CTA's keys. int8 scales are per key (in
// KeyInfo); fp8 scales are per tensor or head; 16-bit pages have none.
// P holds softmax weight x (V scale / v_ref), so int8 per-token scales
// (often far below 1) do not push P into the compute type's subnormals;
// outputs are multiplied by v_ref.
struct Dequant {
  float k_scale = 1.0f;  // fp8
  float v_ratio = 1.0f;  // fp8: V scale / v_ref
  float v_ref = 1.0f;
};

// Needs every thread (int8: a block reduction through `reduce`).
template <DType kKv>
__device__ Dequant cta_dequant(const AttentionArgs& a, const ItemGeometry& g, float* reduce) {
  Dequant dq;
  float v_ref = 1.0f;
  if constexpr (kKv == DType::kINT8) {
    float local = 0.0f;
    for (int j = g.lo + static_cast<int>(threadIdx.x); j < g.hi; j += kThreads) {
      const unsigned offset = slot_of(a, g, j) % static_cast<unsigned>(a.kv.page_size);
      local = fmaxf(local, fabsf(a.kv.v_dequant(page_of_key(a, g, j), g.kv_head, offset)));
    }
    for (int shift = 16; shift > 0; shift /= 2)
      local = fmaxf(local, __shfl_xor_sync(kFullMask, local, shift));
    if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = local;
    __syncthreads();
    v_ref = reduce[0];
    for (int w = 1; w < kWarps; ++w) v_ref = fmaxf(v_ref, reduce[w]);
  } else if constexpr (is_fp8(kKv)) {
    // Scales are per tensor or head, so (page, slot) do not matter.
    dq.k_scale = a.kv.k_dequant(0, g.kv_head, 0);
    v_ref = fabsf(a.kv.v_dequant(0, g.kv_head, 0));
  }
  // NaN, infinite or zero scales reach the outputs through the ratios.
  dq.v_ref = v_ref > 0.0f && v_ref <= 3.4e38f ? v_ref : 1.0f;
  if constexpr (is_fp8(kKv)) dq.v_ratio = a.kv.v_dequant(0, g.kv_head, 0) / dq.v_ref;
  return dq;
}

// This thread's row (key t0 + threadIdx.x, in `page`) of the key info of
// the tile starting at key t0; called by the first key_tile threads.
template <DType kKv>
__device__ void fill_key_info(KeyInfo& info, const AttentionArgs& a, const ItemGeometry& g, int t0,
                              int page, float v_ref) {
  const int r = threadIdx.x;
  if (page < 0) {
    info.k_offset[r] = info.v_offset[r] = -1;
    info.k_scale[r] = info.v_ratio[r] = 0.0f;
    return;
  }
  const unsigned offset = slot_of(a, g, t0 + r) % static_cast<unsigned>(a.kv.page_size);
  info.k_offset[r] = a.kv.k_offset(page, g.kv_head, offset);
  info.v_offset[r] = a.kv.v_offset(page, g.kv_head, offset);
  if constexpr (kKv == DType::kINT8) {
    info.k_scale[r] = a.kv.k_dequant(page, g.kv_head, offset);
    info.v_ratio[r] = a.kv.v_dequant(page, g.kv_head, offset) / v_ref;
  }
}

// Q rows of the item, rounded to the compute type, in 8-column chunks;
// padding rows and columns are zeros. Queries already in the compute type
// are copied 16 bytes at a time where aligned.
template <class CT>
__device__ void load_q_tile(CT* q_tile, const PrefillLayout& l, const AttentionArgs& a,
                            const ItemGeometry& g, int head_dim) {
  constexpr DType kComputeDType = std::is_same_v<CT, __half> ? DType::kF16 : DType::kBF16;
  const int chunks_per_row = l.qk_cols / kChunk;
  for (int idx = threadIdx.x; idx < kPrefillRows * chunks_per_row; idx += kThreads) {
    const int r = idx / chunks_per_row, d0 = (idx - r * chunks_per_row) * kChunk;
    CT* dst = q_tile + r * l.q_stride + d0;
    if (r >= g.rows || d0 >= head_dim) {
      store_zero_chunk(dst);
      continue;
    }
    const std::int64_t token = g.token0 + r / g.heads, head = g.head_begin + r % g.heads;
    const std::int64_t base = token * a.q.token_stride + head * a.q.head_stride + d0;
    const int valid = min(kChunk, head_dim - d0);
    if (a.q.dtype == kComputeDType && valid == kChunk) {
      const CT* src = static_cast<const CT*>(a.q.data) + base;
      if (reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        continue;
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e)
      dst[e] = to_compute<CT>(e < valid ? load_activation(a.q.data, a.q.dtype, base + e) : 0.0f);
  }
}

// --- per-row state ------------------------------------------------------------------

// One query row of a lane (rows g and g + 8 of its warp): the quad's four
// lanes hold the same row state.
struct RowState {
  int first = 0, end = 0;  // visible keys [first, end) within [lo, hi)
  std::int64_t q_pos = 0;
  float slope = 0.0f;   // ALiBi slope, 0 without
  float m = -INFINITY;  // running max of the logits (natural units), quad-wide
  float l = 0.0f;       // this lane's share of the weight sum
};

__device__ RowState init_row(const AttentionArgs& a, const ItemGeometry& g, int r) {
  RowState row;
  if (r >= g.rows) return row;  // padding row: sees nothing
  row.q_pos = g.q_pos0 + r / g.heads;
  row.first =
      static_cast<int>(max(first_visible_key(a, row.q_pos), static_cast<std::int64_t>(g.lo)));
  row.end = static_cast<int>(
      min(end_visible_key(a, row.q_pos, g.kv_len), static_cast<std::int64_t>(g.hi)));
  if (a.alibi_slopes != nullptr) row.slope = a.alibi_slopes[g.head_begin + r % g.heads];
  return row;
}

// --- per-tile warp steps --------------------------------------------------------

// S = Q K^T for the warp's 16 rows and the tile's kKeys keys: s[n] is the
// accumulator of keys [8n, 8n + 8). q_lane / k_lane: this lane's ldmatrix
// row addresses in the Q and K tiles (see prefill_kernel).
template <class CT, int kKeys>
__device__ __forceinline__ void compute_scores(float (&s)[kKeys / 8][4], unsigned q_lane,
                                               unsigned k_lane, int qk_cols, int k_stride_bytes) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 2
  for (int k = 0; k < qk_cols; k += 16) {
    unsigned a[4];
    ldmatrix_x4(a, q_lane + k * 2);
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      // Matrices: keys 0-7 x d 0-7, keys 0-7 x d 8-15, keys 8-15 x d 0-7,
      // keys 8-15 x d 8-15: B operands (b0, b1) of two n8 key tiles.
      unsigned b[4];
      ldmatrix_x4(b, k_lane + np * 16 * k_stride_bytes + k * 2);
      mma_16816<CT>(s[2 * np], a, b[0], b[1]);
      mma_16816<CT>(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Online softmax over the tile at key t0 for this lane's rows (rows[0] =
// row g, rows[1] = row g + 8): turns s into P (weight x V ratio, f32) and
// returns each row's rescale of the earlier accumulators in alpha.
template <DType kKv, int kKeys>
__device__ __forceinline__ void softmax_tile(float (&s)[kKeys / 8][4], RowState (&rows)[2],
                                             float (&alpha)[2], const KeyInfo& info,
                                             const Dequant& dq, const AttentionArgs& a, int t0,
                                             int quad_lane) {
  const float inv_softcap = a.softcap > 0.0f ? 1.0f / a.softcap : 0.0f;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const RowState& row = rows[e / 2];
      const int c = 8 * n + 2 * quad_lane + e % 2, j = t0 + c;
      float logit = -INFINITY;
      if (j >= row.first && j < row.end) {
        logit = a.scale * s[n][e];
        if constexpr (kKv == DType::kINT8) logit *= info.k_scale[c];
        if constexpr (is_fp8(kKv)) logit *= dq.k_scale;
        if (a.softcap > 0.0f) logit = a.softcap * tanhf(logit * inv_softcap);
        if (a.alibi_slopes != nullptr) logit += row.slope * static_cast<float>(j - row.q_pos);
      }
      s[n][e] = logit;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], logit);  // ignores NaN: p carries it
    }
  }
  float m_scaled[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(kFullMask, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(kFullMask, tile_max[i], 2));
    const float m_new = fmaxf(rows[i].m, tile_max[i]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: p = 0
    alpha[i] = exp2f((rows[i].m - m_use) * kLog2e);
    rows[i].m = m_new;
    rows[i].l *= alpha[i];
    m_scaled[i] = m_use * kLog2e;
  }
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(fmaf(s[n][e], kLog2e, -m_scaled[e / 2]));
      rows[e / 2].l += p;
      float weight = p;
      // A masked key has p = 0 and keeps it, whatever its scale.
      if constexpr (kKv == DType::kINT8)
        weight = p == 0.0f ? 0.0f : p * info.v_ratio[8 * n + 2 * quad_lane + e % 2];
      if constexpr (is_fp8(kKv)) weight = p == 0.0f ? 0.0f : p * dq.v_ratio;
      s[n][e] = weight;
    }
  }
}

// O = alpha O + P V for the slice's first `active_pairs` pairs of n8 tiles.
// P (the accumulators of S, f32) becomes the A operand in registers: keys
// [16 kk, 16 kk + 16) are S tiles 2 kk and 2 kk + 1. v_lane: this lane's
// ldmatrix row address in the V tile.
template <class CT, int kKeys, int kVTiles>
__device__ __forceinline__ void accumulate_pv(float (&o)[kVTiles][4],
                                              const float (&p)[kKeys / 8][4],
                                              const float (&alpha)[2], int active_pairs,
                                              unsigned v_lane, int v_stride_bytes) {
#pragma unroll
  for (int n = 0; n < kVTiles; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const unsigned a[4] = {pack_pair<CT>(p[2 * kk][0], p[2 * kk][1]),
                           pack_pair<CT>(p[2 * kk][2], p[2 * kk][3]),
                           pack_pair<CT>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_pair<CT>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kVTiles / 2; ++np) {
      if (np < active_pairs) {
        // Transposed matrices: keys 0-7 x cols 0-7, keys 8-15 x cols 0-7,
        // keys 0-7 x cols 8-15, keys 8-15 x cols 8-15: (b0, b1) of two n8 tiles.
        unsigned b[4];
        ldmatrix_x4_trans(b, v_lane + kk * 16 * v_stride_bytes + np * 16 * 2);
        mma_16816<CT>(o[2 * np], a, b[0], b[1]);
        mma_16816<CT>(o[2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// --- output ------------------------------------------------------------------------

// Where row r's output goes and what multiplies its accumulators; writes
// its LSE when asked (one lane per row).
struct RowOutput {
  std::int64_t base = 0;  // index of the row's element 0 in o or partial_out
  float factor = 0.0f;    // 0: the row writes zeros
};

__device__ RowOutput finish_row(RowState row, const AttentionArgs& a, const ItemGeometry& g,
                                int partial, int r, float v_ref, bool write_lse) {
  // The quad's lanes each summed a quarter of the row's weights.
  row.l += __shfl_xor_sync(kFullMask, row.l, 1);
  row.l += __shfl_xor_sync(kFullMask, row.l, 2);
  RowOutput out;
  if (r >= g.rows) return out;
  const bool empty = row.l == 0.0f;  // nothing visible (a NaN weight sum is not empty)
  if (partial >= 0) {
    const std::int64_t slot_row = static_cast<std::int64_t>(partial) * a.max_rows + r;
    out.base = slot_row * a.kv.v_head_dim;
    out.factor = empty ? 0.0f : v_ref / row.l;
    if (write_lse) a.partial_lse[slot_row] = empty ? -INFINITY : row.m + logf(row.l);
    return out;
  }
  const std::int64_t token = g.token0 + r / g.heads;
  const int head = g.head_begin + r % g.heads;
  out.base = token * a.o.token_stride + head * a.o.head_stride;
  float lse = -INFINITY;
  if (a.sinks != nullptr) {
    // Merge with the sink's state: no value, LSE `sink`.
    const float sink = a.sinks[head];
    if (empty) {
      lse = sink;
    } else {
      const float m_final = fmaxf(row.m, sink);
      const float keep = expf(row.m - m_final);
      const float denom = row.l * keep + expf(sink - m_final);
      out.factor = v_ref * keep / denom;
      lse = m_final + logf(denom);
    }
  } else if (!empty) {
    out.factor = v_ref / row.l;
    lse = row.m + logf(row.l);
  }
  if (write_lse && a.lse != nullptr) a.lse[token * a.num_qo_heads + head] = lse;
  return out;
}

// Writes this lane's accumulator elements of the slice starting at column col0.
template <int kVTiles>
__device__ void store_rows(const float (&o)[kVTiles][4], const RowOutput (&out)[2], int row0,
                           int active_pairs, int quad_lane, int col0, const AttentionArgs& a,
                           const ItemGeometry& g, bool partial) {
  const int v_head_dim = a.kv.v_head_dim;
#pragma unroll
  for (int n = 0; n < kVTiles; ++n) {
    if (n / 2 >= active_pairs) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2, col = col0 + 8 * n + 2 * quad_lane + e % 2;
      if (row0 + 8 * i >= g.rows || col >= v_head_dim) continue;
      const float value = out[i].factor == 0.0f ? 0.0f : o[n][e] * out[i].factor;
      if (partial) {
        a.partial_out[out[i].base + col] = value;
      } else {
        store_activation(a.o.data, a.o.dtype, out[i].base + col, value);
      }
    }
  }
}

// --- the kernel ------------------------------------------------------------------

// Pipeline per key tile t (one K and one V buffer; cp.async groups are
// committed K, V, K, V, ... so K(t) completes while V(t) may still fly):
//   [A] K(t) landed -> S(t) -> [B] V(t) landed, K buffer free -> K(t+1) issued
//   -> softmax, P V(t) -> [C] V buffer free -> V(t+1) issued.
// MLA storage (v_in_k) reads V from the K tile, so K(t+1) waits for [C].
// One CTA per SM is all __launch_bounds__ asks: without it ptxas caps the
// registers for occupancy on its own and spills the accumulators.
template <DType kKv, int kVTiles>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_kernel(const AttentionArgs args, const PrefillLayout layout) {
  using CT = ComputeType<kKv>;
  constexpr int kKeys = key_tile_for(kVTiles);
  extern __shared__ __align__(128) unsigned char smem[];
  CT* q_tile = reinterpret_cast<CT*>(smem + layout.q_at);
  CT* k_tile = reinterpret_cast<CT*>(smem + layout.k_at);
  CT* v_tile = reinterpret_cast<CT*>(smem + layout.v_at);
  KeyInfo* info = reinterpret_cast<KeyInfo*>(smem + layout.info_at);  // tile t: info[t % 2]

  const CudaWorkItem item = args.items[blockIdx.x];
  const ItemGeometry g = item_geometry(args, item);
  if (g.rows <= 0) return;  // uniform: before any barrier

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_lane = lane % 4, row0 = warp * kWarpRows + lane / 4;  // rows row0, row0 + 8
  const bool v_in_k = args.kv.v_in_k;
  const int head_dim = args.kv.head_dim, v_head_dim = args.kv.v_head_dim;
  const int n_tiles = (g.hi - g.lo + kKeys - 1) / kKeys;
  const Dequant dq = cta_dequant<kKv>(args, g, reinterpret_cast<float*>(smem + layout.reduce_at));
  load_q_tile(q_tile, layout, args, g, head_dim);

  // ldmatrix row addresses of this lane: Q rows (lane % 16) at column
  // 8 (lane / 16) give A's a0..a3; K and V rows as compute_scores and
  // accumulate_pv describe their matrices.
  const int mat = lane / 8, mat_row = lane % 8;
  const unsigned q_lane =
      shared_address(q_tile + (warp * kWarpRows + lane % 16) * layout.q_stride + (lane / 16) * 8);
  const unsigned k_lane =
      shared_address(k_tile + ((mat / 2) * 8 + mat_row) * layout.k_stride + (mat % 2) * 8);
  const int k_stride_bytes = layout.k_stride * 2;
  const int v_stride = v_in_k ? layout.k_stride : layout.v_stride;
  const int v_stride_bytes = v_stride * 2;

  RowState rows[2] = {init_row(args, g, row0), init_row(args, g, row0 + 8)};
  // Keys any of this warp's rows sees: tiles outside are skipped.
  int warp_first = INT_MAX, warp_end = INT_MIN;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rows[i].first < rows[i].end) {
      warp_first = min(warp_first, rows[i].first);
      warp_end = max(warp_end, rows[i].end);
    }
  }
  for (int shift = 16; shift > 0; shift /= 2) {
    warp_first = min(warp_first, __shfl_xor_sync(kFullMask, warp_first, shift));
    warp_end = max(warp_end, __shfl_xor_sync(kFullMask, warp_end, shift));
  }

  const auto load_k = [&](int t) {
    load_tile<kKv>(k_tile, layout.k_stride, layout.qk_cols, args.kv.k_data, info[t % 2].k_offset, 0,
                   head_dim, kKeys);
  };
  for (int slice = 0; slice < layout.num_slices; ++slice) {
    const int col0 = slice * kVTiles * 8;
    const int active_pairs = min(kVTiles / 2, (v_head_dim - col0 + 15) / 16);
    const int v_valid = min(active_pairs * 16, v_head_dim - col0);
    const CT* v_base = v_in_k ? k_tile + col0 : v_tile;
    const unsigned v_lane =
        shared_address(v_base + ((mat % 2) * 8 + mat_row) * v_stride + (mat / 2) * 8);
    const auto load_v = [&](int t) {
      load_tile<kKv>(v_tile, layout.v_stride, active_pairs * 16, args.kv.v_data,
                     info[t % 2].v_offset, col0, v_valid, kKeys);
    };

    float o[kVTiles][4];
#pragma unroll
    for (int n = 0; n < kVTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rows[i].m = -INFINITY;
      rows[i].l = 0.0f;
    }

    __syncthreads();  // the previous slice is done with the tiles and key info
    // The first kKeys threads fill the key info, thread r key r of each tile;
    // next_page is the page of its key in the next tile to fill.
    const bool fills_info = threadIdx.x < kKeys;
    int next_page = -1;
    if (fills_info) {
      fill_key_info<kKv>(info[0], args, g, g.lo, page_of_key(args, g, g.lo + threadIdx.x),
                         dq.v_ref);
      next_page = page_of_key(args, g, g.lo + kKeys + threadIdx.x);
    }
    __syncthreads();
    if (n_tiles > 0) load_k(0);
    __pipeline_commit();
    if (n_tiles > 0 && !v_in_k) load_v(0);
    __pipeline_commit();

    for (int t = 0; t < n_tiles; ++t) {
      const int t0 = g.lo + t * kKeys;
      if (v_in_k) {
        __pipeline_wait_prior(0);
      } else {
        __pipeline_wait_prior(1);
      }
      __syncthreads();  // [A]
      if (fills_info && t + 1 < n_tiles) {
        fill_key_info<kKv>(info[(t + 1) % 2], args, g, t0 + kKeys, next_page, dq.v_ref);
        next_page = page_of_key(args, g, t0 + 2 * kKeys + threadIdx.x);
      }
      const bool warp_active = t0 < warp_end && t0 + kKeys > warp_first;
      float s[kKeys / 8][4];
      if (warp_active) compute_scores<CT, kKeys>(s, q_lane, k_lane, layout.qk_cols, k_stride_bytes);
      __pipeline_wait_prior(0);
      __syncthreads();  // [B]
      if (t + 1 < n_tiles && !v_in_k) load_k(t + 1);
      __pipeline_commit();
      if (warp_active) {
        float alpha[2];
        softmax_tile<kKv, kKeys>(s, rows, alpha, info[t % 2], dq, args, t0, quad_lane);
        accumulate_pv<CT, kKeys, kVTiles>(o, s, alpha, active_pairs, v_lane, v_stride_bytes);
      }
      __syncthreads();  // [C]
      if (t + 1 < n_tiles) {
        if (v_in_k) {
          load_k(t + 1);
        } else {
          load_v(t + 1);
        }
      }
      __pipeline_commit();
    }

    const RowOutput out[2] = {
        finish_row(rows[0], args, g, item.partial, row0, dq.v_ref, slice == 0 && quad_lane == 0),
        finish_row(rows[1], args, g, item.partial, row0 + 8, dq.v_ref,
                   slice == 0 && quad_lane == 0)};
    store_rows(o, out, row0, active_pairs, quad_lane, col0, args, g, item.partial >= 0);
  }
}

// --- host side ---------------------------------------------------------------------

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "launch_prefill", what);
}

template <DType kKv, int kVTiles>
void launch_typed(const AttentionArgs& args, const PrefillLayout& layout,
                  const LaunchConfig& launch, Stream stream) {
  const auto kernel = prefill_kernel<kKv, kVTiles>;
  if (launch.shared_bytes > 48u * 1024u)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(launch.shared_bytes)),
               "cudaFuncSetAttribute(prefill_kernel, MaxDynamicSharedMemorySize)");
  kernel<<<launch.grid, launch.threads, launch.shared_bytes, static_cast<cudaStream_t>(stream)>>>(
      args, layout);
  check_cuda(cudaGetLastError(), "prefill_kernel launch");
}

template <DType kKv>
void launch_for_dtype(const AttentionArgs& args, const PrefillLayout& layout,
                      const LaunchConfig& launch, Stream stream) {
  switch (layout.v_tiles) {
    case 8:
      return launch_typed<kKv, 8>(args, layout, launch, stream);
    case 16:
      return launch_typed<kKv, 16>(args, layout, launch, stream);
    default:
      return launch_typed<kKv, 32>(args, layout, launch, stream);
  }
}

}  // namespace

LaunchConfig prefill_launch(std::int32_t head_dim, std::int32_t v_head_dim, DType /*kv_dtype*/) {
  const PrefillLayout layout = prefill_layout(head_dim, v_head_dim);
  LaunchConfig config;
  config.threads = kThreads;
  config.shared_bytes = static_cast<std::uint32_t>(layout.bytes);
  return config;
}

void launch_prefill(const AttentionArgs& args, const LaunchConfig& launch, Stream stream) {
  if (launch.grid == 0) return;
  const PagedKVStorage& kv = args.kv;
  const PrefillLayout layout = prefill_layout(kv.head_dim, kv.v_head_dim);
  require(launch.threads == static_cast<std::uint32_t>(kThreads) &&
              launch.shared_bytes >= static_cast<std::uint32_t>(layout.bytes),
          "launch_prefill: launch shape (", launch.threads, " threads, ", launch.shared_bytes,
          " shared bytes) is not prefill_launch's (", kThreads, ", ", layout.bytes, ")");
  require(!kv.v_in_k || kv.v_head_dim <= kv.head_dim,
          "launch_prefill: v_in_k needs v_head_dim <= head_dim, got ", kv.v_head_dim, " > ",
          kv.head_dim);
  switch (kv.dtype) {
    case DType::kF16:
      return launch_for_dtype<DType::kF16>(args, layout, launch, stream);
    case DType::kBF16:
      return launch_for_dtype<DType::kBF16>(args, layout, launch, stream);
    case DType::kFP8E4M3:
      return launch_for_dtype<DType::kFP8E4M3>(args, layout, launch, stream);
    case DType::kFP8E5M2:
      return launch_for_dtype<DType::kFP8E5M2>(args, layout, launch, stream);
    case DType::kINT8:
      return launch_for_dtype<DType::kINT8>(args, layout, launch, stream);
    default:
      throw Unsupported(pagedattn::detail::concat("launch_prefill: K/V dtype ",
                                                  dtype_name(kv.dtype),
                                                  " is not served (f16, bf16, fp8, int8)"));
  }
}

}  // namespace pagedattn::cuda::detail
