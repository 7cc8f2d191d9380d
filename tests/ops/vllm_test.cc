// vLLM paged_attn ops: decode / prefix parity with the scalar reference on
// vLLM's test matrix (7 sequences, heads (40,40) (64,8), head sizes 64..256,
// blocks 16/32, ALiBi, fp8), exact reshape_and_cache / copy_blocks /
// swap_blocks in both cache layouts, and the validation rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>

#include "ops_test_support.h"
#include "pagedattn/ops/vllm.h"
#include "support/random_floats.h"

namespace pagedattn::ops::test {
namespace {

using vllm::CacheLayout;
using Ints = std::vector<std::int32_t>;

struct VllmSpec {
  std::vector<std::int32_t> seq_lens;  // keys per sequence
  std::vector<std::int32_t> q_lens;    // prefix: new tokens per sequence; empty = decode
  std::int32_t hq = 40, hkv = 40, head_size = 64, block_size = 16;
  CacheLayout layout = CacheLayout::kFlash;
  DType dtype = DType::kF32;  // query / key / value / output
  std::string kv_cache_dtype = "auto";
  float kv_scale = 1.0f;
  bool alibi = false;
  std::optional<std::int32_t> sliding_window;
  std::uint32_t seed = 1;
};

DType storage_dtype(const VllmSpec& s) {
  if (s.kv_cache_dtype == "auto") return s.dtype;
  return s.kv_cache_dtype == "fp8_e5m2" ? DType::kFP8E5M2 : DType::kFP8E4M3;
}

// Element offset of (block, offset, head, 0) in a dense cache of `layout`.
std::int64_t cache_offset(CacheLayout layout, std::int64_t block, std::int64_t offset,
                          std::int64_t head, std::int32_t bs, std::int32_t hkv, std::int32_t d) {
  if (layout == CacheLayout::kFlash) return ((block * bs + offset) * hkv + head) * d;
  return ((block * hkv + head) * bs + offset) * d;
}

TensorView cache_view(std::vector<unsigned char>& raw, DType dtype, CacheLayout layout,
                      std::int64_t blocks, std::int32_t bs, std::int32_t hkv, std::int32_t d) {
  return layout == CacheLayout::kFlash ? TensorView::dense(raw.data(), dtype, {blocks, bs, hkv, d})
                                       : TensorView::dense(raw.data(), dtype, {blocks, hkv, bs, d});
}

// Sequences with shuffled blocks, their K/V written with write_to_paged_cache.
class VllmCase {
 public:
  explicit VllmCase(const VllmSpec& spec) : spec_(spec), rng_(spec.seed) {
    const auto seqs = static_cast<std::int32_t>(spec.seq_lens.size());
    const std::int32_t bs = spec.block_size;
    for (std::int32_t len : spec.seq_lens)
      max_blocks_ = std::max(max_blocks_, (len + bs - 1) / bs + 1);
    std::int64_t used = 0;
    for (std::int32_t len : spec.seq_lens) used += (len + bs - 1) / bs;
    num_blocks_ = used + 3;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    block_tables_.assign(std::size_t(seqs) * max_blocks_, 0);  // vLLM pads with block 0
    std::size_t next = 0;
    for (std::int32_t b = 0; b < seqs; ++b)
      for (std::int32_t i = 0; i < (spec.seq_lens[b] + bs - 1) / bs; ++i)
        block_tables_[std::size_t(b) * max_blocks_ + i] = ids[next++];
    const std::size_t elems = std::size_t(num_blocks_) * bs * spec.hkv * spec.head_size;
    key_cache_ = poisoned_buffer(elems, storage_dtype(spec));
    value_cache_ = poisoned_buffer(elems, storage_dtype(spec));
    write_all_keys();
    for (std::int32_t h = 0; h < spec.hq; ++h) alibi_.push_back(std::ldexp(1.0f, -(h % 8) - 1));
  }

  vllm::KVCaches caches() {
    const DType dt = storage_dtype(spec_);
    return {cache_view(key_cache_, dt, spec_.layout, num_blocks_, spec_.block_size, spec_.hkv,
                       spec_.head_size),
            cache_view(value_cache_, dt, spec_.layout, num_blocks_, spec_.block_size, spec_.hkv,
                       spec_.head_size),
            spec_.layout,
            spec_.kv_cache_dtype,
            spec_.kv_scale,
            spec_.kv_scale};
  }

