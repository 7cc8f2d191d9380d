// Decode attention on CUDA cores: one CTA per work item, whose rows (at most
// kDecodeMaxRows query tokens x query heads) all read one KV head, so every
// K/V byte of the item's key range crosses global memory once for all rows.
//
// The item's keys stream through shared memory in tiles of tile_keys keys,
// double buffered with cp.async (16-byte copies where rows are 16-byte
// aligned, element copies otherwise). Per tile:
//   logits:  (row block, key) pairs split among lanes over the head dim;
//            each converted K element is reused by the block's rows
//   softmax: one warp per row block updates its rows' running max and sum
//            (one online-softmax state per row for the whole CTA)
//   values:  each thread owns 8 output dims of a row block for a subset of
//            the tile's keys ("splits"), accumulating in f32 registers
// At the end the splits' partial accumulators are summed through shared
// memory in a fixed order, so results do not depend on scheduling.
//
// Rows are grouped into row blocks: up to 4 heads of one query token. A
// block's rows see the same keys (causal and window limits depend on the
// token only), so the key loops need no per-row masks: a key invisible to a
// row is never touched, and NaN in masked K/V rows cannot reach an output.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_args.h"
#include "kernels/cuda/dtype.cuh"
#include "pagedattn/errors.h"

namespace pagedattn::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Row slots of a CTA (row blocks x rows per block; unused rows of a block
// that the heads do not fill count too).
constexpr int kMaxSlots = 32;
// f32 accumulator registers per thread: [units][rows per block][kPvDims].
constexpr int kAccFloats = 32;
constexpr int kPvDims = 8;  // output dims one thread accumulates per unit
// kDecodeMaxRows rows of this many dims fill every thread's accumulators.
constexpr int kMaxVHeadDim = kAccFloats * kThreads / kDecodeMaxRows;
constexpr int kMaxHeadDim = 1024;  // beyond this the layout is not computed
constexpr int kMaxTileKeys = 64, kMinTileKeys = 16;
constexpr int kStageBytes = 36 * 1024;  // K + V of one tile, at most (unless 16 keys exceed it)
constexpr int kTables = 3;              // key tables: copying, computing, being built
constexpr int kMaxSplits = 16;
constexpr float kInf = __builtin_huge_valf();

constexpr std::uint32_t kNotServed = 0xffffffffu;

// Shared memory of a decode CTA, in bytes from the start:
//   q       [kDecodeMaxRows][q_row_floats] f32   queries x scale, zero tails
//   scores  [row blocks][tile_keys + 1][rows per block] f32 (at most kMaxSlots
//           rows in all): logits, then softmax weights
//   state   [3][kMaxSlots] f32                  running max, sum, rescale
//   blocks  [kDecodeMaxRows] BlockInfo + key range
//   tables  [kTables][tile_keys] KeyEntry       where each key's rows live
//   tiles   [2 stages][K tile, V tile]          also the final split reduction
struct DecodeLayout {
  std::int32_t tile_keys = 0;
  std::int32_t k_chunks = 0, v_chunks = 0;  // 16-byte chunks of a K / V row
  std::int32_t v_groups = 0;                // kPvDims-dim groups of a V row
  std::int32_t q_row_floats = 0;            // k_chunks x (elements per chunk)
  std::int32_t k_row_bytes = 0, v_row_bytes = 0;
  std::uint32_t scores_offset = 0, state_offset = 0, blocks_offset = 0, tables_offset = 0;
  std::uint32_t tiles_offset = 0, stage_bytes = 0, total_bytes = 0;
};

struct BlockInfo {
  std::int32_t token;   // global query token index
  std::int32_t head0;   // query head of the block's first row
  std::int32_t rows;    // rows in use, 1..row block
  std::int32_t row0;    // item row (token-major) of the block's first row
  std::int32_t q_pos;   // the token's position: kv_len - q_len + its index
  std::int32_t lo, hi;  // its visible keys within the item, [lo, hi); lo == hi: none
  std::int32_t unused;
};

struct KeyEntry {
  std::int64_t k_offset, v_offset;  // elements from k_data / v_data
  float k_scale, v_scale;           // dequantisation (1 for f16 / bf16)
};

constexpr int kBlocksBytes = kDecodeMaxRows * static_cast<int>(sizeof(BlockInfo)) + 16;
constexpr std::uint32_t kReduceBytes = kAccFloats * kThreads * 4;

__host__ __device__ constexpr int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}
__host__ __device__ constexpr int max_int(int a, int b) {
  return a > b ? a : b;
}

// Row stride of a tile: an odd number of 16-byte chunks, so lanes reading the
// same chunk of 8 consecutive rows hit 8 different bank groups.
__host__ __device__ constexpr int tile_row_bytes(int bytes) {
  return (ceil_div(bytes, 16) | 1) * 16;
}

