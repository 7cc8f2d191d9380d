// Attention benchmark workloads, shared by the Google Benchmark program
// (bench/bench_attention.cc) and `pagedattn bench-attention`: a shape
// (Config) and the pages, page tables, queries and outputs for it (Workload).
// Each workload owns enough independent copies of its K/V (separate,
// shuffled page ranges of one pool) to exceed the last-level cache several
// times, so that a call rotating through them reads K/V from DRAM.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "machine_probes.h"
#include "pagedattn/attention.h"
#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn::bench {

namespace pa = pagedattn;
namespace pb = pagedattn::bench;
using pa::DType;

inline std::string short_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kINT8:
      return "int8";
  }
  return "?";
}

// The working set all copies of a workload add up to (at least).
inline std::size_t min_working_set() {
  static const std::size_t bytes = min_working_set_bytes();
  return bytes;
}

// --- workloads ---------------------------------------------------------------------------

struct Config {
  DType kv = DType::kF16;
  std::int32_t qo_heads = 32, kv_heads = 8, head_dim = 128;
  std::int32_t batch = 1, q_len = 1, kv_len = 4096;
  std::int32_t page = 16;
  bool contiguous = false;  // one page per sequence (page_size = kv_len) instead of `page`
  // Page ids in the pool's order (each sequence's pages side by side in
  // memory) instead of shuffled over the whole pool as a long-running cache
  // leaves them: separates the cost of the indirection from that of pages
  // at random places.
  bool pages_in_order = false;
  // Multi-head latent attention (kv_heads 1): each token's one row is K
  // ([latent | rope], head_dim) and its first mla_latent elements are V;
  // 0: separate K and V of head_dim each.
  std::int32_t mla_latent = 0;
  std::int32_t v_dim = 0;  // V head dim of separate K and V (0: head_dim)
  // fp8 e4m3: the storage carries page_may_hold_nan, as a PagedKVCache's
  // does (all clear: value_pattern writes no NaN code).
  bool page_flags = false;

  bool mla() const { return mla_latent > 0; }
  std::int32_t v_head_dim() const { return mla() ? mla_latent : v_dim > 0 ? v_dim : head_dim; }
  // V rows stored apart from K (0 for MLA), and int8 scale arrays.
  std::int32_t stored_v_dim() const { return mla() ? 0 : v_head_dim(); }
  std::int32_t scale_arrays() const { return mla() ? 1 : 2; }
  std::int32_t page_size() const { return contiguous ? kv_len : page; }
  // Whether the pool's page ids stay in order (contiguous sequences own one
  // page each: their order is shuffled like any other).
  bool keeps_page_order() const { return pages_in_order && !contiguous; }
  std::string key() const {
    return short_name(kv) + "/" + std::to_string(qo_heads) + "x" + std::to_string(kv_heads) + "/d" +
           std::to_string(head_dim) + "/b" + std::to_string(batch) + "/q" + std::to_string(q_len) +
           "/kv" + std::to_string(kv_len) +
           (contiguous ? "/contig" : "/paged" + std::to_string(page)) +
           (keeps_page_order() ? "/in_order" : "") +
           (mla() ? "/mla" + std::to_string(mla_latent) : "") +
           (v_dim > 0 && !mla() ? "/dv" + std::to_string(v_dim) : "") +
           (page_flags ? "/page_flags" : "");
  }
  // Queries and outputs: f16 with f16 KV, f32 with f32 KV, bf16 otherwise.
  DType act() const { return kv == DType::kF16 || kv == DType::kF32 ? kv : DType::kBF16; }
  std::int32_t pages_per_seq() const { return (kv_len + page_size() - 1) / page_size(); }
  std::size_t page_bytes() const {  // K + V (+ int8 token scales) of one page
    std::size_t b =
        std::size_t(page_size()) * kv_heads * (head_dim + stored_v_dim()) * pa::dtype_size(kv);
    if (kv == DType::kINT8)
      b += std::size_t(page_size()) * kv_heads * scale_arrays() * sizeof(float);
    return b;
  }
  // One page of K for every KV head: the contiguous run a decode reads at a
  // random place (the paged read probe's run length; V's pages are alike).
  std::size_t k_page_bytes() const {
    return std::size_t(page_size()) * kv_heads * head_dim * pa::dtype_size(kv);
  }
  std::size_t copy_bytes() const { return std::size_t(batch) * pages_per_seq() * page_bytes(); }
  std::int32_t copies() const {
    return static_cast<std::int32_t>(
        std::max<std::size_t>(1, (min_working_set() + copy_bytes() - 1) / copy_bytes()));
  }
  std::size_t storage_bytes() const {
    return (std::size_t(copies()) * batch * pages_per_seq() + 3) * page_bytes();
  }
  // K+V bytes one call reads (int8: with its per-token scales).
  double kv_bytes_per_call() const {
    double per_token = double(kv_heads) * (head_dim + stored_v_dim()) * double(pa::dtype_size(kv));
    if (kv == DType::kINT8) per_token += double(kv_heads) * scale_arrays() * sizeof(float);
    return double(batch) * kv_len * per_token;
  }
  // FLOPs of one call, causal (attention_flops).
  double flops_per_call() const {
    return attention_flops(batch, qo_heads, (head_dim + v_head_dim()) / 2.0, q_len, kv_len);
  }
};

