// The peer operators on device memory (pagedattn/cuda_ops.h) against the CPU
// operators on the same inputs: ORT PagedAttention (decode and prefill, with
// rotary, window, softcap, head_sink, packed QKV) and vLLM's forward_decode,
// forward_prefix, reshape_and_cache, copy_blocks and swap_blocks. Caches must
// match bit for bit (NaN-poisoned unused slots included), outputs within the
// kernels' tolerance. Bad parameters are refused by name before any CUDA
// call, which the host-only tests check with pointers no one may touch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_support.h"
#include "pagedattn/cuda_ops.h"
#include "pagedattn/errors.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/vllm.h"
#include "support/expect_error.h"
#include "support/random_floats.h"

namespace pagedattn::testing {
namespace {

using ::pagedattn::ops::IndexView;
using ::pagedattn::ops::TensorView;
using Bytes = std::vector<unsigned char>;
namespace cpu_ort = ::pagedattn::ops::ort;
namespace cpu_vllm = ::pagedattn::ops::vllm;
namespace gpu_ort = ::pagedattn::cuda::ops::ort;
namespace gpu_vllm = ::pagedattn::cuda::ops::vllm;
using cpu_vllm::CacheLayout;

// --- buffers --------------------------------------------------------------------------

// `count` elements of `dtype`, every one NaN (unused cache slots).
Bytes poisoned(std::size_t count, DType dtype) {
  Bytes raw(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i) store_from_float(raw.data(), dtype, i, NAN);
  return raw;
}

// `count` normal values rounded to `dtype`.
Bytes random_values(std::mt19937& rng, std::size_t count, DType dtype) {
  pagedattn::test::NormalFloats normal;
  Bytes raw(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i) store_from_float(raw.data(), dtype, i, normal(rng));
  return raw;
}

std::vector<float> decode(const Bytes& raw, DType dtype) {
  std::vector<float> values(raw.size() / dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = load_as_float(raw.data(), dtype, i);
  return values;
}

// Device copies of host buffers, and host views translated onto them: the
// same inputs for the CPU operator (host views) and the CUDA one.
class Mirror {
 public:
  template <class T>
  void add(const std::vector<T>& host) {
    entries_.push_back({host.data(), host.size() * sizeof(T), DeviceBytes(host)});
  }
  void* device(const void* host) const {
    if (host == nullptr) return nullptr;
    const auto at = reinterpret_cast<std::uintptr_t>(host);
    for (const Entry& e : entries_) {
      const auto begin = reinterpret_cast<std::uintptr_t>(e.host);
      if (e.bytes == 0 && at == begin) return nullptr;  // an empty buffer: no elements
      if (at >= begin && at < begin + e.bytes) return e.device.as<unsigned char>() + (at - begin);
    }
    throw std::logic_error("Mirror: the pointer is in no mirrored buffer");
  }
  TensorView operator()(TensorView t) const {
    t.data = device(t.data);
    return t;
  }
  IndexView operator()(IndexView v) const {
    v.data = device(v.data);
    return v;
  }
  template <class View>
  std::optional<View> operator()(const std::optional<View>& v) const {
    return v ? std::optional<View>((*this)(*v)) : std::nullopt;
  }
  // The device copy of `host` (the buffer the CUDA operator wrote).
  template <class T>
  std::vector<T> download(const std::vector<T>& host) const {
    for (const Entry& e : entries_)
      if (e.host == host.data()) return e.bytes == 0 ? std::vector<T>() : e.device.download<T>();
    throw std::logic_error("Mirror: the buffer is not mirrored");
  }

 private:
  struct Entry {
    const void* host;
    std::size_t bytes;
    DeviceBytes device;
  };
  std::vector<Entry> entries_;
};

// --- comparisons ------------------------------------------------------------------------

void expect_same_bytes(const Bytes& actual, const Bytes& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  const auto [a, e] = std::mismatch(actual.begin(), actual.end(), expected.begin());
  EXPECT_TRUE(a == actual.end()) << what << ": first differing byte " << (a - actual.begin())
                                 << " of " << actual.size() << ": " << int(*a) << " vs " << int(*e);
}

// Outputs [tokens][heads][dim]: every head row within tolerance(token) x its
// largest expected magnitude (NaN fails).
template <class Tolerance>
void expect_rows_close(const std::vector<float>& actual, const std::vector<float>& expected,
                       std::int32_t heads, std::int32_t dim, const Tolerance& tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  const std::size_t rows = expected.size() / std::size_t(dim);
  int misses = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto token = static_cast<std::int32_t>(r / std::size_t(heads));
    float row_max = 1e-6f;
    for (std::int32_t d = 0; d < dim; ++d)
      row_max = std::max(row_max, std::fabs(expected[r * dim + d]));
    const float bound = tolerance(token) * row_max;
    for (std::int32_t d = 0; d < dim; ++d) {
      const float a = actual[r * dim + d], e = expected[r * dim + d];
      if (std::fabs(a - e) <= bound) continue;  // false for NaN
      if (++misses <= 5)
        ADD_FAILURE() << "token " << token << " head " << r % heads << " [" << d << "]: " << a
                      << " vs " << e << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(misses, 0);
}

// The kernels' tolerance, relative to a row's largest output: decode rows
// (at most 16 rows per KV head) multiply in f32 and differ from the CPU by
// summation order, then by one rounding of the output; prefill rows multiply
// on tensor cores in bf16 (bf16 K/V) or f16.
float row_tolerance(bool decode_row, DType output, DType kv) {
  if (decode_row) {
    if (output == DType::kF32) return 1e-4f;
    return output == DType::kBF16 ? 1.6e-2f : 2e-3f;
  }
  return kv == DType::kBF16 ? 4e-2f : 1.5e-2f;
}

// Whether a sequence of q_len tokens runs on the decode kernel.
bool decode_rows(std::int32_t q_len, std::int32_t group) {
  return q_len * group <= 16;
}

// Per token: the sequence it belongs to, from CSR offsets.
std::vector<std::int32_t> sequence_of_tokens(const std::vector<std::int32_t>& offsets) {
  std::vector<std::int32_t> seq;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    for (std::int32_t t = offsets[b]; t < offsets[b + 1]; ++t)
      seq.push_back(static_cast<std::int32_t>(b));
  return seq;
}

// --- block tables -----------------------------------------------------------------------

// Sequences of `lens` keys on shuffled blocks of `block_size` (two spare);
// table rows padded with `padding` beyond the blocks each uses.
struct BlockTable {
  std::vector<std::int32_t> ids;  // [seqs][max_blocks]
  std::int32_t max_blocks = 0;
  std::int64_t num_blocks = 0;
  std::int32_t block_size = 0;

  BlockTable(const std::vector<std::int32_t>& lens, std::int32_t bs, std::int32_t padding,
             std::mt19937& rng)
      : block_size(bs) {
    std::int32_t used = 0;
    for (std::int32_t len : lens) {
      max_blocks = std::max(max_blocks, (len + bs - 1) / bs + 1);
      used += (len + bs - 1) / bs;
    }
    num_blocks = used + 2;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    ids.assign(lens.size() * std::size_t(max_blocks), padding);
    std::size_t next = 0;
    for (std::size_t b = 0; b < lens.size(); ++b)
      for (std::int32_t i = 0; i < (lens[b] + bs - 1) / bs; ++i)
        ids[b * std::size_t(max_blocks) + std::size_t(i)] = order[next++];
  }
  std::int64_t slot(std::size_t b, std::int32_t pos) const {
    return std::int64_t{ids[b * std::size_t(max_blocks) + std::size_t(pos / block_size)]} *
               block_size +
           pos % block_size;
  }
};

// --- ONNX Runtime -------------------------------------------------------------------------

struct OrtSpec {
  std::vector<std::pair<std::int32_t, std::int32_t>> seqs;  // (new tokens, total tokens)
  std::int32_t hq = 8, hkv = 2, head = 64, block = 16;
  DType dtype = DType::kF16;
  bool rotary = false, interleaved = false, half_rotary = false;
  bool packed = false, four_d_cache = false, head_sink = false, slot_mapping = false;
  std::int32_t window = -1;
  float softcap = 0.0f, scale = 0.0f;
};

// An ORT call's host buffers: past keys in the caches, NaN in every other slot.
struct OrtCall {
  OrtSpec spec;
  std::vector<std::int32_t> cu{0}, past;
  std::optional<BlockTable> table;
  std::vector<std::int64_t> slots;
  Bytes query, key, value, key_cache, value_cache, cos, sin, sink, out;
  std::int32_t tokens = 0, rotary_dim = 0;

  explicit OrtCall(const OrtSpec& s) : spec(s) {
    std::mt19937 rng(7);
    std::vector<std::int32_t> totals;
    for (const auto& [n, total] : s.seqs) {
      cu.push_back(cu.back() + n);
      past.push_back(total - n);
      totals.push_back(total);
    }
    tokens = cu.back();
    table.emplace(totals, s.block, 1 << 30, rng);  // padding entries out of range
    const std::size_t row = std::size_t(s.hkv) * s.head;
    key_cache = poisoned(std::size_t(table->num_blocks) * s.block * row, s.dtype);
    value_cache = poisoned(key_cache.size() / dtype_size(s.dtype), s.dtype);
    for (std::size_t b = 0; b < s.seqs.size(); ++b)
      for (std::int32_t pos = 0; pos < past[b]; ++pos) {
        const Bytes k = random_values(rng, row, s.dtype), v = random_values(rng, row, s.dtype);
        const std::size_t at = std::size_t(table->slot(b, pos)) * k.size();
        std::memcpy(key_cache.data() + at, k.data(), k.size());
        std::memcpy(value_cache.data() + at, v.data(), v.size());
      }
    const std::size_t q_width = std::size_t(s.hq + (s.packed ? 2 * s.hkv : 0)) * s.head;
    query = random_values(rng, std::size_t(tokens) * q_width, s.dtype);
    if (!s.packed) {
      key = random_values(rng, std::size_t(tokens) * row, s.dtype);
      value = random_values(rng, std::size_t(tokens) * row, s.dtype);
    }
    out = Bytes(std::size_t(tokens) * s.hq * s.head * dtype_size(s.dtype), 0xcd);
    rotary_dim = s.half_rotary ? s.head / 2 : s.head;
    const std::int32_t rows = *std::max_element(totals.begin(), totals.end()) + 3;
    for (std::int32_t pos = 0; pos < rows; ++pos)
      for (std::int32_t i = 0; i < rotary_dim / 2; ++i) {
        const double angle = pos / std::pow(10000.0, 2.0 * i / rotary_dim);
        append_value(cos, std::cos(angle));
        append_value(sin, std::sin(angle));
      }
    if (s.head_sink) sink = random_values(rng, std::size_t(s.hq), s.dtype);
    for (std::size_t b = 0; s.slot_mapping && b < s.seqs.size(); ++b)
      for (std::int32_t j = 0; j < s.seqs[b].first; ++j)
        slots.push_back(table->slot(b, past[b] + j));
  }

  void append_value(Bytes& raw, double value) const {
    raw.resize(raw.size() + dtype_size(spec.dtype));
    store_from_float(raw.data(), spec.dtype, raw.size() / dtype_size(spec.dtype) - 1,
                     static_cast<float>(value));
  }

  cpu_ort::PagedAttentionParams params() {
    const OrtSpec& s = spec;
    const DType dt = s.dtype;
    const std::int64_t batch = static_cast<std::int64_t>(s.seqs.size());
    const std::int64_t kv_width = std::int64_t{s.hkv} * s.head;
    cpu_ort::PagedAttentionParams p;
    p.query = TensorView::dense(query.data(), dt,
                                {tokens, std::int64_t{s.hq + (s.packed ? 2 * s.hkv : 0)} * s.head});
    if (!s.packed) {
      p.key = TensorView::dense(key.data(), dt, {tokens, kv_width});
      p.value = TensorView::dense(value.data(), dt, {tokens, kv_width});
    }
    const std::int64_t blocks = table->num_blocks;
    p.key_cache = s.four_d_cache
                      ? TensorView::dense(key_cache.data(), dt, {blocks, s.block, s.hkv, s.head})
                      : TensorView::dense(key_cache.data(), dt, {blocks, s.block, kv_width});
    p.value_cache = p.key_cache;
    p.value_cache.data = value_cache.data();
    p.cumulative_sequence_length = IndexView::dense(cu.data(), {batch + 1});
    p.past_seqlens = IndexView::dense(past.data(), {batch});
    p.block_table = IndexView::dense(table->ids.data(), {batch, table->max_blocks});
    if (s.rotary) {
      const std::int64_t half = rotary_dim / 2;
      const std::int64_t rows = std::int64_t(cos.size() / dtype_size(dt)) / half;
      p.cos_cache = TensorView::dense(cos.data(), dt, {rows, half});
      p.sin_cache = TensorView::dense(sin.data(), dt, {rows, half});
    }
    if (s.slot_mapping) p.slot_mapping = IndexView::dense(slots.data(), {tokens});
    if (s.head_sink) p.head_sink = TensorView::dense(sink.data(), dt, {s.hq});
    p.output = TensorView::dense(out.data(), dt, {tokens, std::int64_t{s.hq} * s.head});
    p.num_heads = s.hq;
    p.kv_num_heads = s.hkv;
    p.scale = s.scale;
    p.softcap = s.softcap;
    p.local_window_size = s.window;
    p.do_rotary = s.rotary;
    p.rotary_interleaved = s.interleaved;
    return p;
  }
};

cpu_ort::PagedAttentionParams on_device(const Mirror& m, cpu_ort::PagedAttentionParams p) {
  p.query = m(p.query);
  p.key = m(p.key);
  p.value = m(p.value);
  p.key_cache = m(p.key_cache);
  p.value_cache = m(p.value_cache);
  p.cumulative_sequence_length = m(p.cumulative_sequence_length);
  p.past_seqlens = m(p.past_seqlens);
  p.block_table = m(p.block_table);
  p.cos_cache = m(p.cos_cache);
  p.sin_cache = m(p.sin_cache);
  p.slot_mapping = m(p.slot_mapping);
  p.head_sink = m(p.head_sink);
  p.output = m(p.output);
  return p;
}

// Runs the CPU and the CUDA operator on the same inputs and compares.
void check_ort(const OrtSpec& spec) {
  OrtCall call(spec);
  Mirror m;  // uploaded before the CPU operator writes the host caches
  for (const Bytes* b : {&call.query, &call.key, &call.value, &call.key_cache, &call.value_cache,
                         &call.cos, &call.sin, &call.sink, &call.out})
    m.add(*b);
  m.add(call.cu);
  m.add(call.past);
  m.add(call.table->ids);
  m.add(call.slots);
  const cpu_ort::PagedAttentionParams host = call.params();
  cpu_ort::paged_attention(host);
  gpu_ort::paged_attention(on_device(m, host));
  synchronize();

  expect_same_bytes(m.download(call.key_cache), call.key_cache, "key_cache");
  expect_same_bytes(m.download(call.value_cache), call.value_cache, "value_cache");
  const std::vector<std::int32_t> seq = sequence_of_tokens(call.cu);
  const std::int32_t group = spec.hq / spec.hkv;
  expect_rows_close(decode(m.download(call.out), spec.dtype), decode(call.out, spec.dtype), spec.hq,
                    spec.head, [&](std::int32_t token) {
                      const auto b = std::size_t(seq[std::size_t(token)]);
                      return row_tolerance(decode_rows(spec.seqs[b].first, group), spec.dtype,
                                           spec.dtype);
                    });
}

TEST(CudaOrtOp, DecodeWithRotaryWindowSoftcapAndSinkMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  OrtSpec s;
  s.seqs = {{1, 37}, {1, 1}, {1, 300}};
  s.rotary = true;
  s.window = 50;
  s.softcap = 30.0f;
  s.head_sink = true;
  check_ort(s);
}

TEST(CudaOrtOp, Bf16DecodeWithInterleavedHalfRotaryMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  OrtSpec s;
  s.seqs = {{1, 17}, {2, 64}, {0, 9}};
  s.hq = 4;
  s.hkv = 4;
  s.head = 80;
  s.block = 8;
  s.dtype = DType::kBF16;
  s.rotary = true;
  s.interleaved = true;
  s.half_rotary = true;
  s.scale = 0.07f;
  check_ort(s);
}

TEST(CudaOrtOp, PrefillWithRotaryWindowSoftcapAndSinkMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  OrtSpec s;
  s.seqs = {{40, 100}, {0, 5}, {70, 70}};
  s.head = 128;
  s.block = 32;
  s.rotary = true;
  s.window = 64;
  s.softcap = 20.0f;
  s.head_sink = true;
  check_ort(s);
}

TEST(CudaOrtOp, Bf16PackedPrefillWithSlotMappingMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  OrtSpec s;
  s.seqs = {{33, 50}, {5, 5}};
  s.hq = 4;
  s.hkv = 1;
  s.dtype = DType::kBF16;
  s.packed = true;
  s.four_d_cache = true;
  s.slot_mapping = true;
  s.head_sink = true;  // bf16 sinks: converted on the device
  check_ort(s);
}

TEST(CudaOrtOp, ZeroNewTokensWritesNothing) {
  PAGEDATTN_REQUIRE_GPU();
  OrtSpec s;
  s.seqs = {{0, 3}, {0, 20}};
  check_ort(s);
}

// --- vLLM -------------------------------------------------------------------------------

struct VllmSpec {
  std::vector<std::int32_t> seq_lens;
  std::vector<std::int32_t> q_lens;  // prefix: new tokens per sequence; empty: decode
  std::int32_t hq = 8, hkv = 2, head = 96, block = 16;
  CacheLayout layout = CacheLayout::kFlash;
  DType dtype = DType::kF32;           // query / output
  std::string kv_cache_dtype = "fp8";  // "auto": the query's dtype
  float k_scale = 0.5f, v_scale = 0.25f;
  bool alibi = false;
  std::optional<std::int32_t> sliding_window;
};

DType storage_dtype(const VllmSpec& s) {
  if (s.kv_cache_dtype == "auto") return s.dtype;
  return s.kv_cache_dtype == "fp8_e5m2" ? DType::kFP8E5M2 : DType::kFP8E4M3;
}

// Element offset of (block, slot, head, 0) in a dense cache of `layout`.
std::size_t cache_offset(CacheLayout layout, std::int64_t block, std::int64_t slot,
                         std::int64_t head, std::int32_t bs, std::int32_t hkv, std::int32_t d) {
  const std::int64_t at = layout == CacheLayout::kFlash ? ((block * bs + slot) * hkv + head) * d
                                                        : ((block * hkv + head) * bs + slot) * d;
  return static_cast<std::size_t>(at);
}

TensorView cache_view(Bytes& raw, DType dtype, CacheLayout layout, std::int64_t blocks,
                      std::int32_t bs, std::int32_t hkv, std::int32_t d) {
  return layout == CacheLayout::kFlash ? TensorView::dense(raw.data(), dtype, {blocks, bs, hkv, d})
                                       : TensorView::dense(raw.data(), dtype, {blocks, hkv, bs, d});
}

// A forward's host buffers: every key in the caches, NaN in every other slot.
struct VllmForward {
  VllmSpec spec;
  std::optional<BlockTable> table;
  std::vector<std::int32_t> query_start_loc{0};
  Bytes key_cache, value_cache, query, out;
  std::vector<float> alibi;
  std::int32_t tokens = 0;

  explicit VllmForward(const VllmSpec& s) : spec(s) {
    std::mt19937 rng(11);
    table.emplace(s.seq_lens, s.block, 0, rng);  // vLLM pads with block 0
    const DType kv = storage_dtype(s);
    const std::size_t elems = std::size_t(table->num_blocks) * s.block * s.hkv * s.head;
    key_cache = poisoned(elems, kv);
    value_cache = poisoned(elems, kv);
    const auto es = dtype_size(kv);
    for (std::size_t b = 0; b < s.seq_lens.size(); ++b)
      for (std::int32_t pos = 0; pos < s.seq_lens[b]; ++pos)
        for (std::int32_t h = 0; h < s.hkv; ++h) {
          const std::int64_t slot = table->slot(b, pos);
          const std::size_t at =
              cache_offset(s.layout, slot / s.block, slot % s.block, h, s.block, s.hkv, s.head) *
              es;
          const Bytes k = random_values(rng, std::size_t(s.head), kv);
          const Bytes v = random_values(rng, std::size_t(s.head), kv);
          std::memcpy(key_cache.data() + at, k.data(), k.size());
          std::memcpy(value_cache.data() + at, v.data(), v.size());
        }
    for (std::size_t b = 0; b < s.seq_lens.size(); ++b)
      query_start_loc.push_back(query_start_loc.back() + (s.q_lens.empty() ? 1 : s.q_lens[b]));
    tokens = query_start_loc.back();
    query = random_values(rng, std::size_t(tokens) * s.hq * s.head, s.dtype);
    out = Bytes(query.size(), 0xcd);
    for (std::int32_t h = 0; h < s.hq; ++h) alibi.push_back(std::ldexp(1.0f, -(h % 8) - 1));
  }

  cpu_vllm::KVCaches caches() {
    const DType kv = storage_dtype(spec);
    const std::int64_t blocks = table->num_blocks;
    return {cache_view(key_cache, kv, spec.layout, blocks, spec.block, spec.hkv, spec.head),
            cache_view(value_cache, kv, spec.layout, blocks, spec.block, spec.hkv, spec.head),
            spec.layout,
            spec.kv_cache_dtype,
            spec.k_scale,
            spec.v_scale};
  }
  TensorView heads(Bytes& raw) {
    return TensorView::dense(raw.data(), spec.dtype, {tokens, spec.hq, spec.head});
  }
  IndexView block_tables() {
    return IndexView::dense(table->ids.data(),
                            {std::int64_t(spec.seq_lens.size()), table->max_blocks});
  }
  IndexView seq_lens() {
    return IndexView::dense(spec.seq_lens.data(), {std::int64_t(spec.seq_lens.size())});
  }
  std::optional<TensorView> slopes() {
    if (!spec.alibi) return std::nullopt;
    return TensorView::dense(alibi.data(), DType::kF32, {spec.hq});
  }

  void mirror(Mirror& m) {
    for (const Bytes* b : {&key_cache, &value_cache, &query, &out}) m.add(*b);
    m.add(table->ids);
    m.add(spec.seq_lens);
    m.add(query_start_loc);
    m.add(alibi);
  }

  // The CUDA operator's output against the CPU operator's.
  void compare(const Mirror& m) const {
    const std::vector<std::int32_t> seq = sequence_of_tokens(query_start_loc);
    const std::int32_t group = spec.hq / spec.hkv;
    expect_rows_close(decode(m.download(out), spec.dtype), decode(out, spec.dtype), spec.hq,
                      spec.head, [&](std::int32_t token) {
                        const auto b = std::size_t(seq[std::size_t(token)]);
                        const std::int32_t q_len = spec.q_lens.empty() ? 1 : spec.q_lens[b];
                        return row_tolerance(decode_rows(q_len, group), spec.dtype,
                                             storage_dtype(spec));
                      });
  }
};

cpu_vllm::KVCaches on_device(const Mirror& m, cpu_vllm::KVCaches kv) {
  kv.key_cache = m(kv.key_cache);
  kv.value_cache = m(kv.value_cache);
  return kv;
}

void check_decode(const VllmSpec& spec) {
  VllmForward f(spec);
  Mirror m;
  f.mirror(m);
  cpu_vllm::ForwardDecodeParams p;
  p.output = f.heads(f.out);
  p.query = f.heads(f.query);
  p.kv = f.caches();
  p.block_tables = f.block_tables();
  p.seq_lens = f.seq_lens();
  p.max_seq_len = *std::max_element(spec.seq_lens.begin(), spec.seq_lens.end());
  p.num_kv_heads = spec.hkv;
  p.scale = 0.9f / std::sqrt(float(spec.head));
  p.alibi_slopes = f.slopes();
  cpu_vllm::forward_decode(p);
  cpu_vllm::ForwardDecodeParams d = p;
  d.output = m(p.output);
  d.query = m(p.query);
  d.kv = on_device(m, p.kv);
  d.block_tables = m(p.block_tables);
  d.seq_lens = m(p.seq_lens);
  d.alibi_slopes = m(p.alibi_slopes);
  gpu_vllm::forward_decode(d);
  synchronize();
  f.compare(m);
}

TEST(CudaVllmOp, Fp8DecodeWithAlibiMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  VllmSpec s;
  s.seq_lens = {0, 1, 45, 300};
  s.alibi = true;
  check_decode(s);
}

TEST(CudaVllmOp, Bf16DecodeInTheCpuLayoutMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  VllmSpec s;
  s.seq_lens = {17, 64};
  s.hq = 4;
  s.hkv = 4;
  s.head = 128;
  s.layout = CacheLayout::kCpu;
  s.dtype = DType::kBF16;
  s.kv_cache_dtype = "auto";
  check_decode(s);
}

TEST(CudaVllmOp, PrefixWithWindowAndAlibiMatchesCpu) {
  PAGEDATTN_REQUIRE_GPU();
  VllmSpec s;
  s.seq_lens = {5, 60, 33};
  s.q_lens = {1, 20, 7};  // 4 rows per KV head (decode kernel), 80 and 28 (prefill)
  s.hq = 4;
  s.hkv = 1;
  s.head = 64;
  s.dtype = DType::kF16;
  s.kv_cache_dtype = "auto";
  s.alibi = true;
  s.sliding_window = 24;
  VllmForward f(s);
  Mirror m;
  f.mirror(m);
  cpu_vllm::ForwardPrefixParams p;
  p.output = f.heads(f.out);
  p.query = f.heads(f.query);
  p.kv = f.caches();
  p.block_tables = f.block_tables();
  p.query_start_loc =
      IndexView::dense(f.query_start_loc.data(), {std::int64_t(f.query_start_loc.size())});
  p.seq_lens = f.seq_lens();
  p.max_query_len = 20;
  p.alibi_slopes = f.slopes();
  p.sliding_window = s.sliding_window;
  cpu_vllm::forward_prefix(p);
  cpu_vllm::ForwardPrefixParams d = p;
  d.output = m(p.output);
  d.query = m(p.query);
  d.kv = on_device(m, p.kv);
  d.block_tables = m(p.block_tables);
  d.query_start_loc = m(p.query_start_loc);
  d.seq_lens = m(p.seq_lens);
  d.alibi_slopes = m(p.alibi_slopes);
  gpu_vllm::forward_prefix(d);
  synchronize();
  f.compare(m);
}

// reshape_and_cache: N = 10 tokens, the first 8 written, one skipped (-1).
void check_reshape_and_cache(CacheLayout layout, DType activation, const char* kv_cache_dtype) {
  std::mt19937 rng(5);
  const std::int32_t blocks = 5, bs = 4, hkv = 3, d = 72, n = 8, tokens = 10;
  const DType kv = std::string(kv_cache_dtype) == "auto" ? activation : DType::kFP8E4M3;
  Bytes key = random_values(rng, std::size_t(tokens) * hkv * d, activation);
  Bytes value = random_values(rng, key.size() / dtype_size(activation), activation);
  Bytes key_cache = poisoned(std::size_t(blocks) * bs * hkv * d, kv);
  Bytes value_cache = key_cache;
  std::vector<std::int64_t> all(std::size_t(blocks) * bs);
  std::iota(all.begin(), all.end(), std::int64_t{0});
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int64_t> slots(all.begin(), all.begin() + n);
  slots[3] = -1;
  Mirror m;
  for (const Bytes* b : {&key, &value, &key_cache, &value_cache}) m.add(*b);
  m.add(slots);
  cpu_vllm::WriteToPagedCacheParams p;
  p.key = TensorView::dense(key.data(), activation, {tokens, hkv, d});
  p.value = TensorView::dense(value.data(), activation, {tokens, hkv, d});
  p.kv = {cache_view(key_cache, kv, layout, blocks, bs, hkv, d),
          cache_view(value_cache, kv, layout, blocks, bs, hkv, d),
          layout,
          kv_cache_dtype,
          0.7f,
          0.45f};
  p.slot_mapping = IndexView::dense(slots.data(), {n});
  cpu_vllm::write_to_paged_cache(p);
  cpu_vllm::WriteToPagedCacheParams q = p;
  q.key = m(p.key);
  q.value = m(p.value);
  q.kv = on_device(m, p.kv);
  q.slot_mapping = m(p.slot_mapping);
  gpu_vllm::reshape_and_cache(q);
  synchronize();
  expect_same_bytes(m.download(key_cache), key_cache, "key_cache");
  expect_same_bytes(m.download(value_cache), value_cache, "value_cache");
}

TEST(CudaVllmOp, ReshapeAndCacheMatchesCpuBitForBit) {
  PAGEDATTN_REQUIRE_GPU();
  check_reshape_and_cache(CacheLayout::kFlash, DType::kF16, "fp8_e4m3");
  check_reshape_and_cache(CacheLayout::kCpu, DType::kBF16, "auto");
  check_reshape_and_cache(CacheLayout::kFlash, DType::kF32, "auto");
}

TEST(CudaVllmOp, CopyBlocksMatchesCpuBitForBit) {
  PAGEDATTN_REQUIRE_GPU();
  std::mt19937 rng(3);
  const std::int32_t blocks = 7, bs = 4, hkv = 2, d = 40;
  std::vector<Bytes> caches;  // layer 0 K, V, layer 1 K, V
  for (int i = 0; i < 4; ++i)
    caches.push_back(random_values(rng, std::size_t(blocks) * bs * hkv * d, DType::kF16));
  std::vector<std::int64_t> mapping = {0, 3, 2, 5, 1, 6};  // (src, dst) pairs
  Mirror m;
  for (const Bytes& c : caches) m.add(c);
  m.add(mapping);
  std::vector<TensorView> host_k, host_v, device_k, device_v;
  for (int layer = 0; layer < 2; ++layer)
    for (int kind = 0; kind < 2; ++kind) {
      Bytes& c = caches[std::size_t(2 * layer + kind)];
      const TensorView view = cache_view(c, DType::kF16, CacheLayout::kFlash, blocks, bs, hkv, d);
      (kind == 0 ? host_k : host_v).push_back(view);
      (kind == 0 ? device_k : device_v).push_back(m(view));
    }
  cpu_vllm::CopyBlocksParams p;
  p.key_caches = host_k;
  p.value_caches = host_v;
  p.block_mapping = IndexView::dense(mapping.data(), {3, 2});
  cpu_vllm::copy_blocks(p);
  cpu_vllm::CopyBlocksParams q = p;
  q.key_caches = device_k;
  q.value_caches = device_v;
  q.block_mapping = m(p.block_mapping);
  gpu_vllm::copy_blocks(q);
  synchronize();
  for (std::size_t i = 0; i < caches.size(); ++i)
    expect_same_bytes(m.download(caches[i]), caches[i], "cache " + std::to_string(i));
}

TEST(CudaVllmOp, SwapBlocksBothWaysMatchesCpuBitForBit) {
  PAGEDATTN_REQUIRE_GPU();
  std::mt19937 rng(9);
  const std::int32_t bs = 8, hkv = 2, d = 24;
  const DType dt = DType::kBF16;
  Bytes gpu_side = random_values(rng, std::size_t(6) * bs * hkv * d, dt);  // 6 blocks
  Bytes cpu_side = random_values(rng, std::size_t(4) * bs * hkv * d, dt);  // 4 blocks
  Mirror m;
  m.add(gpu_side);
  const auto view = [&](Bytes& raw, std::int64_t blocks) {
    return cache_view(raw, dt, CacheLayout::kFlash, blocks, bs, hkv, d);
  };
  // Device -> host: the CPU operator on a host copy of the device side.
  std::vector<std::int64_t> out_mapping = {5, 0, 1, 2};
  Bytes expected_host = cpu_side, actual_host = cpu_side, gpu_copy = gpu_side;
  cpu_vllm::SwapBlocksParams out;
  out.src = view(gpu_copy, 6);
  out.dst = view(expected_host, 4);
  out.block_mapping = IndexView::dense(out_mapping.data(), {2, 2});
  cpu_vllm::swap_blocks(out);
  out.src = m(view(gpu_side, 6));
  out.dst = view(actual_host, 4);
  gpu_vllm::swap_blocks(out);
  synchronize();
  expect_same_bytes(actual_host, expected_host, "swapped out");
  // Host -> device.
  std::vector<std::int64_t> in_mapping = {0, 1, 3, 4};
  cpu_vllm::SwapBlocksParams in;
  in.src = view(cpu_side, 4);
  in.dst = view(gpu_copy, 6);
  in.block_mapping = IndexView::dense(in_mapping.data(), {2, 2});
  cpu_vllm::swap_blocks(in);
  in.dst = m(view(gpu_side, 6));
  gpu_vllm::swap_blocks(in);
  synchronize();
  expect_same_bytes(m.download(gpu_side), gpu_copy, "swapped in");
}

// --- refused before any CUDA call (host only) ---------------------------------------------
//
// Pointers nobody may touch: a host read would crash, a CUDA call would fail
// with a CUDA error instead of the InvalidArgument expected.

void* untouchable(std::uintptr_t n) {
  return reinterpret_cast<void*>(n << 20);
}
template <class Int>
const Int* untouchable_ints(std::uintptr_t n) {
  return static_cast<const Int*>(untouchable(n));
}

// A well-formed ORT call (3 tokens of one sequence, f16) to break one way.
cpu_ort::PagedAttentionParams untouchable_ort_call() {
  cpu_ort::PagedAttentionParams p;
  p.query = TensorView::dense(untouchable(1), DType::kF16, {3, 64});
  p.key = TensorView::dense(untouchable(2), DType::kF16, {3, 32});
  p.value = TensorView::dense(untouchable(3), DType::kF16, {3, 32});
  p.key_cache = TensorView::dense(untouchable(4), DType::kF16, {8, 4, 32});
  p.value_cache = TensorView::dense(untouchable(5), DType::kF16, {8, 4, 32});
  p.cumulative_sequence_length = IndexView::dense(untouchable_ints<std::int32_t>(6), {2});
  p.past_seqlens = IndexView::dense(untouchable_ints<std::int32_t>(7), {1});
  p.block_table = IndexView::dense(untouchable_ints<std::int32_t>(8), {1, 2});
  p.output = TensorView::dense(untouchable(9), DType::kF16, {3, 64});
  p.num_heads = 4;
  p.kv_num_heads = 2;
  return p;
}

template <class Error = InvalidArgument, class Change>
void expect_ort_refused(const Change& change, std::initializer_list<std::string_view> parts) {
  cpu_ort::PagedAttentionParams p = untouchable_ort_call();
  change(p);
  pagedattn::test::expect_throws<Error>([&] { gpu_ort::paged_attention(p); }, parts);
}

TEST(CudaOpsValidation, OrtRefusesBadParamsByNameBeforeAnyCudaCall) {
  const char* call = "cuda::ort::paged_attention: ";
  expect_ort_refused([](auto& p) { p.query.rank = 3; }, {call, "query has rank 3, expected 2"});
  expect_ort_refused([](auto& p) { p.key.reset(); },
                     {call, "key and value must both be given or both be absent"});
  expect_ort_refused([](auto& p) { p.value->dtype = DType::kBF16; },
                     {call, "value has dtype bfloat16, expected float16"});
  expect_ort_refused([](auto& p) { p.output.shape[1] = 32; }, {call, "output has shape [3, 32]"});
  expect_ort_refused([](auto& p) { p.value_cache.dtype = DType::kBF16; },
                     {call, "value_cache has dtype bfloat16"});
  expect_ort_refused(
      [](auto& p) {
        p.block_table = IndexView::dense(untouchable_ints<std::int64_t>(8), {1, 2});
      },
      {call, "block_table has dtype int64, expected int32"});
  expect_ort_refused(
      [](auto& p) { p.past_seqlens = IndexView::dense(untouchable_ints<std::int32_t>(7), {2}); },
      {call, "cumulative_sequence_length has shape [2], expected [3]"});
  expect_ort_refused([](auto& p) { p.do_rotary = true; },
                     {call, "cos_cache and sin_cache must be given exactly when do_rotary"});
  expect_ort_refused([](auto& p) { p.local_window_size = 0; }, {call, "local_window_size = 0"});
  expect_ort_refused<Unsupported>(
      [](auto& p) {
        for (TensorView* t :
             {&p.query, &*p.key, &*p.value, &p.key_cache, &p.value_cache, &p.output})
          t->dtype = DType::kF32;
      },
      {call, "key_cache is float32"});
}

// A well-formed vLLM decode (2 sequences, f16 query, fp8 caches) to break.
cpu_vllm::ForwardDecodeParams untouchable_decode() {
  cpu_vllm::ForwardDecodeParams p;
  p.output = TensorView::dense(untouchable(1), DType::kF16, {2, 4, 32});
  p.query = TensorView::dense(untouchable(2), DType::kF16, {2, 4, 32});
  p.kv.key_cache = TensorView::dense(untouchable(3), DType::kFP8E4M3, {6, 16, 2, 32});
  p.kv.value_cache = TensorView::dense(untouchable(4), DType::kFP8E4M3, {6, 16, 2, 32});
  p.kv.kv_cache_dtype = "fp8";
  p.block_tables = IndexView::dense(untouchable_ints<std::int32_t>(5), {2, 3});
  p.seq_lens = IndexView::dense(untouchable_ints<std::int32_t>(6), {2});
  p.max_seq_len = 48;
  p.num_kv_heads = 2;
  p.scale = 0.125f;
  return p;
}

TEST(CudaOpsValidation, VllmForwardsRefuseBadParamsByNameBeforeAnyCudaCall) {
  using pagedattn::test::expect_throws;
  const auto decode_with = [](auto change) {
    cpu_vllm::ForwardDecodeParams p = untouchable_decode();
    change(p);
    return [p] { gpu_vllm::forward_decode(p); };
  };
  expect_throws<InvalidArgument>(decode_with([](auto& p) { p.query.rank = 2; }),
                                 {"cuda::vllm::forward_decode: ", "query has rank 2, expected 3"});
  expect_throws<InvalidArgument>(decode_with([](auto& p) { p.kv.kv_cache_dtype = "fp16"; }),
                                 {"cuda::vllm::forward_decode: ", "kv_cache_dtype = \"fp16\""});
  expect_throws<InvalidArgument>(decode_with([](auto& p) { p.num_kv_heads = 1; }),
                                 {"cuda::vllm::forward_decode: ", "num_kv_heads = 1"});
  expect_throws<InvalidArgument>(
      decode_with([](auto& p) {
        p.block_tables = IndexView::dense(untouchable_ints<std::int64_t>(5), {2, 3});
      }),
      {"cuda::vllm::forward_decode: ", "block_tables has dtype int64, expected int32"});
  expect_throws<InvalidArgument>(
      decode_with(
          [](auto& p) { p.alibi_slopes = TensorView::dense(untouchable(7), DType::kF16, {4}); }),
      {"cuda::vllm::forward_decode: ", "alibi_slopes has dtype float16, expected float32"});

  cpu_vllm::ForwardPrefixParams prefix;
  const cpu_vllm::ForwardDecodeParams base = untouchable_decode();
  prefix.output = base.output;
  prefix.query = base.query;
  prefix.kv = base.kv;
  prefix.block_tables = base.block_tables;
  prefix.seq_lens = base.seq_lens;
  prefix.query_start_loc = IndexView::dense(untouchable_ints<std::int32_t>(8), {2});
  expect_throws<InvalidArgument>([&] { gpu_vllm::forward_prefix(prefix); },
                                 {"cuda::vllm::forward_prefix: ", "query_start_loc has shape [2]"});
  prefix.query_start_loc = IndexView::dense(untouchable_ints<std::int32_t>(8), {3});
  prefix.sliding_window = 0;
  expect_throws<InvalidArgument>([&] { gpu_vllm::forward_prefix(prefix); },
                                 {"cuda::vllm::forward_prefix: ", "sliding_window = 0"});

  cpu_vllm::ForwardDecodeParams f32 = untouchable_decode();
  f32.query.dtype = f32.output.dtype = DType::kF32;
  f32.kv.key_cache.dtype = f32.kv.value_cache.dtype = DType::kF32;
  f32.kv.kv_cache_dtype = "auto";
  expect_throws<Unsupported>([&] { gpu_vllm::forward_decode(f32); },
                             {"cuda::vllm::forward_decode: ", "key_cache is float32"});
}

TEST(CudaOpsValidation, VllmCacheOpsRefuseBadParamsByNameBeforeAnyCudaCall) {
  using pagedattn::test::expect_throws;
  const cpu_vllm::ForwardDecodeParams base = untouchable_decode();
  cpu_vllm::WriteToPagedCacheParams write;
  write.key = TensorView::dense(untouchable(1), DType::kF16, {5, 2, 32});
  write.value = TensorView::dense(untouchable(2), DType::kF16, {5, 2, 32});
  write.kv = base.kv;
  write.slot_mapping = IndexView::dense(untouchable_ints<std::int32_t>(3), {5});
  expect_throws<InvalidArgument>(
      [&] { gpu_vllm::reshape_and_cache(write); },
      {"cuda::vllm::write_to_paged_cache: ", "slot_mapping has dtype int32, expected int64"});
  write.slot_mapping = IndexView::dense(untouchable_ints<std::int64_t>(3), {6});
  expect_throws<InvalidArgument>(
      [&] { gpu_vllm::reshape_and_cache(write); },
      {"cuda::vllm::write_to_paged_cache: ", "slot_mapping has 6 entries but key has 5"});

  const std::vector<TensorView> caches = {base.kv.key_cache};
  cpu_vllm::CopyBlocksParams copy;
  copy.key_caches = caches;
  copy.value_caches = caches;
  copy.block_mapping = IndexView::dense(untouchable_ints<std::int64_t>(4), {2, 3});
  expect_throws<InvalidArgument>([&] { gpu_vllm::copy_blocks(copy); },
                                 {"cuda::vllm::copy_blocks: ", "block_mapping has shape [2, 3]"});
  copy.block_mapping = IndexView::dense(untouchable_ints<std::int64_t>(4), {2, 2});
  copy.value_caches = {};
  expect_throws<InvalidArgument>([&] { gpu_vllm::copy_blocks(copy); },
                                 {"cuda::vllm::copy_blocks: ", "1 key caches but 0 value caches"});

  // swap_blocks' mapping is host memory (as vLLM's): its values are checked
  // before the pointers' kind is asked.
  const std::vector<std::int64_t> mapping = {0, 7};
  cpu_vllm::SwapBlocksParams swap;
  swap.src = base.kv.key_cache;
  swap.dst = TensorView::dense(untouchable(5), DType::kFP8E4M3, {4, 16, 2, 32});
  swap.block_mapping = IndexView::dense(mapping.data(), {1, 2});
  expect_throws<InvalidArgument>(
      [&] { gpu_vllm::swap_blocks(swap); },
      {"cuda::vllm::swap_blocks: ", "block_mapping[0][1] = 7 is outside [0, 4)"});
  swap.dst.dtype = DType::kF16;
  expect_throws<InvalidArgument>([&] { gpu_vllm::swap_blocks(swap); },
                                 {"cuda::vllm::swap_blocks: ", "dst has dtype float16"});
}

}  // namespace
}  // namespace pagedattn::testing