// Shared by decode_launch (host) and the kernel (device): both see the same numbers.
__host__ __device__ constexpr DecodeLayout decode_layout(int head_dim, int v_head_dim,
                                                         int elem_bytes) {
  DecodeLayout l;
  l.k_chunks = ceil_div(head_dim * elem_bytes, 16);
  l.v_chunks = ceil_div(v_head_dim * elem_bytes, 16);
  l.v_groups = ceil_div(v_head_dim, kPvDims);
  l.q_row_floats = l.k_chunks * 16 / elem_bytes;
  // The value loop reads whole groups of kPvDims, from the V row or (MLA)
  // from the head of the K row.
  const int value_bytes = l.v_groups * kPvDims * elem_bytes;
  l.k_row_bytes = tile_row_bytes(max_int(l.k_chunks * 16, value_bytes));
  l.v_row_bytes = tile_row_bytes(max_int(l.v_chunks * 16, value_bytes));
  int keys = kMaxTileKeys;
  while (keys > kMinTileKeys && keys * (l.k_row_bytes + l.v_row_bytes) > kStageBytes) keys /= 2;
  l.tile_keys = keys;
  const std::uint32_t q_bytes = 4u * kDecodeMaxRows * l.q_row_floats;
  l.scores_offset = q_bytes;
  l.state_offset = l.scores_offset + 4u * kMaxSlots * (keys + 1);
  l.blocks_offset = l.state_offset + 3u * 4u * kMaxSlots;
  l.tables_offset = l.blocks_offset + kBlocksBytes;
  l.tiles_offset = l.tables_offset + kTables * keys * static_cast<int>(sizeof(KeyEntry));
  l.stage_bytes = static_cast<std::uint32_t>(keys * (l.k_row_bytes + l.v_row_bytes));
  const std::uint32_t tiles = 2 * l.stage_bytes;
  l.total_bytes = l.tiles_offset + (tiles > kReduceBytes ? tiles : kReduceBytes);
  return l;
}

// Rows per row block: 4 where the heads fill it (1 or 2 for fewer heads),
// smaller where the slots or the accumulator registers would not suffice.
__device__ int choose_row_block(int tokens, int heads, int v_groups) {
  int block = heads >= 3 ? 4 : heads;
  while (block > 1) {
    const int blocks = tokens * ceil_div(heads, block);
    if (blocks * block <= kMaxSlots && blocks * v_groups * block * kPvDims <= kAccFloats * kThreads)
      break;
    block /= 2;
  }
  return block;
}

// --- K/V element conversion (exact: every stored code is an f32 value) --------

template <DType kType>
constexpr int kElemBytes = static_cast<int>(dtype_size(kType));

// The 4 / elem_bytes elements of one 32-bit word, first element in the low bits.
template <DType kType>
__device__ __forceinline__ void word_to_floats(std::uint32_t w, float* out) {
  if constexpr (kType == DType::kF32) {
    out[0] = __uint_as_float(w);
  } else if constexpr (kType == DType::kBF16) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  } else if constexpr (kType == DType::kF16) {
    out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  } else if constexpr (kType == DType::kFP8E4M3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // SM89+ converts e4m3 pairs to f16 in hardware (exact, NaN stays NaN).
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const auto bits = static_cast<__nv_fp8x2_storage_t>((w >> (16 * pair)) & 0xffffu);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(bits, __NV_E4M3);
      out[2 * pair] = __half2float(__ushort_as_half(h.x));
      out[2 * pair + 1] = __half2float(__ushort_as_half(h.y));
    }
#else
#pragma unroll
    for (int b = 0; b < 4; ++b) out[b] = e4m3_to_float(static_cast<std::uint8_t>(w >> (8 * b)));
#endif
  } else if constexpr (kType == DType::kFP8E5M2) {
#pragma unroll
    for (int b = 0; b < 4; ++b) out[b] = e5m2_to_float(static_cast<std::uint8_t>(w >> (8 * b)));
  } else {
    static_assert(kType == DType::kINT8);
#pragma unroll
    for (int b = 0; b < 4; ++b)
      out[b] =
          static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(w >> (8 * b))));
  }
}

// kBytes (8, 16 or 32) bytes of shared memory, aligned to min(kBytes, 16), as floats.
template <DType kType, int kBytes>
__device__ __forceinline__ void load_floats(const unsigned char* src, float* out) {
  constexpr int kPerWord = 4 / kElemBytes<kType>;
  if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    word_to_floats<kType>(raw.x, out);
    word_to_floats<kType>(raw.y, out + kPerWord);
  } else {
    static_assert(kBytes % 16 == 0);
#pragma unroll
    for (int v = 0; v < kBytes / 16; ++v) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[v];
      float* o = out + v * 4 * kPerWord;
      word_to_floats<kType>(raw.x, o);
      word_to_floats<kType>(raw.y, o + kPerWord);
      word_to_floats<kType>(raw.z, o + 2 * kPerWord);
      word_to_floats<kType>(raw.w, o + 3 * kPerWord);
    }
  }
}