  // Runs forward_decode (no q_lens) or forward_prefix and checks the output.
  void run_and_check() {
    const auto seqs = static_cast<std::int64_t>(spec_.seq_lens.size());
    const bool decode = spec_.q_lens.empty();
    LogicalBatch logical{spec_.hq, spec_.hkv, spec_.head_size, {}, {}, k_logical_, v_logical_};
    std::vector<std::int32_t> qsl{0};
    for (std::int64_t b = 0; b < seqs; ++b) {
      logical.q_lens.push_back(decode ? 1 : spec_.q_lens[std::size_t(b)]);
      qsl.push_back(qsl.back() + logical.q_lens.back());
    }
    const std::int64_t tokens = qsl.back();
    const std::vector<float> q =
        randn(rng_, std::size_t(tokens) * spec_.hq * spec_.head_size, spec_.dtype);
    logical.q = q;
    std::vector<unsigned char> q_raw = encode(q, spec_.dtype);
    std::vector<unsigned char> out(q_raw.size(), 0xcd);
    const TensorView qv =
        TensorView::dense(q_raw.data(), spec_.dtype, {tokens, spec_.hq, spec_.head_size});
    const TensorView ov =
        TensorView::dense(out.data(), spec_.dtype, {tokens, spec_.hq, spec_.head_size});
    const IndexView tables = IndexView::dense(block_tables_.data(), {seqs, max_blocks_});
    const IndexView lens = IndexView::dense(spec_.seq_lens.data(), {seqs});
    std::optional<TensorView> slopes;
    if (spec_.alibi) slopes = TensorView::dense(alibi_.data(), DType::kF32, {spec_.hq});
    AttentionOptions options;
    options.alibi_slopes = spec_.alibi ? alibi_.data() : nullptr;
    if (decode) {
      const float scale = 1.0f / std::sqrt(float(spec_.head_size)) * 0.9f;
      const std::int32_t max_len = *std::max_element(spec_.seq_lens.begin(), spec_.seq_lens.end());
      vllm::forward_decode({ov, qv, caches(), tables, lens, max_len, spec_.hkv, scale, slopes});
      options.scale = scale;
    } else {
      const std::int32_t max_q = *std::max_element(spec_.q_lens.begin(), spec_.q_lens.end());
      vllm::forward_prefix({ov, qv, caches(), tables, IndexView::dense(qsl.data(), {seqs + 1}),
                            lens, max_q, std::nullopt, slopes, spec_.sliding_window});
      if (spec_.sliding_window) options.window_left = *spec_.sliding_window - 1;  // W keys
    }
    const float tol = spec_.dtype == DType::kF32   ? 2e-4f
                      : spec_.dtype == DType::kF16 ? 4e-3f
                                                   : 3e-2f;
    expect_close(decode_raw(out), reference_output(logical, options), tol, tol, describe());
  }

  std::string describe() const {
    std::ostringstream os;
    os << "seed " << spec_.seed << " heads (" << spec_.hq << "," << spec_.hkv << ") D "
       << spec_.head_size << " block " << spec_.block_size << " layout "
       << (spec_.layout == CacheLayout::kFlash ? "flash" : "cpu") << " " << spec_.kv_cache_dtype
       << " alibi " << spec_.alibi << (spec_.q_lens.empty() ? " decode" : " prefix");
    return os.str();
  }

  std::vector<unsigned char> key_cache_, value_cache_;

 private:
  static std::vector<unsigned char> encode(const std::vector<float>& v, DType dtype) {
    std::vector<unsigned char> raw(v.size() * dtype_size(dtype));
    for (std::size_t i = 0; i < v.size(); ++i) store_from_float(raw.data(), dtype, i, v[i]);
    return raw;
  }
  std::vector<float> decode_raw(const std::vector<unsigned char>& raw) const {
    return decode(raw.data(), spec_.dtype, raw.size() / dtype_size(spec_.dtype));
  }

  // Every key of every sequence through write_to_paged_cache (slot order
  // shuffled, one padding token at the end); logical K/V are the values
  // as stored and dequantised.
  void write_all_keys() {
    const std::int32_t bs = spec_.block_size, row = spec_.hkv * spec_.head_size;
    std::vector<std::int64_t> slots;
    std::vector<std::pair<std::int32_t, std::int32_t>> owner;  // (seq, pos)
    for (std::int32_t b = 0; b < static_cast<std::int32_t>(spec_.seq_lens.size()); ++b)
      for (std::int32_t pos = 0; pos < spec_.seq_lens[b]; ++pos) {
        slots.push_back(std::int64_t{block_tables_[std::size_t(b) * max_blocks_ + pos / bs]} * bs +
                        pos % bs);
        owner.push_back({b, pos});
      }
    const auto n = static_cast<std::int64_t>(slots.size());
    const std::vector<float> k = randn(rng_, std::size_t(n + 1) * row, spec_.dtype);
    const std::vector<float> v = randn(rng_, std::size_t(n + 1) * row, spec_.dtype);
    std::vector<unsigned char> k_raw = encode(k, spec_.dtype), v_raw = encode(v, spec_.dtype);
    vllm::write_to_paged_cache(
        {TensorView::dense(k_raw.data(), spec_.dtype, {n + 1, spec_.hkv, spec_.head_size}),
         TensorView::dense(v_raw.data(), spec_.dtype, {n + 1, spec_.hkv, spec_.head_size}),
         caches(), IndexView::dense(slots.data(), {n})});
    const DType dt = storage_dtype(spec_);
    const float scale = is_fp8(dt) ? spec_.kv_scale : 1.0f;
    for (std::int32_t len : spec_.seq_lens) {
      k_logical_.emplace_back(std::size_t(len) * row);
      v_logical_.emplace_back(std::size_t(len) * row);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const auto [b, pos] = owner[std::size_t(i)];
      for (std::int32_t e = 0; e < row; ++e) {
        const std::size_t src = std::size_t(i) * row + e, dst = std::size_t(pos) * row + e;
        std::uint32_t bits = 0;
        store_from_float(&bits, dt, 0, k[src] * (1.0f / scale));
        k_logical_[std::size_t(b)][dst] = load_as_float(&bits, dt, 0) * scale;
        store_from_float(&bits, dt, 0, v[src] * (1.0f / scale));
        v_logical_[std::size_t(b)][dst] = load_as_float(&bits, dt, 0) * scale;
      }
    }
  }

