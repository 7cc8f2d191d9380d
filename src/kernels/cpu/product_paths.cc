#include "kernels/cpu/product_paths.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

#include "core/sanitizers.h"
#include "core/seconds_since.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/prefetch.h"
#include "pagedattn/attention.h"

namespace pagedattn::kernels {
namespace {

// Under AddressSanitizer a timing measures the instrumentation, not the
// kernels, and took seconds a shape: it runs once, on an eighth of the keys,
// which still takes every line of the choice.
constexpr std::int32_t kKeysDivisor = core::kAddressSanitizer ? 8 : 1;
constexpr int kRounds = core::kAddressSanitizer ? 1 : 7;

// The timed batch of one phase and its memory. Decode: 4 sequences of one
// query over 1,024 keys; prefill: one sequence of 512 / group queries (at
// least 16: 512 rows of a KV head whatever the group) over 512 keys
// (causal, bottom-right); both divided by kKeysDivisor. Two KV heads (one
// for MLA), page size 16, pages in order. K, V and queries are uniform in
// [-1, 1) (int8: x 127, token scales 1 / 127).
class TimedBatch {
 public:
  TimedBatch(const ProductShape& s, bool prefill) {
    const std::int32_t batch = prefill ? 1 : 4;
    const std::int32_t q_len = prefill ? std::max(16, 512 / kKeysDivisor / s.group) : 1;
    const std::int32_t kv_len = (prefill ? 512 : 1024) / kKeysDivisor;
    const std::int32_t pages_per_seq = kv_len / kPageSize;
    const std::int32_t kv_heads = s.v_in_k ? 1 : 2, qo_heads = kv_heads * s.group;
    const std::int64_t pages = std::int64_t{batch} * pages_per_seq;
    for (std::int32_t b = 0; b <= batch; ++b) {
      qo_indptr_.push_back(b * q_len);
      kv_indptr_.push_back(b * pages_per_seq);
    }
    for (std::int32_t i = 0; i < pages; ++i) kv_indices_.push_back(i);
    last_page_len_.assign(batch, kPageSize);
    kv_lens_.assign(batch, kv_len);

    const std::int64_t k_elems = pages * kPageSize * kv_heads * s.head_dim;
    const std::int64_t v_elems = s.v_in_k ? 0 : pages * kPageSize * kv_heads * s.v_head_dim;
    k_ = random_elements(s.kv_dtype, k_elems);
    v_ = random_elements(s.kv_dtype, v_elems);
    PagedKVStorage kv =
        s.v_in_k ? PagedKVStorage::latent(k_.data(), s.kv_dtype, s.layout, kPageSize, s.head_dim,
                                          s.v_head_dim, pages)
                 : PagedKVStorage::dense(k_.data(), v_.data(), s.kv_dtype, s.layout, kPageSize,
                                         kv_heads, s.head_dim, s.v_head_dim, pages);
    if (s.kv_dtype == DType::kINT8) {
      token_scales_.assign(static_cast<std::size_t>(pages * kv_heads * kPageSize), 1.0f / 127.0f);
      kv.k_token_scales = token_scales_.data();
      kv.v_token_scales = token_scales_.data();
    }
    const std::int64_t tokens = std::int64_t{batch} * q_len;
    q_ = random_floats(tokens * qo_heads * s.head_dim, 1.0f);
    o_.resize(static_cast<std::size_t>(tokens * qo_heads * s.v_head_dim));

    params_.q = {q_.data(), DType::kF32, std::int64_t{qo_heads} * s.head_dim, s.head_dim};
    params_.o = {o_.data(), DType::kF32, std::int64_t{qo_heads} * s.v_head_dim, s.v_head_dim};
    params_.num_qo_heads = qo_heads;
    params_.table = {batch,
                     kPageSize,
                     qo_indptr_.data(),
                     kv_indptr_.data(),
                     kv_indices_.data(),
                     last_page_len_.data(),
                     kv_lens_.data()};
    params_.kv = kv;
  }
  TimedBatch(const TimedBatch&) = delete;
  TimedBatch& operator=(const TimedBatch&) = delete;

  const AttentionParams& params() const { return params_; }

  // Evicts K, V and the token scales from every cache level, so that a
  // call reads them from DRAM as a serving step does (a server's KV is many
  // times the caches).
  void evict() const {
#if defined(__x86_64__) || defined(_M_X64)
    for (const auto* bytes : {&k_, &v_})
      for (std::size_t at = 0; at < bytes->size(); at += kLineBytes) _mm_clflush(&(*bytes)[at]);
    const auto* scales = reinterpret_cast<const std::byte*>(token_scales_.data());
    for (std::size_t at = 0; at < token_scales_.size() * sizeof(float); at += kLineBytes)
      _mm_clflush(scales + at);
    _mm_mfence();
#endif
  }