// kRows consecutive floats of shared memory (aligned to their size).
template <int kRows>
__device__ __forceinline__ void load_slots(const float* src, float (&out)[kRows]) {
  if constexpr (kRows == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (kRows == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = *src;
  }
}
template <int kRows>
__device__ __forceinline__ void store_slots(float* dst, const float (&in)[kRows]) {
  if constexpr (kRows == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(in[0], in[1], in[2], in[3]);
  } else if constexpr (kRows == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(in[0], in[1]);
  } else {
    *dst = in[0];
  }
}

// One element of kBytes bytes, for the element-wise (unaligned) copy.
template <int kBytes>
struct ElementBits;
template <>
struct ElementBits<1> {
  using type = std::uint8_t;
};
template <>
struct ElementBits<2> {
  using type = std::uint16_t;
};
template <>
struct ElementBits<4> {
  using type = std::uint32_t;
};

__device__ __forceinline__ void copy16_async(void* shared_dst, const void* global_src) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// A row's final normalisation: output = accumulator x scale, and its LSE.
struct RowResult {
  float scale, lse;
};

// `sink`: null, or the row's learned sink, merged as a state of value 0 and
// LSE *sink (docs/semantics.md). m, sum: the row's running max and sum.
__device__ __forceinline__ RowResult finish_row(float m, float sum, bool has_keys,
                                                const float* sink) {
  if (!has_keys) return {0.0f, sink ? *sink : -kInf};
  if (sink == nullptr) return {1.0f / sum, m + logf(sum)};
  const float s = *sink;
  const float m2 = isnan(m) ? m : fmaxf(m, s);  // fmaxf would drop a NaN max
  const float alpha = expf(m - m2);
  const float denominator = sum * alpha + expf(s - m2);
  return {alpha / denominator, m2 + logf(denominator)};
}

template <DType kKV, int kRowBlock>
class DecodeCta {
 public:
  __device__ __forceinline__ DecodeCta(const AttentionArgs& args, const CudaWorkItem& item,
                                       const DecodeLayout& layout, unsigned char* smem);
  __device__ __forceinline__ void run();

 private:
  static constexpr int kElem = kElemBytes<kKV>;
  static constexpr int kChunkElems = 16 / kElem;
  static constexpr int kUnits = kAccFloats / (kRowBlock * kPvDims);

  __device__ __forceinline__ BlockInfo make_block(int b) const;
  __device__ __forceinline__ void setup();
  __device__ __forceinline__ void build_table(int tile);
  __device__ __forceinline__ void copy_rows(unsigned char* dst, int dst_stride,
                                            const void* src_data, const KeyEntry* table, bool value,
                                            int dim, int chunks, int count) const;
  __device__ __forceinline__ void issue_copy(int tile);
  __device__ __forceinline__ void compute_logits(int tile);
  __device__ __forceinline__ void update_softmax(int tile);
  __device__ __forceinline__ void accumulate_values(int tile);
  __device__ __forceinline__ void reduce_splits();
  __device__ __forceinline__ void write_outputs() const;

  __device__ __forceinline__ int tile_first(int tile) const { return lo_ + tile * tile_keys_; }
  __device__ __forceinline__ int tile_count(int tile) const {
    return min(tile_keys_, hi_ - tile_first(tile));
  }
  __device__ __forceinline__ KeyEntry* table_of(int tile) const {
    return tables_ + (tile % kTables) * tile_keys_;
  }
  __device__ __forceinline__ unsigned char* k_tile(int tile) const {
    return tiles_ + (tile & 1) * layout_.stage_bytes;
  }
  __device__ __forceinline__ unsigned char* v_tile(int tile) const {
    return k_tile(tile) + tile_keys_ * layout_.k_row_bytes;
  }
  __device__ __forceinline__ float* block_scores(int b) const {
    return scores_ + b * (tile_keys_ + 1) * kRowBlock;
  }

  const AttentionArgs& args_;
  const CudaWorkItem item_;
  const DecodeLayout layout_;

  float* q_;
  float* scores_;
  float* row_max_;
  float* row_sum_;
  float* rescale_;
  BlockInfo* blocks_;
  int* key_range_;
  KeyEntry* tables_;
  unsigned char* tiles_;

  // CTA-uniform.
  int heads_, tokens_, blocks_per_token_, num_blocks_, kv_head_, tile_keys_;
  int lo_ = 0, hi_ = 0, num_tiles_ = 0;  // the keys any row sees, and their tiles
  bool wide_copies_, v_from_k_;
  int key_lanes_, dot_split_;           // logits: keys per warp step, lanes per key
  int units_, splits_, split_threads_;  // values: (block, dim group) units, key splits

  // Per thread.
  int tid_, lane_, warp_, split_, unit0_;
  float acc_[kUnits][kRowBlock][kPvDims];
};

template <DType kKV, int kRowBlock>
__device__ DecodeCta<kKV, kRowBlock>::DecodeCta(const AttentionArgs& args, const CudaWorkItem& item,
                                                const DecodeLayout& layout, unsigned char* smem)
    : args_(args), item_(item), layout_(layout) {
  q_ = reinterpret_cast<float*>(smem);
  scores_ = reinterpret_cast<float*>(smem + layout.scores_offset);
  row_max_ = reinterpret_cast<float*>(smem + layout.state_offset);
  row_sum_ = row_max_ + kMaxSlots;
  rescale_ = row_sum_ + kMaxSlots;
  blocks_ = reinterpret_cast<BlockInfo*>(smem + layout.blocks_offset);
  key_range_ = reinterpret_cast<int*>(blocks_ + kDecodeMaxRows);
  tables_ = reinterpret_cast<KeyEntry*>(smem + layout.tables_offset);
  tiles_ = smem + layout.tiles_offset;

  tid_ = static_cast<int>(threadIdx.x);
  lane_ = tid_ & 31;
  warp_ = tid_ >> 5;
  heads_ = item.qo_head_end - item.qo_head_begin;
  tokens_ = item.q_end - item.q_begin;
  blocks_per_token_ = ceil_div(heads_, kRowBlock);
  num_blocks_ = tokens_ * blocks_per_token_;
  kv_head_ = item.qo_head_begin / args.group;
  tile_keys_ = layout.tile_keys;

  const PagedKVStorage& kv = args.kv;
  v_from_k_ = kv.v_in_k && kv.v_data == kv.k_data && kv.v_page_stride == kv.k_page_stride &&
              kv.v_head_stride == kv.k_head_stride && kv.v_token_stride == kv.k_token_stride &&
              kv.v_head_dim <= kv.head_dim;
  const auto aligned = [](std::int64_t elements) { return elements * kElem % 16 == 0; };
  const auto aligned_ptr = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  wide_copies_ = aligned_ptr(kv.k_data) && aligned(kv.head_dim) && aligned(kv.k_page_stride) &&
                 aligned(kv.k_head_stride) && aligned(kv.k_token_stride) &&
                 (v_from_k_ ||
                  (aligned_ptr(kv.v_data) && aligned(kv.v_head_dim) && aligned(kv.v_page_stride) &&
                   aligned(kv.v_head_stride) && aligned(kv.v_token_stride)));

  // Logits: enough lanes per (block, key) pair to occupy the CTA, at most 4
  // (8 lanes reading one chunk of 8 keys keep the K reads conflict-free),
  // and at least 32 / tile_keys (a warp step stays within one block).
  const int pairs = num_blocks_ * tile_keys_;
  dot_split_ = 1;
  while (dot_split_ < 4 && pairs * dot_split_ * 2 <= kThreads) dot_split_ *= 2;
  while (32 / dot_split_ > tile_keys_) dot_split_ *= 2;
  key_lanes_ = 32 / dot_split_;

  // Values: (block, dim group) units; spare threads split the tile's keys.
  units_ = num_blocks_ * layout.v_groups;
  splits_ = 1;
  while (splits_ < kMaxSplits && splits_ * 2 <= tile_keys_ && units_ * splits_ * 2 <= kThreads)
    splits_ *= 2;
  split_threads_ = kThreads / splits_;
  split_ = tid_ / split_threads_;
  unit0_ = tid_ % split_threads_;

#pragma unroll
  for (int k = 0; k < kUnits; ++k)
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
      for (int d = 0; d < kPvDims; ++d) acc_[k][i][d] = 0.0f;
}

template <DType kKV, int kRowBlock>
__device__ BlockInfo DecodeCta<kKV, kRowBlock>::make_block(int b) const {
  const int token_offset = b / blocks_per_token_;
  const int head_offset = (b % blocks_per_token_) * kRowBlock;
  const int seq_begin = args_.qo_indptr[item_.batch];
  const int q_len = args_.qo_indptr[item_.batch + 1] - seq_begin;
  const int kv_len = args_.kv_lens[item_.batch];
  const int token_in_seq = item_.q_begin + token_offset;
  const std::int64_t q_pos = std::int64_t{kv_len} - q_len + token_in_seq;
  std::int64_t lo = first_visible_key(args_, q_pos);
  std::int64_t hi = end_visible_key(args_, q_pos, kv_len);
  lo = lo > item_.kv_begin ? lo : item_.kv_begin;
  hi = hi < item_.kv_end ? hi : item_.kv_end;
  if (lo < 0) lo = 0;
  if (hi > kv_len) hi = kv_len;  // slots past kv_len are never read
  if (hi <= lo) lo = hi = 0;
  BlockInfo info;
  info.token = seq_begin + token_in_seq;
  info.head0 = item_.qo_head_begin + head_offset;
  info.rows = min(kRowBlock, heads_ - head_offset);
  info.row0 = token_offset * heads_ + head_offset;
  info.q_pos = static_cast<int>(q_pos);
  info.lo = static_cast<int>(lo);
  info.hi = static_cast<int>(hi);
  info.unused = 0;
  return info;
}

// Row blocks and the CTA's key range (warp 0), softmax states, queries, and
// zeroed tiles (the tails the element-wise copy leaves must not hold NaN).
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::setup() {
  if (warp_ == 0) {
    int lo = INT_MAX, hi = INT_MIN;
    if (lane_ < num_blocks_) {
      const BlockInfo info = make_block(lane_);
      blocks_[lane_] = info;
      if (info.hi > info.lo) lo = info.lo, hi = info.hi;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = min(lo, __shfl_xor_sync(kFullMask, lo, offset));
      hi = max(hi, __shfl_xor_sync(kFullMask, hi, offset));
    }
    if (lane_ == 0) {
      key_range_[0] = hi > lo ? lo : 0;
      key_range_[1] = hi > lo ? hi : 0;
    }
  }
  if (tid_ < kMaxSlots) {
    row_max_[tid_] = -kInf;
    row_sum_[tid_] = 0.0f;
    rescale_[tid_] = 1.0f;
  }
  const HeadTensor& q = args_.q;
  const int rows = heads_ * tokens_;
  const int seq_begin = args_.qo_indptr[item_.batch];
  for (int r = warp_; r < rows; r += kWarps) {
    const std::int64_t token = seq_begin + item_.q_begin + r / heads_;
    const std::int64_t head = item_.qo_head_begin + r % heads_;
    const std::int64_t base = token * q.token_stride + head * q.head_stride;
    float* row = q_ + r * layout_.q_row_floats;
    for (int d = lane_; d < layout_.q_row_floats; d += 32)
      row[d] =
          d < args_.kv.head_dim ? load_activation(q.data, q.dtype, base + d) * args_.scale : 0.0f;
  }
  uint4* tiles = reinterpret_cast<uint4*>(tiles_);
  const int tile_vectors = static_cast<int>(2 * layout_.stage_bytes / 16);
  for (int i = tid_; i < tile_vectors; i += kThreads) tiles[i] = make_uint4(0, 0, 0, 0);
}

// Where each key of `tile` lives, and its dequantisation scales.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::build_table(int tile) {
  if (tid_ >= tile_count(tile)) return;
  const PagedKVStorage& kv = args_.kv;
  const std::int64_t key = tile_first(tile) + tid_;
  const std::int64_t slot = slot_of_key(args_, item_.batch, key);
  const std::int64_t page = args_.kv_indices[args_.kv_indptr[item_.batch] + slot / kv.page_size];
  const std::int64_t offset = slot % kv.page_size;
  KeyEntry& entry = table_of(tile)[tid_];
  entry.k_offset = kv.k_offset(page, kv_head_, offset);
  entry.v_offset = kv.v_offset(page, kv_head_, offset);
  entry.k_scale = kv.k_dequant(page, kv_head_, offset);
  entry.v_scale = kv.v_dequant(page, kv_head_, offset);
}