  VllmSpec spec_;
  std::mt19937 rng_;
  std::int32_t max_blocks_ = 0;
  std::int64_t num_blocks_ = 0;
  std::vector<std::int32_t> block_tables_;
  std::vector<std::vector<float>> k_logical_, v_logical_;
  std::vector<float> alibi_;
};

std::vector<std::int32_t> random_lens(std::mt19937& rng, int count, int lo, int hi) {
  std::vector<std::int32_t> lens;
  for (int i = 0; i < count; ++i) lens.push_back(std::uniform_int_distribution<int>(lo, hi)(rng));
  return lens;
}

// vLLM's test_paged_attention: 7 sequences, heads (40,40) / (64,8), head
// sizes 64..256, blocks 16 / 32, ALiBi on/off, kv_cache_dtype auto / fp8.
TEST(VllmForwardDecode, MatchesReferenceOnVllmMatrix) {
  const std::int32_t head_sizes[] = {64, 80, 96, 112, 120, 128, 192, 256};
  const char* kv_dtypes[] = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"};
  for (std::uint32_t i = 0; i < 16; ++i) {
    VllmSpec s;
    s.seed = 300 + i;
    std::mt19937 rng(s.seed);
    s.hq = 40;
    s.hkv = 40;
    if (i % 2) s.hq = 64, s.hkv = 8;
    s.head_size = head_sizes[i % 8];
    s.block_size = (i / 2) % 2 ? 32 : 16;
    s.layout = (i / 4) % 2 ? CacheLayout::kCpu : CacheLayout::kFlash;
    s.alibi = (i / 3) % 2;
    s.kv_cache_dtype = kv_dtypes[i % 4];
    s.kv_scale = s.kv_cache_dtype == "auto" ? 1.0f : 0.5f;
    s.dtype = i % 5 == 0 ? DType::kF16 : DType::kF32;
    s.seq_lens = random_lens(rng, 7, 1, 2'000'000 / (s.hq * s.head_size * 7));
    VllmCase(s).run_and_check();
  }
}

TEST(VllmForwardDecode, EmptySequenceGivesZeroRow) {
  VllmSpec s;
  s.hq = 8;
  s.hkv = 2;
  s.seq_lens = {0, 7, 0};
  VllmCase(s).run_and_check();  // the reference's row without visible keys is zeros
}

TEST(VllmForwardPrefix, MatchesReferenceWithCachedPrefixesWindowsAndAlibi) {
  for (std::uint32_t i = 0; i < 8; ++i) {
    VllmSpec s;
    s.seed = 400 + i;
    std::mt19937 rng(s.seed);
    s.hq = i % 2 ? 64 : 40;
    s.hkv = i % 2 ? 8 : 40;
    s.head_size = i % 3 == 0 ? 128 : 64;
    s.block_size = i % 2 ? 32 : 16;
    s.layout = (i / 2) % 2 ? CacheLayout::kCpu : CacheLayout::kFlash;
    s.alibi = i % 3 == 1;
    if (i % 4 == 3) s.sliding_window = 24;
    s.kv_cache_dtype = i == 5 ? "fp8" : "auto";
    s.kv_scale = i == 5 ? 0.5f : 1.0f;
    s.q_lens = random_lens(rng, 7, 1, 20);
    for (std::int32_t q : s.q_lens)
      s.seq_lens.push_back(q + std::uniform_int_distribution<int>(0, 90)(rng));
    VllmCase(s).run_and_check();
  }
}

// A sliding window of W shows W keys: with q = 0 the output is the mean of
// the last W values.
TEST(VllmForwardPrefix, SlidingWindowOfWShowsWKeys) {
  const std::int32_t d = 8, len = 30, window = 5;
  std::vector<float> kc(std::size_t(2) * 16 * d), vc(kc.size());
  for (std::size_t i = 0; i < vc.size(); ++i) vc[i] = float(i % 97) * 0.25f;
  std::vector<float> q(d, 0.0f), out(d);
  std::vector<std::int32_t> table = {1, 0}, qsl = {0, 1}, lens = {len};
  vllm::KVCaches kv{TensorView::dense(kc.data(), DType::kF32, {2, 16, 1, d}),
                    TensorView::dense(vc.data(), DType::kF32, {2, 16, 1, d})};
  vllm::forward_prefix({TensorView::dense(out.data(), DType::kF32, {1, 1, d}),
                        TensorView::dense(q.data(), DType::kF32, {1, 1, d}), kv,
                        IndexView::dense(table.data(), {1, 2}), IndexView::dense(qsl.data(), {2}),
                        IndexView::dense(lens.data(), {1}), 1, std::nullopt, std::nullopt, window});
  for (std::int32_t e = 0; e < d; ++e) {
    double mean = 0;
    for (std::int32_t pos = len - window; pos < len; ++pos)
      mean += vc[std::size_t(table[pos / 16] * 16 + pos % 16) * d + e] / window;
    EXPECT_NEAR(out[std::size_t(e)], mean, 1e-5) << e;
  }
}

// --- exact data movement -------------------------------------------------------

TEST(VllmCacheOps, ReshapeAndCacheWritesEachSlotExactlyInBothLayouts) {
  for (CacheLayout layout : {CacheLayout::kFlash, CacheLayout::kCpu}) {
    for (const char* kv_dtype : {"auto", "fp8_e4m3"}) {
      const std::int32_t blocks = 5, bs = 16, hkv = 3, d = 64, tokens = 9;
      const DType dt = std::string_view(kv_dtype) == "auto" ? DType::kF16 : DType::kFP8E4M3;
      std::mt19937 rng(7);
      std::vector<float> k = randn(rng, std::size_t(tokens) * hkv * d, DType::kF16);
      std::vector<float> v = randn(rng, k.size(), DType::kF16);
      std::vector<std::uint16_t> k16(k.size()), v16(v.size());
      for (std::size_t i = 0; i < k.size(); ++i)
        k16[i] = float_to_f16_bits(k[i]), v16[i] = float_to_f16_bits(v[i]);
      std::vector<std::int64_t> slots = {17, 3,  -1, 79,
                                         0,  40, 41, 64};  // 8 < 9 tokens: the last is padding
      const std::size_t elems = std::size_t(blocks) * bs * hkv * d;
      std::vector<unsigned char> kc(elems * dtype_size(dt), 0x11), vc(kc);
      std::vector<unsigned char> k_expected(kc), v_expected(vc);
      const float scale = 0.25f, mult = dt == DType::kF16 ? 1.0f : 1.0f / scale;
      for (std::size_t t = 0; t < slots.size(); ++t) {
        if (slots[t] < 0) continue;
        for (std::int32_t h = 0; h < hkv; ++h)
          for (std::int32_t e = 0; e < d; ++e) {
            const std::size_t at =
                std::size_t(cache_offset(layout, slots[t] / bs, slots[t] % bs, h, bs, hkv, d) + e);
            store_from_float(k_expected.data(), dt, at, k[(t * hkv + h) * d + e] * mult);
            store_from_float(v_expected.data(), dt, at, v[(t * hkv + h) * d + e] * mult);
          }
      }
      vllm::write_to_paged_cache(
          {TensorView::dense(k16.data(), DType::kF16, {tokens, hkv, d}),
           TensorView::dense(v16.data(), DType::kF16, {tokens, hkv, d}),
           {cache_view(kc, dt, layout, blocks, bs, hkv, d),
            cache_view(vc, dt, layout, blocks, bs, hkv, d), layout, kv_dtype, scale, scale},
           IndexView::dense(slots.data(), {8})});
      EXPECT_EQ(kc, k_expected) << kv_dtype;
      EXPECT_EQ(vc, v_expected) << kv_dtype;
    }
  }
}

std::vector<unsigned char> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

TEST(VllmCacheOps, CopyBlocksCopiesEveryLayerExactly) {
  const std::int32_t layers = 3, blocks = 8, bs = 16, hkv = 2, d = 32;
  const std::size_t block_bytes = std::size_t(bs) * hkv * d * 2;
  std::mt19937 rng(11);
  std::vector<std::vector<unsigned char>> k, v;
  std::vector<TensorView> kt, vt;
  for (int l = 0; l < layers; ++l) {
    k.push_back(random_bytes(rng, blocks * block_bytes));
    v.push_back(random_bytes(rng, blocks * block_bytes));
  }
  auto k_expected = k, v_expected = v;
  std::vector<std::int64_t> mapping = {0, 5, 2, 3, 0, 7};  // (0->5) (2->3) (0->7)
  for (int l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < mapping.size(); i += 2)
      for (auto* m : {&k_expected[l], &v_expected[l]})
        std::copy_n(m->begin() + mapping[i] * block_bytes, block_bytes,
                    m->begin() + mapping[i + 1] * block_bytes);
  for (int l = 0; l < layers; ++l) {
    kt.push_back(cache_view(k[l], DType::kBF16, CacheLayout::kCpu, blocks, bs, hkv, d));
    vt.push_back(cache_view(v[l], DType::kBF16, CacheLayout::kCpu, blocks, bs, hkv, d));
  }
  vllm::copy_blocks({kt, vt, CacheLayout::kCpu, IndexView::dense(mapping.data(), {3, 2})});
  EXPECT_EQ(k, k_expected);
  EXPECT_EQ(v, v_expected);
}

TEST(VllmCacheOps, SwapBlocksMovesBlocksBetweenCachesOfDifferentSizes) {
  const std::int32_t bs = 16, hkv = 2, d = 32;
  const std::size_t block_bytes = std::size_t(bs) * hkv * d * 4;
  std::mt19937 rng(12);
  std::vector<unsigned char> device = random_bytes(rng, 6 * block_bytes),
                             host = random_bytes(rng, 3 * block_bytes);
  std::vector<unsigned char> expected = host;
  std::vector<std::int64_t> mapping = {5, 0, 1, 2};
  std::copy_n(device.begin() + 5 * block_bytes, block_bytes, expected.begin());
  std::copy_n(device.begin() + 1 * block_bytes, block_bytes, expected.begin() + 2 * block_bytes);
  const auto device_before = device;
  vllm::swap_blocks({cache_view(device, DType::kF32, CacheLayout::kFlash, 6, bs, hkv, d),
                     cache_view(host, DType::kF32, CacheLayout::kFlash, 3, bs, hkv, d),
                     CacheLayout::kFlash, IndexView::dense(mapping.data(), {2, 2})});
  EXPECT_EQ(host, expected);
  EXPECT_EQ(device, device_before);
}

// int8 caches: the per-(block, head, slot) scales move with the blocks.
TEST(VllmCacheOps, Int8BlocksMoveWithTheirScalesInCopyAndSwap) {
  const std::int32_t layers = 2, blocks = 6, bs = 4, hkv = 3, d = 8;
  const std::size_t block_bytes = std::size_t(bs) * hkv * d;
  const std::size_t block_scales = std::size_t(hkv) * bs;
  std::mt19937 rng(21);
  auto random_scales = [&](std::int32_t n) {
    std::vector<float> s(std::size_t(n) * block_scales);
    for (float& x : s) x = pagedattn::test::UniformFloats(0.01f, 1.0f)(rng);
    return s;
  };
  for (CacheLayout layout : {CacheLayout::kFlash, CacheLayout::kCpu}) {
    std::vector<std::vector<unsigned char>> k, v;
    std::vector<std::vector<float>> ks, vs;
    for (int l = 0; l < layers; ++l) {
      k.push_back(random_bytes(rng, blocks * block_bytes));
      v.push_back(random_bytes(rng, blocks * block_bytes));
      ks.push_back(random_scales(blocks));
      vs.push_back(random_scales(blocks));
    }
    auto k_expected = k, v_expected = v;
    auto ks_expected = ks, vs_expected = vs;
    std::vector<std::int64_t> mapping = {1, 4, 3, 0};  // (1->4) (3->0)
    for (std::size_t i = 0; i < mapping.size(); i += 2)
      for (int l = 0; l < layers; ++l) {
        for (auto* m : {&k_expected[l], &v_expected[l]})
          std::copy_n(m->begin() + mapping[i] * block_bytes, block_bytes,
                      m->begin() + mapping[i + 1] * block_bytes);
        for (auto* m : {&ks_expected[l], &vs_expected[l]})
          std::copy_n(m->begin() + mapping[i] * block_scales, block_scales,
                      m->begin() + mapping[i + 1] * block_scales);
      }
    std::vector<TensorView> kt, vt, kst, vst;
    for (int l = 0; l < layers; ++l) {
      kt.push_back(cache_view(k[l], DType::kINT8, layout, blocks, bs, hkv, d));
      vt.push_back(cache_view(v[l], DType::kINT8, layout, blocks, bs, hkv, d));
      kst.push_back(TensorView::dense(ks[l].data(), DType::kF32, {blocks, hkv, bs}));
      vst.push_back(TensorView::dense(vs[l].data(), DType::kF32, {blocks, hkv, bs}));
    }
    vllm::copy_blocks({kt, vt, layout, IndexView::dense(mapping.data(), {2, 2}), kst, vst});
    EXPECT_EQ(k, k_expected);
    EXPECT_EQ(v, v_expected);
    EXPECT_EQ(ks, ks_expected);
    EXPECT_EQ(vs, vs_expected);

    // Swap layer 0's K blocks 5 and 2 to a 2-block host cache, and back.
    std::vector<unsigned char> host(2 * block_bytes, 0);
    std::vector<float> host_scales(2 * block_scales, 0.0f);
    std::vector<std::int64_t> out = {5, 1, 2, 0}, back = {1, 3, 0, 4};
    const TensorView host_t = cache_view(host, DType::kINT8, layout, 2, bs, hkv, d);
    const TensorView host_s = TensorView::dense(host_scales.data(), DType::kF32, {2, hkv, bs});
    vllm::swap_blocks(
        {kt[0], host_t, layout, IndexView::dense(out.data(), {2, 2}), kst[0], host_s});
    EXPECT_TRUE(
        std::equal(host.begin(), host.begin() + block_bytes, k[0].begin() + 2 * block_bytes));
    EXPECT_TRUE(std::equal(host.begin() + block_bytes, host.end(), k[0].begin() + 5 * block_bytes));
    EXPECT_TRUE(std::equal(host_scales.begin(), host_scales.begin() + block_scales,
                           ks[0].begin() + 2 * block_scales));
    EXPECT_TRUE(std::equal(host_scales.begin() + block_scales, host_scales.end(),
                           ks[0].begin() + 5 * block_scales));
    auto k0 = k[0];
    auto ks0 = ks[0];
    std::copy_n(k0.begin() + 5 * block_bytes, block_bytes, k0.begin() + 3 * block_bytes);
    std::copy_n(k0.begin() + 2 * block_bytes, block_bytes, k0.begin() + 4 * block_bytes);
    std::copy_n(ks0.begin() + 5 * block_scales, block_scales, ks0.begin() + 3 * block_scales);
    std::copy_n(ks0.begin() + 2 * block_scales, block_scales, ks0.begin() + 4 * block_scales);
    vllm::swap_blocks(
        {host_t, kt[0], layout, IndexView::dense(back.data(), {2, 2}), host_s, kst[0]});
    EXPECT_EQ(k[0], k0);
    EXPECT_EQ(ks[0], ks0);
  }
}

// --- validation: one test per rule, caches byte-identical after -----------------

// Every layer is checked before the first copy: a bad last layer leaves the
// earlier ones untouched (formerly layer 0 was copied, then an int8 layer
// without scales threw).
TEST(VllmValidation, CopyBlocksChecksEveryLayerBeforeCopying) {
  const std::int32_t blocks = 4, bs = 4, hkv = 2, d = 8;
  const std::size_t elements = std::size_t(blocks) * bs * hkv * d;
  std::mt19937 rng(31);
  std::vector<unsigned char> k0 = random_bytes(rng, elements * 4),
                             v0 = random_bytes(rng, elements * 4), k1 = random_bytes(rng, elements),
                             v1 = random_bytes(rng, elements);
  std::vector<float> scales(std::size_t(blocks) * hkv * bs, 0.5f), bad_scales(scales);
  std::vector<TensorView> kt = {
      cache_view(k0, DType::kF32, CacheLayout::kFlash, blocks, bs, hkv, d),
      cache_view(k1, DType::kINT8, CacheLayout::kFlash, blocks, bs, hkv, d)};
  std::vector<TensorView> vt = {
      cache_view(v0, DType::kF32, CacheLayout::kFlash, blocks, bs, hkv, d),
      cache_view(v1, DType::kINT8, CacheLayout::kFlash, blocks, bs, hkv, d)};
  std::vector<std::int64_t> mapping = {0, 1, 2, 3};
  const IndexView m = IndexView::dense(mapping.data(), {2, 2});
  const std::vector<const std::vector<unsigned char>*> all = {&k0, &v0, &k1, &v1};
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m});
      },
      {"vllm::copy_blocks: key_caches[1] is int8: its scales key_scales[1]", "must be given"}, all);
  std::vector<TensorView> kst = {TensorView{},
                                 TensorView::dense(scales.data(), DType::kF32, {blocks, hkv, bs})};
  std::vector<TensorView> vst = {
      TensorView{}, TensorView::dense(bad_scales.data(), DType::kF32, {blocks, hkv, 3})};
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, vst});
      },
      {"value_scales[1] has shape [4, 2, 3], expected [4, 2, 4]"}, all);
  vst[1] = TensorView::dense(bad_scales.data(), DType::kF16, {blocks, hkv, bs});
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, vst});
      },
      {"value_scales[1] has dtype float16, expected float32"}, all);
  vst = {kst[1], kst[1]};
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, vst});
      },
      {"value_scales[0] is given but value_caches[0] has dtype float32"}, all);
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, {}});
      },
      {"value_caches[1] is int8: its scales value_scales[1]"}, all);
  kst.pop_back();
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, vst});
      },
      {"key_scales has 1 entries for 2 layers"}, all);
  // A layer with fewer blocks: the mapping is checked against each layer.
  kt[1].shape[0] = vt[1].shape[0] = 3;
  kst = {TensorView{}, TensorView::dense(scales.data(), DType::kF32, {3, hkv, bs})};
  vst = kst;
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m, kst, vst});
      },
      {"block_mapping[1][1] = 3 is outside [0, 3) (the blocks of key_caches[1])"}, all);
}

