// Tile sizes and the per-thread scratch layout shared by the planner and the
// CPU kernel.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pagedattn::kernels {

struct AttentionTraits {
  static constexpr std::int32_t kKeyBlock = 32;     // keys scored per inner block
  static constexpr std::int32_t kTargetRows = 256;  // query rows (tokens x group heads) per item
  // Key blocks one step of the AMX prefill covers (256 keys): the online
  // softmax and the output tiles' loads and stores once per step, not per block.
  static constexpr std::int32_t kTileBlocks = 8;
  static constexpr std::int32_t kLanePad = 16;  // dims padded to whole 512-bit f32 vectors
  static constexpr std::size_t kAlign = 64;     // byte alignment of every scratch array
  static_assert(kKeyBlock % 4 == 0, "QK scores 4 keys at a time");
  static_assert(kLanePad % 4 == 0 && kLanePad <= 16, "pad covers every Highway f32 width <= 512");
};

constexpr std::int32_t padded_dim(std::int32_t d) {
  return (d + AttentionTraits::kLanePad - 1) / AttentionTraits::kLanePad *
         AttentionTraits::kLanePad;
}

constexpr std::size_t align_up(std::size_t bytes) {
  return (bytes + AttentionTraits::kAlign - 1) / AttentionTraits::kAlign * AttentionTraits::kAlign;
}

// The first `bytes` of `buffer` from an address aligned to kAlign, where a
// plan's workspace must start; `buffer` grows (losing its contents) to hold
// them.
inline std::span<std::byte> aligned_workspace(std::vector<std::byte>& buffer, std::size_t bytes) {
  if (buffer.size() < bytes + AttentionTraits::kAlign)
    buffer.resize(bytes + AttentionTraits::kAlign);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  const std::size_t pad =
      (AttentionTraits::kAlign - address % AttentionTraits::kAlign) % AttentionTraits::kAlign;
  return {buffer.data() + pad, bytes};
}

// Byte offsets of one thread's float scratch arrays.
struct ScratchLayout {
  std::size_t q = 0;  // [rows][pad(D)] scaled queries
  std::size_t o = 0;  // [rows][pad(Dv)] unnormalised outputs
  std::size_t m = 0;  // [rows] running max
  std::size_t l = 0;  // [rows] running denominator
  std::size_t s =
      0;  // [kTileBlocks][rows][kKeyBlock] scores, then probabilities (one block but on AMX)
  std::size_t k = 0;   // [kKeyBlock][pad(D)] keys as f32, or kTileBlocks blocks of packed bf16
  std::size_t v = 0;   // [kKeyBlock][pad(Dv)] values as f32, or kTileBlocks blocks of packed bf16
  std::size_t qh = 0;  // [rows][pad(D)] bf16 or f16 queries (the bf16 / f16 product paths)
  std::size_t qh_inv = 0;    // [rows] inverse factors of the f16 queries
  std::size_t q8 = 0;        // [rows][pad(D)] int8 queries (the int8 dot-product path)
  std::size_t q8_scale = 0;  // [rows] their dequantisation scales
  std::size_t q8_sum = 0;    // [rows] int32 sums of their elements
  std::size_t w_scale = 0;   // [rows] dequantisation scales of a block's u8 weights
  std::size_t zero = 0;      // a zero row, as wide as the widest K/V row in f32
  std::size_t zero_bytes = 0;
  std::size_t bytes = 0;
};

constexpr ScratchLayout scratch_layout(std::int32_t rows, std::int32_t head_dim,
                                       std::int32_t v_head_dim) {
  const std::size_t r = static_cast<std::size_t>(rows), f = sizeof(float);
  const std::size_t dq = static_cast<std::size_t>(padded_dim(head_dim));
  const std::size_t dv = static_cast<std::size_t>(padded_dim(v_head_dim));
  const std::size_t kb = AttentionTraits::kKeyBlock;
  const std::size_t tile_keys = kb * AttentionTraits::kTileBlocks;
  const std::size_t bf16 = sizeof(std::uint16_t);
  ScratchLayout l;
  l.q = 0;
  l.o = l.q + align_up(r * dq * f);
  l.m = l.o + align_up(r * dv * f);
  l.l = l.m + align_up(r * f);
  l.s = l.l + align_up(r * f);
  l.k = l.s + align_up(r * tile_keys * f);
  l.v = l.k + align_up(std::max(kb * dq * f, tile_keys * dq * bf16));
  l.qh = l.v + align_up(std::max(kb * dv * f, tile_keys * dv * bf16));
  l.qh_inv = l.qh + align_up(r * dq * sizeof(std::uint16_t));
  l.q8 = l.qh_inv + align_up(r * f);
  l.q8_scale = l.q8 + align_up(r * dq);
  l.q8_sum = l.q8_scale + align_up(r * f);
  l.w_scale = l.q8_sum + align_up(r * sizeof(std::int32_t));
  l.zero = l.w_scale + align_up(r * f);
  l.zero_bytes = align_up((dq > dv ? dq : dv) * f);
  l.bytes = l.zero + l.zero_bytes;
  return l;
}

// Bytes of one partial slot: [rows][pad(Dv)] outputs then [rows] LSE.
constexpr std::size_t partial_slot_bytes(std::int32_t rows, std::int32_t v_head_dim) {
  const std::size_t r = static_cast<std::size_t>(rows);
  return align_up(r * static_cast<std::size_t>(padded_dim(v_head_dim)) * sizeof(float)) +
         align_up(r * sizeof(float));
}

}  // namespace pagedattn::kernels