// Rows [0, count) of a tile: 16-byte cp.async chunks (a warp covers
// 32 / lanes_per_row rows per step), or element by element.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::copy_rows(unsigned char* dst, int dst_stride,
                                                     const void* src_data, const KeyEntry* table,
                                                     bool value, int dim, int chunks,
                                                     int count) const {
  const auto* src = static_cast<const unsigned char*>(src_data);
  if (wide_copies_) {
    int lanes_per_row = 1;
    while (lanes_per_row < 32 && lanes_per_row < chunks) lanes_per_row *= 2;
    const int rows_per_step = 32 / lanes_per_row;
    const int sub = lane_ & (lanes_per_row - 1);
    for (int key = warp_ * rows_per_step + lane_ / lanes_per_row; key < count;
         key += kWarps * rows_per_step) {
      const std::int64_t offset = value ? table[key].v_offset : table[key].k_offset;
      const unsigned char* row = src + offset * kElem;
      for (int c = sub; c < chunks; c += lanes_per_row)
        copy16_async(dst + key * dst_stride + c * 16, row + c * 16);
    }
  } else {
    using Bits = typename ElementBits<kElem>::type;
    for (int key = warp_; key < count; key += kWarps) {
      const std::int64_t offset = value ? table[key].v_offset : table[key].k_offset;
      const Bits* row = reinterpret_cast<const Bits*>(src) + offset;
      Bits* out = reinterpret_cast<Bits*>(dst + key * dst_stride);
      for (int d = lane_; d < dim; d += 32) out[d] = row[d];
    }
  }
}