// A valid decode / prefix / write setup (2 sequences of 20 and 5 keys, 6 blocks).
struct Fixture {
  VllmCase c{[] {
    VllmSpec s;
    s.hq = 4;
    s.hkv = 2;
    s.seq_lens = {20, 5};
    return s;
  }()};
  std::vector<float> q = std::vector<float>(2 * 4 * 64), out = q,
                     slopes = std::vector<float>(4, 0.5f);
  std::vector<float> k = std::vector<float>(3 * 2 * 64), v = k;
  Ints tables = {0, 1, 2, 3, 4, 5}, lens = {20, 5}, qsl = {0, 1, 2};
  std::vector<std::int64_t> slots = {0, 1, -1};

  vllm::ForwardDecodeParams decode() {
    return {TensorView::dense(out.data(), DType::kF32, {2, 4, 64}),
            TensorView::dense(q.data(), DType::kF32, {2, 4, 64}),
            c.caches(),
            IndexView::dense(tables.data(), {2, 3}),
            IndexView::dense(lens.data(), {2}),
            20,
            2,
            0.125f,
            std::nullopt};
  }
  vllm::ForwardPrefixParams prefix() {
    return {TensorView::dense(out.data(), DType::kF32, {2, 4, 64}),
            TensorView::dense(q.data(), DType::kF32, {2, 4, 64}),
            c.caches(),
            IndexView::dense(tables.data(), {2, 3}),
            IndexView::dense(qsl.data(), {3}),
            IndexView::dense(lens.data(), {2}),
            1,
            std::nullopt,
            std::nullopt,
            std::nullopt};
  }
  vllm::WriteToPagedCacheParams write() {
    return {TensorView::dense(k.data(), DType::kF32, {3, 2, 64}),
            TensorView::dense(v.data(), DType::kF32, {3, 2, 64}), c.caches(),
            IndexView::dense(slots.data(), {3})};
  }
  template <typename Params, typename Op, typename Mutate>
  void reject(Params params, Op op, Mutate mutate, std::initializer_list<std::string_view> parts) {
    mutate(params);
    expect_invalid([&] { op(params); }, parts, {&c.key_cache_, &c.value_cache_});
  }
};