 private:
  static constexpr std::int32_t kPageSize = 16;

  std::vector<float> random_floats(std::int64_t n, float multiplier) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) {
      state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
      e = multiplier * (static_cast<float>(state_ >> 40) * 0x1p-23f - 1.0f);
    }
    return x;
  }
  std::vector<std::byte> random_elements(DType dtype, std::int64_t n) {
    const float multiplier = dtype == DType::kINT8 ? 127.0f : 1.0f;
    const std::vector<float> x = random_floats(n, 1.0f);
    std::vector<std::byte> bytes(static_cast<std::size_t>(n) * dtype_size(dtype));
    convert_row(x.data(), DType::kF32, bytes.data(), dtype, n, multiplier);
    return bytes;
  }

  std::uint64_t state_ = 0x9e3779b97f4a7c15ull;
  std::vector<std::int32_t> qo_indptr_, kv_indptr_, kv_indices_, last_page_len_, kv_lens_;
  std::vector<std::byte> k_, v_;
  std::vector<float> token_scales_, q_, o_;
  AttentionParams params_;
};

AttentionPlanOptions timed_options(ProductPath path, bool fast) {
  AttentionPlanOptions o;
  o.num_threads = 0;  // the kernels' own: OpenMP's maximum
  o.fp8_fast_products = false;
  o.fast_prefill_products = false;
  o.measured_products = false;  // the timed calls must not time again
  if (!fast) return o;
  o.bf16_products = path == ProductPath::kBf16Prefill || path == ProductPath::kBf16Decode;
  o.f16_products = path == ProductPath::kF16Decode;
  o.int8_products = path == ProductPath::kInt8Decode;
  return o;
}

const char* path_name(ProductPath path) {
  switch (path) {
    case ProductPath::kBf16Prefill:
      return "bf16 prefill";
    case ProductPath::kBf16Decode:
      return "bf16 decode";
    case ProductPath::kF16Decode:
      return "f16 decode";
    case ProductPath::kInt8Decode:
      return "int8 decode";
  }
  return "?";
}

bool time_path(const ProductShape& shape, ProductPath path) {
  const TimedBatch batch(shape, path == ProductPath::kBf16Prefill);
  AttentionRunner f32(timed_options(path, false)), fast(timed_options(path, true));
  auto seconds = [&](AttentionRunner& runner) {
    batch.evict();
    const double start = steady_seconds();
    runner.run(batch.params());
    return steady_seconds() - start;
  };
  if (kRounds > 1) {  // warm-up: first touches, workspaces, caches
    seconds(f32);
    seconds(fast);
  }
  double best_f32 = std::numeric_limits<double>::infinity(), best_fast = best_f32;
  for (int round = 0; round < kRounds; ++round) {
    best_f32 = std::min(best_f32, seconds(f32));
    best_fast = std::min(best_fast, seconds(fast));
  }
  const bool pays = best_fast < kFasterMargin * best_f32;
  if (log_product_measurements())
    std::fprintf(stderr,
                 "pagedattn: %s products for %s KV (head dims %d/%d, group %d): %.3f ms against "
                 "%.3f ms on f32 products: %s\n",
                 path_name(path), std::string(dtype_name(shape.kv_dtype)).c_str(), shape.head_dim,
                 shape.v_head_dim, shape.group, best_fast * 1e3, best_f32 * 1e3,
                 pays ? "taken" : "not taken");
  return pays;
}

struct Measured {
  ProductShape shape;
  ProductPath path;
  bool pays;
};

}  // namespace

bool log_product_measurements() {
  const char* v = std::getenv("PAGEDATTN_LOG_PRODUCT_PATHS");
  return v != nullptr && v[0] != '\0' && std::string_view(v) != "0";
}

bool product_path_pays(const ProductShape& shape, ProductPath path) {
  static std::mutex mutex;
  static std::vector<Measured> measured;
  const std::lock_guard lock(mutex);
  const auto known = std::find_if(measured.begin(), measured.end(), [&](const Measured& m) {
    return m.shape == shape && m.path == path;
  });
  if (known != measured.end()) return known->pays;
  // A timing opens parallel regions of its own; inside a team (whose other
  // threads would wait on this lock, or on a barrier the timing never
  // reaches) the call keeps f32 products and records nothing. Callers that
  // run attention in a team time their shape before it
  // (prepare_product_choice).
  if (omp_in_parallel()) return false;
  const bool pays = time_path(shape, path);
  measured.push_back({shape, path, pays});
  return pays;
}

}  // namespace pagedattn::kernels