template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::issue_copy(int tile) {
  const PagedKVStorage& kv = args_.kv;
  const KeyEntry* table = table_of(tile);
  const int count = tile_count(tile);
  copy_rows(k_tile(tile), layout_.k_row_bytes, kv.k_data, table, false, kv.head_dim,
            layout_.k_chunks, count);
  if (!v_from_k_)
    copy_rows(v_tile(tile), layout_.v_row_bytes, kv.v_data, table, true, kv.v_head_dim,
              layout_.v_chunks, count);
}

// Logits of the tile's visible (block, key) pairs: s = k_scale * dot(q * scale, k),
// then softcap, then ALiBi, stored to the block's scores.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::compute_logits(int tile) {
  const int first = tile_first(tile);
  const unsigned char* keys = k_tile(tile);
  const KeyEntry* table = table_of(tile);
  const int groups_per_block = tile_keys_ / key_lanes_;
  const int sub = lane_ / key_lanes_;
  for (int group = warp_; group < num_blocks_ * groups_per_block; group += kWarps) {
    const int b = group / groups_per_block;
    const int key0 = (group % groups_per_block) * key_lanes_;
    const BlockInfo info = blocks_[b];
    const int begin = max(info.lo - first, 0), end = min(info.hi - first, tile_keys_);
    if (key0 >= end || key0 + key_lanes_ <= begin) continue;  // the whole warp
    const int j = key0 + (lane_ & (key_lanes_ - 1));
    const bool visible = j >= begin && j < end;

    const float* q_rows[kRowBlock];
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i)  // rows past the block repeat its last row
      q_rows[i] = q_ + (info.row0 + min(i, info.rows - 1)) * layout_.q_row_floats;
    float dot[kRowBlock][2];
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) dot[i][0] = dot[i][1] = 0.0f;
    if (visible) {
      const unsigned char* k_row = keys + j * layout_.k_row_bytes;
      for (int c = sub; c < layout_.k_chunks; c += dot_split_) {
        float k[kChunkElems];
        load_floats<kKV, 16>(k_row + c * 16, k);
#pragma unroll
        for (int i = 0; i < kRowBlock; ++i) {
          const float4* q4 = reinterpret_cast<const float4*>(q_rows[i] + c * kChunkElems);
#pragma unroll
          for (int e = 0; e < kChunkElems / 4; ++e) {
            const float4 qv = q4[e];
            dot[i][0] = fmaf(qv.x, k[4 * e], dot[i][0]);
            dot[i][1] = fmaf(qv.y, k[4 * e + 1], dot[i][1]);
            dot[i][0] = fmaf(qv.z, k[4 * e + 2], dot[i][0]);
            dot[i][1] = fmaf(qv.w, k[4 * e + 3], dot[i][1]);
          }
        }
      }
    }
    float logit[kRowBlock];
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) logit[i] = dot[i][0] + dot[i][1];
    for (int offset = key_lanes_; offset < 32; offset *= 2)
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i) logit[i] += __shfl_xor_sync(kFullMask, logit[i], offset);
    if (!visible || sub != 0) continue;

    const float k_scale = table[j].k_scale;
    const std::int64_t distance = std::int64_t{first} + j - info.q_pos;
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) {
      float s = logit[i] * k_scale;
      if (args_.softcap > 0.0f) s = args_.softcap * tanhf(s / args_.softcap);
      if (args_.alibi_slopes)
        s += args_.alibi_slopes[info.head0 + min(i, info.rows - 1)] * static_cast<float>(distance);
      logit[i] = s;
    }
    store_slots<kRowBlock>(block_scores(b) + j * kRowBlock, logit);
  }
}