TEST(VllmValidation, ValidSetupsAreAccepted) {
  Fixture f;
  EXPECT_NO_THROW(vllm::forward_decode(f.decode()));
  EXPECT_NO_THROW(vllm::forward_prefix(f.prefix()));
  EXPECT_NO_THROW(vllm::write_to_paged_cache(f.write()));
}

TEST(VllmValidation, DecodeRulesNameInputIndexAndValue) {
  Fixture f;
  using P = vllm::ForwardDecodeParams;
  const auto op = [](const P& p) { vllm::forward_decode(p); };
  f.reject(f.decode(), op, [](P& p) { p.kv.kv_cache_dtype = "int4"; },
           {"vllm::forward_decode", "kv_cache_dtype = \"int4\""});
  f.reject(f.decode(), op, [](P& p) { p.kv.kv_cache_dtype = "fp8"; },
           {"key_cache has dtype float32, expected float8_e4m3fn"});
  f.reject(f.decode(), op, [](P& p) { p.num_kv_heads = 4; },
           {"num_kv_heads = 4 differs from the caches' 2"});
  f.reject(f.decode(), op, [](P& p) { p.query.shape[1] = 3; },
           {"query heads = 3 must be a positive multiple of num_kv_heads = 2"});
  f.reject(f.decode(), op, [](P& p) { p.query.dtype = DType::kINT8; }, {"query has dtype int8"});
  f.reject(f.decode(), op, [](P& p) { p.output.shape[2] = 32; },
           {"output has shape [2, 4, 32], expected [2, 4, 64]"});
  f.reject(f.decode(), op, [](P& p) { p.query.strides[2] = 2; },
           {"query must have a contiguous last axis: stride[2] = 2"});
  f.reject(f.decode(), op, [](P& p) { p.output.strides[1] = 32; },
           {"output stride[1] = 32 overlaps the 64 elements of axis 2"});
  f.reject(f.decode(), op, [](P& p) { p.kv.key_cache.rank = 3; },
           {"key_cache has rank 3, expected 4"});
  f.reject(f.decode(), op, [](P& p) { p.kv.value_cache.shape[0] = 5; },
           {"value_cache has shape [5, 16, 2, 64], expected [6, 16, 2, 64]"});
  f.reject(f.decode(), op, [](P& p) { p.kv.value_cache.data = nullptr; }, {"value_cache is null"});
  f.reject(f.decode(), op, [](P& p) { p.block_tables.type = IndexType::kInt64; },
           {"block_tables has dtype int64, expected int32"});
  f.reject(f.decode(), op, [](P& p) { p.seq_lens.shape[0] = 3; },
           {"seq_lens has shape [3], expected [2]"});
  f.reject(f.decode(), op, [&](P&) { f.lens[1] = -4; }, {"seq_lens[1] = -4 is outside [0, 48]"});
  f.reject(f.decode(), op, [&](P&) { f.lens[0] = 49; },
           {"seq_lens[0] = 49 is outside [0, 48] (block_tables columns x block_size)"});
  f.reject(f.decode(), op,
           [&](P& p) {
             f.lens = {20, 5};
             p.max_seq_len = 19;
           },
           {"seq_lens[0] = 20 is outside [0, 19] (max_seq_len)"});
  f.reject(f.decode(), op, [&](P&) { f.tables[1] = 6; },
           {"block_tables[0][1] = 6 is outside [0, 6)"});
  f.reject(f.decode(), op,
           [&](P&) {
             f.tables[1] = 1;
             f.tables[3] = -1;
           },
           {"block_tables[1][0] = -1"});
  f.reject(f.decode(), op,
           [&](P& p) {
             f.tables[3] = 3;
             p.scale = INFINITY;
           },
           {"scale = inf must be finite"});
  f.reject(f.decode(), op,
           [&](P& p) { p.alibi_slopes = TensorView::dense(f.slopes.data(), DType::kF32, {3}); },
           {"alibi_slopes has shape [3], expected [4]"});
  f.reject(f.decode(), op,
           [&](P& p) { p.alibi_slopes = TensorView::dense(f.slopes.data(), DType::kF16, {4}); },
           {"alibi_slopes has dtype float16, expected float32"});
  f.reject(f.decode(), op, [](P& p) { p.block_tables.shape[1] = 1 << 28; },
           {"max_blocks * block_size = 268435456 x 16 overflows int32"});
}

