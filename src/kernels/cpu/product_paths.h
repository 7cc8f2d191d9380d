// Whether a fast product path of the CPU attention kernel (bf16 dot
// products, f16 multiply-adds, int8 dot products) runs faster than f32
// products on this CPU, for one KV dtype, head shape and phase: decided by
// timing both once per process (AttentionPlanOptions::measured_products).
// The same instructions pay on one CPU and not on the next (vdpbf16ps issues
// at twice an FMA's rate on Zen 4 and 5, at half on Sapphire Rapids; a
// 512-bit FMA is full-rate on Zen 5 and Intel, double-pumped on Zen 4), and
// which conversion bounds a KV dtype's decode differs too, so the kernel
// asks the machine instead of a table of CPU models.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn::kernels {

enum class ProductPath : std::uint8_t {
  kBf16Prefill,  // outer products of prefill tiles on vdpbf16ps or AMX tiles
  kBf16Decode,   // decode rows on vdpbf16ps (bf16_decode-inl.h)
  kF16Decode,    // decode rows on AVX512-FP16 multiply-adds (f16_decode-inl.h)
  kInt8Decode,   // decode rows on vpdpbusd (int8_dot-inl.h)
};

// What the timing depends on besides the path.
struct ProductShape {
  DType kv_dtype = DType::kF16;
  KVLayout layout = KVLayout::kHND;
  std::int32_t head_dim = 0, v_head_dim = 0;
  std::int32_t group = 1;  // query heads per KV head
  bool v_in_k = false;     // MLA: V is the head of each K row

  friend bool operator==(const ProductShape&, const ProductShape&) = default;
};

// Whether `path` ran at least kFasterMargin faster than f32 products over
// the same small batch (decode: 4 sequences of 1,024 keys; prefill: 512
// query rows per KV head over 512 keys; an eighth under AddressSanitizer),
// with K and V evicted from the caches before each call, on the kernels'
// threads (OpenMP's maximum), both plans timed alternately, the best of
// several calls each. The first call
// for a (shape, path) times it (about 5-40 ms); later calls return the
// recorded answer. Thread-safe. Inside a parallel region an unrecorded
// (shape, path) is not timed (its other threads would wait for it) and the
// answer is false: run prepare_product_choice before a team. The caller checks that the CPU, the
// dispatched target and the KV dtype have the path (a path the kernel
// would not take times like f32 products, and its answer means nothing).
bool product_path_pays(const ProductShape& shape, ProductPath path);

// A fast path must take at most this fraction of the f32 path's time: the
// timings' spread on a quiet machine is a few percent, and a path that is
// only as fast costs accuracy for nothing.
inline constexpr double kFasterMargin = 0.95;

// PAGEDATTN_LOG_PRODUCT_PATHS=1 (set, not "0"): every timing of a product
// path, here and in the model's products, printed to stderr.
bool log_product_measurements();

}  // namespace pagedattn::kernels