// One warp per row block: the rows' new running max over the tile's visible
// keys (NaN if any logit is NaN: fmaxf alone would drop it), the weights
// exp(s - max) x v_scale in place of the logits, the running sums, and the
// factor that rescales the accumulators to the new max.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::update_softmax(int tile) {
  const int first = tile_first(tile);
  const KeyEntry* table = table_of(tile);
  for (int b = warp_; b < num_blocks_; b += kWarps) {
    const BlockInfo info = blocks_[b];
    const int begin = max(info.lo - first, 0), end = min(info.hi - first, tile_keys_);
    float* slot_max = row_max_ + b * kRowBlock;
    if (begin >= end) {
      if (lane_ < kRowBlock) rescale_[b * kRowBlock + lane_] = 1.0f;
      continue;
    }
    float* scores = block_scores(b);
    float tile_max[kRowBlock];
    unsigned nan_rows = 0;
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) tile_max[i] = -kInf;
    for (int j = begin + lane_; j < end; j += 32) {
      float s[kRowBlock];
      load_slots<kRowBlock>(scores + j * kRowBlock, s);
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i) {
        if (isnan(s[i])) nan_rows |= 1u << i;
        tile_max[i] = fmaxf(tile_max[i], s[i]);
      }
    }
    nan_rows = __reduce_or_sync(kFullMask, nan_rows);
    float old_max[kRowBlock], new_max[kRowBlock], sum[kRowBlock];
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(kFullMask, tile_max[i], offset));
      old_max[i] = slot_max[i];
      const bool nan = ((nan_rows >> i) & 1u) != 0 || isnan(old_max[i]);
      new_max[i] = nan ? __int_as_float(0x7fc00000) : fmaxf(old_max[i], tile_max[i]);
      sum[i] = 0.0f;
    }
    for (int j = begin + lane_; j < end; j += 32) {
      float s[kRowBlock];
      load_slots<kRowBlock>(scores + j * kRowBlock, s);
      const float v_scale = table[j].v_scale;
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i) {
        const float p = expf(s[i] - new_max[i]);
        sum[i] += p;
        s[i] = p * v_scale;
      }
      store_slots<kRowBlock>(scores + j * kRowBlock, s);
    }
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        sum[i] += __shfl_xor_sync(kFullMask, sum[i], offset);
    if (lane_ == 0) {
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i) {
        const float rescale = expf(old_max[i] - new_max[i]);
        row_sum_[b * kRowBlock + i] = row_sum_[b * kRowBlock + i] * rescale + sum[i];
        slot_max[i] = new_max[i];
        rescale_[b * kRowBlock + i] = rescale;
      }
    }
  }
}