TEST(VllmValidation, PrefixRulesNameInputIndexAndValue) {
  Fixture f;
  using P = vllm::ForwardPrefixParams;
  const auto op = [](const P& p) { vllm::forward_prefix(p); };
  f.reject(f.prefix(), op, [&](P&) { f.qsl[0] = 1; },
           {"vllm::forward_prefix", "query_start_loc[0] = 1 must be 0"});
  f.reject(f.prefix(), op,
           [&](P&) {
             f.qsl = {0, 3, 2};
           },
           {"query_start_loc[2] = 2 is less than query_start_loc[1] = 3"});
  f.reject(f.prefix(), op,
           [&](P&) {
             f.qsl = {0, 1, 1};
           },
           {"query_start_loc[2] = 1 must equal the token count 2"});
  f.reject(f.prefix(), op,
           [&](P& p) {
             f.qsl = {0, 1, 2};
             p.query_start_loc.shape[0] = 2;
           },
           {"query_start_loc has shape [2], expected [3]"});
  f.reject(f.prefix(), op,
           [&](P& p) {
             f.qsl = {0, 0, 2};
             p.max_query_len = 2;
             f.lens[1] = 1;
           },
           {"seq_lens[1] = 1 is less than its query length 2"});
  f.reject(f.prefix(), op,
           [&](P&) {
             f.lens = {20, 5};
             f.qsl = {0, 0, 2};
           },
           {"query length of sequence[1] = 2 is outside [0, 1] (max_query_len)"});
  f.reject(f.prefix(), op,
           [&](P& p) {
             f.qsl = {0, 1, 2};
             p.sliding_window = 0;
           },
           {"sliding_window = 0 must be >= 1"});
  f.reject(f.prefix(), op, [](P& p) { p.scale = NAN; }, {"scale = nan must be finite"});
}