// A pattern of `n` well-scaled random values stored as `t` (N(0,1) values;
// fp8 divided by kFp8Scale, int8 by kInt8Scale), so that no NaN, infinity or
// denormal reaches the kernel.
constexpr float kFp8Scale = 0.05f;
constexpr float kInt8Scale = 4.0f / 127.0f;

inline std::vector<unsigned char> value_pattern(DType t, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<unsigned char> out(n * pa::dtype_size(t));
  const float div = t == DType::kINT8 ? kInt8Scale : pa::is_quantized(t) ? kFp8Scale : 1.0f;
  for (std::size_t i = 0; i < n; ++i) pa::store_from_float(out.data(), t, i, normal(rng) / div);
  return out;
}

// Fills `bytes` at `dst` with 64 KiB blocks of `pattern`, each from a
// pseudo-random 64-byte aligned offset; all threads (first touch).
inline void fill_from_pattern(std::byte* dst, std::size_t bytes,
                              const std::vector<unsigned char>& pattern, std::uint64_t salt) {
  constexpr std::size_t kBlock = 64 * 1024;
  const std::size_t span = (pattern.size() - kBlock) / 64;
  const std::int64_t blocks = static_cast<std::int64_t>((bytes + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < blocks; ++i) {
    std::uint64_t h = (std::uint64_t(i) + salt) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    const std::size_t off = std::size_t(h % span) * 64;
    const std::size_t at = std::size_t(i) * kBlock;
    std::memcpy(dst + at, pattern.data() + off, std::min(kBlock, bytes - at));
  }
}

// Owns the pages (K, V, int8 scales), one page table per copy, queries and
// outputs of one benchmark shape.
class Workload {
 public:
  explicit Workload(const Config& c, const Workload* copy_from = nullptr)
      : c_(c), copies_(copy_from ? copy_from->copies_ : c.copies()) {
    const std::int32_t pps = c_.pages_per_seq(), ps = c_.page_size();
    for (std::int32_t b = 0; b <= c_.batch; ++b) {
      qo_indptr_.push_back(b * c_.q_len);
      kv_indptr_.push_back(b * pps);
    }
    kv_lens_.assign(std::size_t(c_.batch), c_.kv_len);
    last_page_len_.assign(std::size_t(c_.batch), c_.kv_len - (pps - 1) * ps);
    // One pool, page ids shuffled over all of it (unless keeps_page_order());
    // each copy takes the next batch x pages_per_seq ids, in that random
    // order (like a real cache).
    num_pages_ = std::int64_t{copies_} * c_.batch * pps + 3;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages_));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(12345);
    if (!c_.keeps_page_order()) std::shuffle(ids.begin(), ids.end(), rng);
    const std::size_t per_copy = std::size_t(c_.batch) * pps;
    for (std::int32_t k = 0; k < copies_; ++k)
      kv_indices_.emplace_back(ids.begin() + std::ptrdiff_t(k * per_copy),
                               ids.begin() + std::ptrdiff_t((k + 1) * per_copy));

    const std::size_t es = pa::dtype_size(c_.kv);
    const std::size_t elems = std::size_t(num_pages_) * ps * c_.kv_heads * c_.head_dim;
    const std::size_t v_elems = std::size_t(num_pages_) * ps * c_.kv_heads * c_.stored_v_dim();
    k_ = pb::HugeBuffer(elems * es);
    if (!c_.mla()) v_ = pb::HugeBuffer(v_elems * es);
    if (c_.kv == DType::kINT8) {
      const std::size_t slots = std::size_t(num_pages_) * ps * c_.kv_heads;
      k_scales_ = pb::HugeBuffer(slots * sizeof(float));
      if (!c_.mla()) v_scales_ = pb::HugeBuffer(slots * sizeof(float));
    }
    if (copy_from) {
      copy_kv_from(*copy_from);
    } else {
      const auto pattern = value_pattern(c_.kv, std::size_t{1} << 20, 7);
      fill_from_pattern(k_.data(), elems * es, pattern, 1);
      if (!c_.mla()) fill_from_pattern(v_.data(), v_elems * es, pattern, 2);
      if (c_.kv == DType::kINT8) {
        const std::size_t slots = std::size_t(num_pages_) * ps * c_.kv_heads;
        fill_scales(reinterpret_cast<float*>(k_scales_.data()), slots);
        if (!c_.mla()) fill_scales(reinterpret_cast<float*>(v_scales_.data()), slots);
      }
    }
    if (c_.page_flags) nan_flags_.assign(std::size_t(num_pages_), 0);
    const std::size_t tokens = std::size_t(c_.batch) * c_.q_len;
    const std::size_t q_elems = tokens * c_.qo_heads * c_.head_dim;
    q_ = value_pattern(c_.act(), q_elems, 11);
    o_.assign(tokens * c_.qo_heads * c_.v_head_dim() * pa::dtype_size(c_.act()), 0);
  }

  const Config& config() const { return c_; }
  std::int32_t copies() const { return copies_; }
  std::size_t bytes() const { return k_.size() + v_.size() + k_scales_.size() + v_scales_.size(); }

  pa::AttentionParams params(std::int32_t copy) {
    pa::AttentionParams p;
    const DType act = c_.act();
    const std::int64_t row = std::int64_t{c_.qo_heads} * c_.head_dim;
    p.q = {q_.data(), act, row, c_.head_dim};
    p.o = {o_.data(), act, std::int64_t{c_.qo_heads} * c_.v_head_dim(), c_.v_head_dim()};
    p.num_qo_heads = c_.qo_heads;
    p.table.batch_size = c_.batch;
    p.table.page_size = c_.page_size();
    p.table.qo_indptr = qo_indptr_.data();
    p.table.kv_indptr = kv_indptr_.data();
    p.table.kv_indices = kv_indices_[std::size_t(copy)].data();
    p.table.kv_last_page_len = last_page_len_.data();
    p.table.kv_lens = kv_lens_.data();
    p.kv = storage();
    p.options.causal = true;
    return p;
  }

  pa::PagedKVStorage storage() const {
    if (c_.mla()) {
      auto s = pa::PagedKVStorage::latent(k_.data(), c_.kv, pa::KVLayout::kHND, c_.page_size(),
                                          c_.head_dim, c_.mla_latent, num_pages_);
      s.k_scale = kFp8Scale;
      if (c_.kv == DType::kINT8) s.k_token_scales = reinterpret_cast<float*>(k_scales_.data());
      s.share_k_scales_with_v();
      return s;
    }
    auto s =
        pa::PagedKVStorage::dense(k_.data(), v_.data(), c_.kv, pa::KVLayout::kHND, c_.page_size(),
                                  c_.kv_heads, c_.head_dim, c_.v_head_dim(), num_pages_);
    s.k_scale = s.v_scale = kFp8Scale;
    if (!nan_flags_.empty()) s.page_may_hold_nan = const_cast<std::uint8_t*>(nan_flags_.data());
    if (c_.kv == DType::kINT8) {
      s.k_token_scales = reinterpret_cast<float*>(k_scales_.data());
      s.v_token_scales = reinterpret_cast<float*>(v_scales_.data());
    }
    return s;
  }

 private:
  static void fill_scales(float* s, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) s[i] = kInt8Scale * (0.75f + 0.5f * float(i % 97) / 97.0f);
  }

  // The same keys and values as `src` (same shape, same copy count; any page
  // sizes), copied run by run.
  void copy_kv_from(const Workload& src) {
    const pa::PagedKVStorage from = src.storage(), to = storage();
    const std::size_t es = pa::dtype_size(c_.kv);
    const std::int32_t sps = src.c_.page_size(), dps = c_.page_size();
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (std::int32_t k = 0; k < copies_; ++k)
      for (std::int32_t b = 0; b < c_.batch; ++b)
        for (std::int32_t h = 0; h < c_.kv_heads; ++h)
          for (std::int32_t j = 0; j < c_.kv_len;) {
            const std::int32_t run = std::min({sps - j % sps, dps - j % dps, c_.kv_len - j});
            const std::int32_t sp =
                src.kv_indices_[std::size_t(k)]
                               [std::size_t(b) * src.c_.pages_per_seq() + std::size_t(j / sps)];
            const std::int32_t dp =
                kv_indices_[std::size_t(k)]
                           [std::size_t(b) * c_.pages_per_seq() + std::size_t(j / dps)];
            const std::size_t n = std::size_t(run) * c_.head_dim * es;
            std::memcpy(to_bytes(to.k_data) + std::size_t(to.k_offset(dp, h, j % dps)) * es,
                        to_bytes(from.k_data) + std::size_t(from.k_offset(sp, h, j % sps)) * es, n);
            if (!c_.mla())
              std::memcpy(to_bytes(to.v_data) + std::size_t(to.v_offset(dp, h, j % dps)) * es,
                          to_bytes(from.v_data) + std::size_t(from.v_offset(sp, h, j % sps)) * es,
                          std::size_t(run) * c_.v_head_dim() * es);
            if (c_.kv == DType::kINT8)
              for (std::int32_t i = 0; i < run; ++i) {
                to.k_token_scales[to.token_scale_index(dp, h, j % dps + i)] =
                    from.k_token_scales[from.token_scale_index(sp, h, j % sps + i)];
                if (c_.mla()) continue;
                to.v_token_scales[to.token_scale_index(dp, h, j % dps + i)] =
                    from.v_token_scales[from.token_scale_index(sp, h, j % sps + i)];
              }
            j += run;
          }
  }
  static std::byte* to_bytes(void* p) {
    return static_cast<std::byte*>(p);
  }

  Config c_;
  std::int32_t copies_ = 1;
  std::int64_t num_pages_ = 0;
  std::vector<std::int32_t> qo_indptr_, kv_indptr_, kv_lens_, last_page_len_;
  std::vector<std::vector<std::int32_t>> kv_indices_;  // [copy]
  pb::HugeBuffer k_, v_, k_scales_, v_scales_;
  std::vector<unsigned char> q_, o_;
  std::vector<std::uint8_t> nan_flags_;  // [num_pages_] with page_flags
};

}  // namespace pagedattn::bench