// acc[unit] = acc[unit] x rescale + sum over this split's visible keys of
// weight x V[key][the unit's dims].
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::accumulate_values(int tile) {
  const int first = tile_first(tile);
  const unsigned char* values = v_from_k_ ? k_tile(tile) : v_tile(tile);
  const int row_bytes = v_from_k_ ? layout_.k_row_bytes : layout_.v_row_bytes;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int unit = unit0_ + k * split_threads_;
    if (unit >= units_) continue;
    const int b = unit / layout_.v_groups;
    const int group = unit % layout_.v_groups;
    const BlockInfo info = blocks_[b];
    float rescale[kRowBlock];
    load_slots<kRowBlock>(rescale_ + b * kRowBlock, rescale);
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
      for (int d = 0; d < kPvDims; ++d) acc_[k][i][d] *= rescale[i];
    const int begin = max(info.lo - first, 0), end = min(info.hi - first, tile_keys_);
    const float* weights = block_scores(b);
    const unsigned char* column = values + group * kPvDims * kElem;
    // The first key >= begin of this split (keys j with j % splits == split).
    for (int j = begin + ((split_ - begin) & (splits_ - 1)); j < end; j += splits_) {
      float w[kRowBlock], v[kPvDims];
      load_slots<kRowBlock>(weights + j * kRowBlock, w);
      load_floats<kKV, kPvDims * kElem>(column + j * row_bytes, v);
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
        for (int d = 0; d < kPvDims; ++d) acc_[k][i][d] = fmaf(w[i], v[d], acc_[k][i][d]);
    }
  }
}

// Splits 1.. add their accumulators to split 0's, in split order.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::reduce_splits() {
  if (splits_ == 1) return;
  float* partial = reinterpret_cast<float*>(tiles_);  // [kAccFloats][kThreads]
  if (split_ > 0) {
#pragma unroll
    for (int k = 0; k < kUnits; ++k)
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
        for (int d = 0; d < kPvDims; ++d)
          partial[((k * kRowBlock + i) * kPvDims + d) * kThreads + tid_] = acc_[k][i][d];
  }
  __syncthreads();
  if (split_ > 0) return;
  for (int s = 1; s < splits_; ++s) {
    const int source = s * split_threads_ + unit0_;
#pragma unroll
    for (int k = 0; k < kUnits; ++k)
#pragma unroll
      for (int i = 0; i < kRowBlock; ++i)
#pragma unroll
        for (int d = 0; d < kPvDims; ++d)
          acc_[k][i][d] += partial[((k * kRowBlock + i) * kPvDims + d) * kThreads + source];
  }
}

// Split 0 writes its units: normalised rows (and the sink) to o / lse, or
// to the item's partial slot for the merge kernel.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::write_outputs() const {
  if (split_ != 0) return;
  const int v_head_dim = args_.kv.v_head_dim;
  const bool to_partial = item_.partial >= 0;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int unit = unit0_ + k * split_threads_;
    if (unit >= units_) continue;
    const int b = unit / layout_.v_groups;
    const int group = unit % layout_.v_groups;
    const BlockInfo info = blocks_[b];
    const bool has_keys = info.hi > info.lo;
#pragma unroll
    for (int i = 0; i < kRowBlock; ++i) {
      if (i >= info.rows) break;
      const int row = info.row0 + i;
      const int head = info.head0 + i;
      const float* sink = !to_partial && args_.sinks ? args_.sinks + head : nullptr;
      const RowResult result =
          finish_row(row_max_[b * kRowBlock + i], row_sum_[b * kRowBlock + i], has_keys, sink);
      if (to_partial) {
        const std::int64_t slot_row = std::int64_t{item_.partial} * args_.max_rows + row;
        float* out = args_.partial_out + slot_row * v_head_dim;
#pragma unroll
        for (int d = 0; d < kPvDims; ++d) {
          const int dim = group * kPvDims + d;
          if (dim < v_head_dim) out[dim] = has_keys ? acc_[k][i][d] * result.scale : 0.0f;
        }
        if (group == 0) args_.partial_lse[slot_row] = result.lse;
      } else {
        const HeadTensor& o = args_.o;
        const std::int64_t base = std::int64_t{info.token} * o.token_stride + head * o.head_stride;
#pragma unroll
        for (int d = 0; d < kPvDims; ++d) {
          const int dim = group * kPvDims + d;
          if (dim < v_head_dim)
            store_activation(o.data, o.dtype, base + dim,
                             has_keys ? acc_[k][i][d] * result.scale : 0.0f);
        }
        if (group == 0 && args_.lse)
          args_.lse[std::int64_t{info.token} * args_.num_qo_heads + head] = result.lse;
      }
    }
  }
}

// Tile t's K/V land while tile t-1 is computed: at the barrier that opens
// iteration t, tile t has arrived (each thread waited for its own copies)
// and every thread is done with tile t-1's stage, which tile t+1 then fills.
// Key tables rotate through three buffers: the one being copied from, the
// one being computed with, and the one being built for two tiles ahead.
template <DType kKV, int kRowBlock>
__device__ void DecodeCta<kKV, kRowBlock>::run() {
  setup();
  __syncthreads();
  lo_ = key_range_[0];
  hi_ = key_range_[1];
  num_tiles_ = ceil_div(hi_ - lo_, tile_keys_);
  if (num_tiles_ > 0) build_table(0);
  if (num_tiles_ > 1) build_table(1);
  __syncthreads();
  if (num_tiles_ > 0) issue_copy(0);
  cp_async_commit();
  for (int tile = 0; tile < num_tiles_; ++tile) {
    cp_async_wait_all();
    __syncthreads();
    if (tile + 1 < num_tiles_) issue_copy(tile + 1);
    cp_async_commit();
    if (tile + 2 < num_tiles_) build_table(tile + 2);
    compute_logits(tile);
    __syncthreads();
    update_softmax(tile);
    __syncthreads();
    accumulate_values(tile);
  }
  cp_async_wait_all();
  __syncthreads();  // the tiles' memory now holds the split reduction
  reduce_splits();
  write_outputs();
}