TEST(VllmValidation, WriteRulesNameInputIndexAndValue) {
  Fixture f;
  using P = vllm::WriteToPagedCacheParams;
  const auto op = [](const P& p) { vllm::write_to_paged_cache(p); };
  f.reject(f.write(), op, [&](P&) { f.slots[2] = 96; },
           {"vllm::write_to_paged_cache", "slot_mapping[2] = 96 is outside [0, 96) and not -1"});
  f.reject(f.write(), op, [&](P&) { f.slots[2] = -2; }, {"slot_mapping[2] = -2"});
  f.reject(f.write(), op, [&](P&) { f.slots = {4, 4, -1}; }, {"slot 4 appears more than once"});
  f.reject(f.write(), op,
           [&](P& p) {
             f.slots = {0, 1, -1};
             p.slot_mapping.type = IndexType::kInt32;
           },
           {"slot_mapping has dtype int32, expected int64"});
  f.reject(f.write(), op, [&](P& p) { p.slot_mapping.shape[0] = 4; },
           {"slot_mapping has 4 entries but key has 3 tokens"});
  f.reject(f.write(), op, [](P& p) { p.value.shape[0] = 2; },
           {"value has shape [2, 2, 64], expected [3, 2, 64]"});
  f.reject(f.write(), op, [](P& p) { p.value.dtype = DType::kF16; },
           {"value has dtype float16, expected float32"});
  f.reject(f.write(), op, [](P& p) { p.kv.layout = vllm::CacheLayout::kCpu; },
           {"key has shape [3, 2, 64], expected [3, 16, 64]"});
}

