// Non-owning views of paged K/V: where the pages of one layer live
// (PagedKVStorage) and which pages a ragged batch of sequences uses
// (PagedKVTable, CSR). Kernels take these and never see sequence ids.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn {

// A [num_tokens][num_heads][dim] tensor with the last axis contiguous.
struct HeadTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;      // f32, f16 or bf16
  std::int64_t token_stride = 0;  // elements between consecutive tokens
  std::int64_t head_stride = 0;   // elements between consecutive heads
};

// HND: a page is [num_kv_heads][page_size][head_dim] (each head's tokens contiguous).
// NHD: a page is [page_size][num_kv_heads][head_dim] (each token's heads contiguous).
enum class KVLayout : std::uint8_t { kHND = 0, kNHD = 1 };

// The K and V pages of one layer. Strides are in elements and 64-bit, so a
// storage larger than 4 GiB is addressed correctly.
//
// Multi-head latent attention (MLA, DeepSeek-V2/V3) stores one row per token:
// K = [latent | rope key] and V = the latent, the first v_head_dim elements
// of that same row. Such a storage (v_in_k, see latent()) has V pointers and
// strides equal to K's, and its dequantisation scales are K's: kernels read
// V through them unchanged, writers (append, copies) skip V.
struct PagedKVStorage {
  void* k_data = nullptr;  // [num_pages] K pages, `dtype` elements
  void* v_data = nullptr;  // [num_pages] V pages, `dtype` elements
  DType dtype = DType::kF32;
  KVLayout layout = KVLayout::kHND;
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;    // K head dim
  std::int32_t v_head_dim = 0;  // V head dim
  std::int64_t num_pages = 0;
  std::int64_t k_page_stride = 0, k_head_stride = 0, k_token_stride = 0;
  std::int64_t v_page_stride = 0, v_head_stride = 0, v_token_stride = 0;

  // Dequantisation of fp8 / int8 storage: value = stored * scale.
  float k_scale = 1.0f, v_scale = 1.0f;  // fp8: one scale per tensor
  const float* k_head_scales = nullptr;  // fp8: [num_kv_heads] per-head scales (override)
  const float* v_head_scales = nullptr;  // fp8: [num_kv_heads]
  float* k_token_scales = nullptr;       // int8: per page [num_kv_heads][page_size]
  float* v_token_scales = nullptr;       // int8: same shape
  // int8: floats from one page's token scales to the next page's, K and V
  // alike (see token_scale_index). 0 means num_kv_heads * page_size: dense
  // [num_pages][num_kv_heads][page_size] arrays. PagedKVCache keeps a page's
  // K and V scales right after its K block, inside the K page stride (a K
  // page is [K block][K scales][V scales], so a page is two contiguous runs,
  // K and V): there this is k_page_stride / 4 and both scale pointers point
  // into k_data (see token_scales_in_k_pages).
  std::int64_t token_scale_page_stride = 0;
  bool v_in_k = false;  // MLA: V is the head of each K row, nothing stored for V
  // fp8 e4m3 only (ignored otherwise), optional: [num_pages] nonzero where a
  // written slot of the page may hold a NaN code (S.1111.111). With it,
  // attention decodes the blocks whose pages are all zero without mapping
  // NaN codes, instead of looking for them in every block it reads; null: it
  // looks. append_paged_kv sets the flag of every page it writes a NaN code
  // to. A writer that bypasses append_paged_kv must set it too, and a page
  // that changes owner may be zeroed (PagedKVCache does both for its pages).
  std::uint8_t* page_may_hold_nan = nullptr;

  // Floats between consecutive pages' token scales (token_scale_page_stride
  // resolved: never 0).
  constexpr std::int64_t token_scale_page_step() const {
    return token_scale_page_stride != 0 ? token_scale_page_stride
                                        : std::int64_t{num_kv_heads} * page_size;
  }
  // Index of (page, head, slot) in the int8 token-scale arrays: a page's
  // scales are [num_kv_heads][page_size] contiguous floats.
  constexpr std::int64_t token_scale_index(std::int64_t page, std::int64_t head,
                                           std::int64_t slot) const {
    return page * token_scale_page_step() + head * page_size + slot;
  }
  // int8: whether each page's K and V token scales lie inside that page's
  // k_page_stride bytes from k_offset(page, 0, 0), so a copy of whole K
  // pages carries them (PagedKVCache's storage). False for other dtypes and
  // for scales in arrays of their own.
  bool token_scales_in_k_pages() const {
    return token_scales_in_k_page(k_token_scales) && token_scales_in_k_page(v_token_scales);
  }
  // Dequantisation scale of K / V at (page, head, slot); 1 for float storage.
  constexpr float k_dequant(std::int64_t page, std::int64_t head, std::int64_t slot) const {
    if (dtype == DType::kINT8) return k_token_scales[token_scale_index(page, head, slot)];
    if (is_fp8(dtype)) return k_head_scales ? k_head_scales[head] : k_scale;
    return 1.0f;
  }
  constexpr float v_dequant(std::int64_t page, std::int64_t head, std::int64_t slot) const {
    if (dtype == DType::kINT8) return v_token_scales[token_scale_index(page, head, slot)];
    if (is_fp8(dtype)) return v_head_scales ? v_head_scales[head] : v_scale;
    return 1.0f;
  }

  // Element offset of K[page][head][slot][0] from k_data.
  constexpr std::int64_t k_offset(std::int64_t page, std::int64_t head, std::int64_t slot) const {
    return page * k_page_stride + head * k_head_stride + slot * k_token_stride;
  }
  // Element offset of V[page][head][slot][0] from v_data.
  constexpr std::int64_t v_offset(std::int64_t page, std::int64_t head, std::int64_t slot) const {
    return page * v_page_stride + head * v_head_stride + slot * v_token_stride;
  }