template <DType kKV>
__global__ void __launch_bounds__(kThreads, 2)
    decode_kernel(const __grid_constant__ AttentionArgs args) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (static_cast<int>(blockIdx.x) >= args.num_items) return;
  const CudaWorkItem item = args.items[blockIdx.x];
  const int heads = item.qo_head_end - item.qo_head_begin;
  const int tokens = item.q_end - item.q_begin;
  if (heads <= 0 || tokens <= 0) return;
  const DecodeLayout layout = decode_layout(args.kv.head_dim, args.kv.v_head_dim, kElemBytes<kKV>);
  // The planner's contract (checked on the host): a broken one is a bug.
  if (heads * tokens > kDecodeMaxRows || layout.v_groups * kPvDims > kMaxVHeadDim) __trap();
  switch (choose_row_block(tokens, heads, layout.v_groups)) {
    case 4:
      DecodeCta<kKV, 4>(args, item, layout, smem).run();
      break;
    case 2:
      DecodeCta<kKV, 2>(args, item, layout, smem).run();
      break;
    default:
      DecodeCta<kKV, 1>(args, item, layout, smem).run();
  }
}

// This file's context for the backend's shared check (cuda_check.h).
void check_cuda(cudaError_t status, const char* what) {
  detail::check_cuda(status, "decode attention", what);
}

template <DType kKV>
void launch_typed(const AttentionArgs& args, const LaunchConfig& launch, Stream stream) {
  if (launch.shared_bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(decode_kernel<kKV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(launch.shared_bytes)),
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  decode_kernel<kKV>
      <<<launch.grid, launch.threads, launch.shared_bytes, static_cast<cudaStream_t>(stream)>>>(
          args);
  check_cuda(cudaGetLastError(), "decode_kernel launch");
}

}  // namespace

// threads: kThreads; grid: left 0 (the planner sets one CTA per decode item).
// shared_bytes: the layout above, or 0xffffffff (more than any device has)
// for the shapes the kernel does not serve: a dim < 1, v_head_dim > 512 (the
// accumulator registers) or head_dim > 1024. Every K/V dtype is served, f32
// included.
LaunchConfig decode_launch(std::int32_t head_dim, std::int32_t v_head_dim, DType kv_dtype) {
  LaunchConfig config;
  config.threads = kThreads;
  const bool served = head_dim >= 1 && head_dim <= kMaxHeadDim && v_head_dim >= 1 &&
                      v_head_dim <= kMaxVHeadDim && dtype_size(kv_dtype) > 0;
  config.shared_bytes =
      served
          ? decode_layout(head_dim, v_head_dim, static_cast<int>(dtype_size(kv_dtype))).total_bytes
          : kNotServed;
  return config;
}

void launch_decode(const AttentionArgs& args, const LaunchConfig& launch, Stream stream) {
  if (launch.grid == 0) return;
  const LaunchConfig expected = decode_launch(args.kv.head_dim, args.kv.v_head_dim, args.kv.dtype);
  require<InternalError>(
      expected.shared_bytes != kNotServed, "launch_decode: head_dim = ", args.kv.head_dim,
      ", v_head_dim = ", args.kv.v_head_dim, " is not served by the decode kernel");
  require<InternalError>(
      launch.threads == expected.threads && launch.shared_bytes >= expected.shared_bytes,
      "launch_decode: launch of ", launch.threads, " threads and ", launch.shared_bytes,
      " shared bytes; the kernel needs ", expected.threads, " and ", expected.shared_bytes);
  require<InternalError>(args.items != nullptr && args.num_items >= 0 &&
                             launch.grid <= static_cast<std::uint32_t>(args.num_items),
                         "launch_decode: grid = ", launch.grid, " exceeds the ", args.num_items,
                         " work items");
  switch (args.kv.dtype) {
    case DType::kF32:
      return launch_typed<DType::kF32>(args, launch, stream);
    case DType::kF16:
      return launch_typed<DType::kF16>(args, launch, stream);
    case DType::kBF16:
      return launch_typed<DType::kBF16>(args, launch, stream);
    case DType::kFP8E4M3:
      return launch_typed<DType::kFP8E4M3>(args, launch, stream);
    case DType::kFP8E5M2:
      return launch_typed<DType::kFP8E5M2>(args, launch, stream);
    case DType::kINT8:
      return launch_typed<DType::kINT8>(args, launch, stream);
  }
  throw InternalError("launch_decode: unknown K/V dtype");
}

}  // namespace pagedattn::cuda::detail