TEST(VllmValidation, Fp8ScalesMustBePositive) {
  VllmSpec s;
  s.hq = s.hkv = 2;
  s.seq_lens = {3};
  s.kv_cache_dtype = "fp8_e5m2";
  s.kv_scale = 0.5f;
  VllmCase c(s);
  std::vector<float> k(2 * 64), v(k);
  std::vector<std::int64_t> slots = {7};
  vllm::KVCaches kv = c.caches();
  kv.v_scale = 0.0f;
  expect_invalid(
      [&] {
        vllm::write_to_paged_cache({TensorView::dense(k.data(), DType::kF32, {1, 2, 64}),
                                    TensorView::dense(v.data(), DType::kF32, {1, 2, 64}), kv,
                                    IndexView::dense(slots.data(), {1})});
      },
      {"v_scale = 0 must be finite and > 0"}, {&c.key_cache_, &c.value_cache_});
}

TEST(VllmValidation, BlockCopyRulesNameInputIndexAndValue) {
  const std::int32_t blocks = 4, bs = 16, hkv = 2, d = 32;
  std::vector<unsigned char> k(std::size_t(blocks) * bs * hkv * d * 4, 1), v(k.size(), 2),
      host(k.size() / 2, 3);
  std::vector<TensorView> kt = {
      cache_view(k, DType::kF32, CacheLayout::kFlash, blocks, bs, hkv, d)};
  std::vector<TensorView> vt = {
      cache_view(v, DType::kF32, CacheLayout::kFlash, blocks, bs, hkv, d)};
  std::vector<std::int64_t> mapping = {0, 1, 2, 4};
  const IndexView m = IndexView::dense(mapping.data(), {2, 2});
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m});
      },
      {"vllm::copy_blocks", "block_mapping[1][1] = 4 is outside [0, 4)"}, {&k, &v});
  mapping = {0, 1, 2, 1};
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, m});
      },
      {"vllm::copy_blocks: block_mapping: destination block 1 appears more than once"}, {&k, &v});
  mapping = {0, 1, 2, 3};
  std::vector<std::int32_t> mapping32 = {0, 1};
  expect_invalid(
      [&] {
        vllm::copy_blocks(
            {kt, vt, CacheLayout::kFlash, IndexView::dense(mapping32.data(), {1, 2})});
      },
      {"block_mapping has dtype int32, expected int64"}, {&k, &v});
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, {}, CacheLayout::kFlash, m});
      },
      {"1 key caches but 0 value caches"}, {&k, &v});
  kt[0].strides[0] *= 2;
  kt[0].shape[0] = 2;
  expect_invalid(
      [&] {
        vllm::copy_blocks({kt, vt, CacheLayout::kFlash, IndexView::dense(mapping.data(), {1, 2})});
      },
      {"key_caches[0] blocks must be contiguous"}, {&k, &v});
  const TensorView src = cache_view(k, DType::kF32, CacheLayout::kFlash, blocks, bs, hkv, d);
  TensorView dst = cache_view(host, DType::kF32, CacheLayout::kFlash, blocks / 2, bs, hkv, d);
  expect_invalid(
      [&] {
        vllm::swap_blocks({src, dst, CacheLayout::kFlash, m});
      },
      {"vllm::swap_blocks", "block_mapping[1][1] = 3 is outside [0, 2)"}, {&k, &host});
  mapping = {3, 2};
  expect_invalid(
      [&] {
        vllm::swap_blocks(
            {src, dst, CacheLayout::kFlash, IndexView::dense(mapping.data(), {1, 2})});
      },
      {"block_mapping[0][1] = 2 is outside [0, 2)"}, {&k, &host});
  dst.dtype = DType::kBF16;
  mapping = {3, 1};
  expect_invalid(
      [&] {
        vllm::swap_blocks(
            {src, dst, CacheLayout::kFlash, IndexView::dense(mapping.data(), {1, 2})});
      },
      {"dst has dtype bfloat16, expected float32"}, {&k, &host});
}

}  // namespace
}  // namespace pagedattn::ops::test