  // Densely packed storage with the strides of `layout`.
  static constexpr PagedKVStorage dense(void* k, void* v, DType dtype, KVLayout layout,
                                        std::int32_t page_size, std::int32_t num_kv_heads,
                                        std::int32_t head_dim, std::int32_t v_head_dim,
                                        std::int64_t num_pages) {
    PagedKVStorage s;
    s.k_data = k;
    s.v_data = v;
    s.dtype = dtype;
    s.layout = layout;
    s.page_size = page_size;
    s.num_kv_heads = num_kv_heads;
    s.head_dim = head_dim;
    s.v_head_dim = v_head_dim;
    s.num_pages = num_pages;
    const std::int64_t tokens = page_size, heads = num_kv_heads;
    s.k_page_stride = tokens * heads * head_dim;
    s.v_page_stride = tokens * heads * v_head_dim;
    if (layout == KVLayout::kHND) {
      s.k_head_stride = tokens * head_dim;
      s.k_token_stride = head_dim;
      s.v_head_stride = tokens * v_head_dim;
      s.v_token_stride = v_head_dim;
    } else {
      s.k_head_stride = head_dim;
      s.k_token_stride = heads * head_dim;
      s.v_head_stride = v_head_dim;
      s.v_token_stride = heads * v_head_dim;
    }
    return s;
  }

  // MLA storage: one [page_size][head_dim] row block per page (a single KV
  // head, so HND and NHD give the same addresses), V = the first v_head_dim
  // elements of each row (v_head_dim <= head_dim). Scales: set k_*, then
  // share_k_scales_with_v().
  static constexpr PagedKVStorage latent(void* kv, DType dtype, KVLayout layout,
                                         std::int32_t page_size, std::int32_t head_dim,
                                         std::int32_t v_head_dim, std::int64_t num_pages) {
    PagedKVStorage s = dense(kv, kv, dtype, layout, page_size, 1, head_dim, v_head_dim, num_pages);
    s.v_page_stride = s.k_page_stride;
    s.v_head_stride = s.k_head_stride;
    s.v_token_stride = s.k_token_stride;
    s.v_in_k = true;
    return s;
  }
  // After the scales of an MLA storage are set on K: V shares them.
  constexpr void share_k_scales_with_v() {
    v_scale = k_scale;
    v_head_scales = k_head_scales;
    v_token_scales = k_token_scales;
  }

 private:
  // Whether page 0's [num_kv_heads][page_size] scales at `scales` lie in K
  // page 0 (int8 elements are bytes), pages being token_scale_page_step()
  // floats apart as K pages are.
  bool token_scales_in_k_page(const float* scales) const {
    if (dtype != DType::kINT8 || k_data == nullptr || scales == nullptr) return false;
    const std::int64_t scale_bytes = std::int64_t{num_kv_heads} * page_size * 4;
    const auto at = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(scales) -
                                              reinterpret_cast<std::uintptr_t>(k_data));
    return token_scale_page_step() * 4 == k_page_stride && at >= 0 &&
           at + scale_bytes <= k_page_stride;
  }
};

// The page table of a ragged batch in CSR form (FlashInfer's paged_kv_t shape),
// extended with an optional gap for sliding windows with attention sinks:
// key j of sequence b lives at physical slot j when j < kv_sink_lens[b], and
// at slot j + kv_gap_lens[b] otherwise; slot s is in page
// kv_indices[kv_indptr[b] + s / page_size] at offset s % page_size.
struct PagedKVTable {
  std::int32_t batch_size = 0;
  std::int32_t page_size = 0;
  const std::int32_t* qo_indptr =
      nullptr;  // [batch_size + 1] offsets of each sequence's new tokens
  const std::int32_t* kv_indptr = nullptr;   // [batch_size + 1] offsets into kv_indices
  const std::int32_t* kv_indices = nullptr;  // [kv_indptr[batch_size]] page ids in logical order
  const std::int32_t* kv_last_page_len =
      nullptr;                            // [batch_size] used slots of the last page (0 if none)
  const std::int32_t* kv_lens = nullptr;  // [batch_size] keys after this step's append
  const std::int32_t* kv_sink_lens = nullptr;  // [batch_size] or nullptr (no gap anywhere)
  const std::int32_t* kv_gap_lens = nullptr;   // [batch_size] or nullptr (no gap anywhere)

  constexpr std::int32_t num_pages_of(std::int32_t b) const {
    return kv_indptr[b + 1] - kv_indptr[b];
  }
  constexpr std::int32_t q_len(std::int32_t b) const { return qo_indptr[b + 1] - qo_indptr[b]; }

  // Physical slot (within the sequence's pages) of key j of sequence b.
  constexpr std::int64_t slot_of_key(std::int32_t b, std::int64_t j) const {
    if (kv_gap_lens == nullptr || j < kv_sink_lens[b]) return j;
    return j + kv_gap_lens[b];
  }
  // Page id holding key j of sequence b.
  constexpr std::int32_t page_of_key(std::int32_t b, std::int64_t j) const {
    return kv_indices[kv_indptr[b] + slot_of_key(b, j) / page_size];
  }
  // Offset inside that page.
  constexpr std::int32_t offset_of_key(std::int32_t b, std::int64_t j) const {
    return static_cast<std::int32_t>(slot_of_key(b, j) % page_size);
  }
};

}  // namespace pagedattn
