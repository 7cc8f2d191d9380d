// libFuzzer harness: the peer-compatible operators (ONNX Runtime
// PagedAttention, vLLM's paged-attention and cache ops, torch_xla's ragged
// paged attention, TVM's entry points) with fuzzed index inputs (block
// tables, sequence lengths, slot mappings, cumulative offsets, block
// mappings) and slightly-off shapes. Every buffer really holds the elements
// its declared shape says; what is fuzzed is what an operator must validate.
// A call either succeeds or throws a pagedattn::Error, and on failure the
// caches it would write keep their bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <vector>

#include "fuzz_support.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/torch_xla.h"
#include "pagedattn/ops/tvm.h"
#include "pagedattn/ops/vllm.h"

namespace pagedattn::fuzz {
namespace {

using ops::IndexType;
using ops::IndexView;
using ops::TensorView;

constexpr DType kCacheTypes[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                                 DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};

// Owns every buffer of one input and decodes fuzzed shapes and indices.
class Inputs {
 public:
  explicit Inputs(FuzzedDataProvider& in) : in_(in) {}

  // A dimension: usually as the operator expects, sometimes anything small.
  std::int64_t dim(std::int64_t expected) {
    return in_.ConsumeIntegralInRange(0, 15) == 0 ? in_.ConsumeIntegralInRange<std::int64_t>(0, 9)
                                                  : expected;
  }

  TensorView tensor(DType dtype, std::initializer_list<std::int64_t> shape) {
    std::size_t elements = 1;
    for (std::int64_t extent : shape) elements *= static_cast<std::size_t>(extent);
    std::vector<std::uint8_t>& bytes = buffers_.emplace_back(elements * dtype_size(dtype) + 8, 0);
    if (is_activation_dtype(dtype)) {
      for (std::size_t i = 0; i < elements; ++i) {
        store_from_float(bytes.data(), dtype, i, static_cast<float>(i % 5) * 0.5f - 1.0f);
      }
    }
    return TensorView::dense(bytes.data(), dtype, shape);
  }

  // Index values mostly near the valid range, sometimes extremes.
  std::int64_t index_value() {
    switch (in_.ConsumeIntegralInRange(0, 31)) {
      case 0:
        return std::numeric_limits<std::int32_t>::max();
      case 1:
        return std::numeric_limits<std::int32_t>::min();
      case 2:
        return in_.ConsumeIntegral<std::int64_t>();
      default:
        return in_.ConsumeIntegralInRange<std::int64_t>(-2, 12);
    }
  }

  IndexView index(IndexType expected, std::initializer_list<std::int64_t> shape) {
    const IndexType type = in_.ConsumeIntegralInRange(0, 15) == 0
                               ? in_.PickValueInArray({IndexType::kInt32, IndexType::kInt64})
                               : expected;
    std::size_t elements = 1;
    for (std::int64_t extent : shape) elements *= static_cast<std::size_t>(extent);
    std::vector<std::uint8_t>& bytes = buffers_.emplace_back(elements * 8 + 8, 0);
    for (std::size_t i = 0; i < elements; ++i) {
      const std::int64_t value = index_value();
      if (type == IndexType::kInt32) {
        reinterpret_cast<std::int32_t*>(bytes.data())[i] = static_cast<std::int32_t>(value);
      } else {
        reinterpret_cast<std::int64_t*>(bytes.data())[i] = value;
      }
    }
    IndexView view =
        type == IndexType::kInt32
            ? IndexView::dense(reinterpret_cast<const std::int32_t*>(bytes.data()), shape)
            : IndexView::dense(reinterpret_cast<const std::int64_t*>(bytes.data()), shape);
    return view;
  }

  // The bytes of a tensor, to compare before and after a failed call.
  static std::vector<std::uint8_t> bytes_of(const TensorView& t) {
    std::size_t elements = 1;
    for (std::int32_t d = 0; d < t.rank; ++d) elements *= static_cast<std::size_t>(t.dim(d));
    const auto* p = static_cast<const std::uint8_t*>(t.data);
    return {p, p + elements * dtype_size(t.dtype)};
  }

  FuzzedDataProvider& in() { return in_; }

 private:
  FuzzedDataProvider& in_;
  std::deque<std::vector<std::uint8_t>> buffers_;
};

// Small sizes shared by one operator call.
struct Sizes {
  std::int64_t tokens, seqs, q_heads, kv_heads, head_dim, blocks, block_size, max_blocks;
  explicit Sizes(FuzzedDataProvider& in)
      : tokens(in.ConsumeIntegralInRange(0, 6)),
        seqs(in.ConsumeIntegralInRange(0, 3)),
        kv_heads(in.ConsumeIntegralInRange(1, 2)),
        // 4, 8, 12, 16: dims that are not multiples of 8 once read past a
        // caller's cache (found here; fixed, see docs/fuzzing.md).
        head_dim(4 * in.ConsumeIntegralInRange(1, 4)),
        blocks(in.ConsumeIntegralInRange(0, 6)),
        block_size(in.ConsumeIntegralInRange(1, 4)),
        max_blocks(in.ConsumeIntegralInRange(0, 3)) {
    q_heads = kv_heads * in.ConsumeIntegralInRange(1, 2);
  }
};

void fuzz_ort(Inputs& x, const Sizes& s) {
  ops::ort::PagedAttentionParams p;
  const std::int64_t hd = s.head_dim;
  p.num_heads = static_cast<std::int32_t>(x.dim(s.q_heads));
  p.kv_num_heads = static_cast<std::int32_t>(x.dim(s.kv_heads));
  p.query = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads * hd)});
  if (x.in().ConsumeBool()) {
    p.key = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.kv_heads * hd)});
    p.value = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.kv_heads * hd)});
  } else {
    p.query = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim((s.q_heads + 2 * s.kv_heads) * hd)});
  }
  p.key_cache =
      x.tensor(DType::kF32, {x.dim(s.blocks), x.dim(s.block_size), x.dim(s.kv_heads * hd)});
  p.value_cache =
      x.tensor(DType::kF32, {x.dim(s.blocks), x.dim(s.block_size), x.dim(s.kv_heads * hd)});
  p.cumulative_sequence_length = x.index(IndexType::kInt32, {x.dim(s.seqs + 1)});
  p.past_seqlens = x.index(IndexType::kInt32, {x.dim(s.seqs)});
  p.block_table = x.index(IndexType::kInt32, {x.dim(s.seqs), x.dim(s.max_blocks)});
  if (x.in().ConsumeBool()) p.slot_mapping = x.index(IndexType::kInt64, {x.dim(s.tokens)});
  p.output = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads * hd)});
  p.local_window_size = x.in().ConsumeIntegralInRange(-2, 8);
  p.softcap = x.in().ConsumeBool() ? 0.0f : x.in().ConsumeFloatingPointInRange(-2.0f, 50.0f);
  call_checked(
      "ort::paged_attention", [&] { ops::ort::paged_attention(p); },
      [&] {
        return std::make_pair(Inputs::bytes_of(p.key_cache), Inputs::bytes_of(p.value_cache));
      });
}

ops::vllm::KVCaches vllm_caches(Inputs& x, const Sizes& s) {
  ops::vllm::KVCaches kv;
  kv.layout = x.in().ConsumeBool() ? ops::vllm::CacheLayout::kCpu : ops::vllm::CacheLayout::kFlash;
  const DType dtype = x.in().PickValueInArray(kCacheTypes);
  kv.kv_cache_dtype =
      is_fp8(dtype) ? x.in().PickValueInArray({"fp8", "fp8_e4m3", "fp8_e5m2"}) : "auto";
  const bool flash = kv.layout == ops::vllm::CacheLayout::kFlash;
  const std::int64_t mid0 = flash ? s.block_size : s.kv_heads,
                     mid1 = flash ? s.kv_heads : s.block_size;
  kv.key_cache = x.tensor(dtype, {x.dim(s.blocks), x.dim(mid0), x.dim(mid1), x.dim(s.head_dim)});
  kv.value_cache = x.tensor(dtype, {x.dim(s.blocks), x.dim(mid0), x.dim(mid1), x.dim(s.head_dim)});
  return kv;
}

void fuzz_vllm(Inputs& x, const Sizes& s) {
  const auto caches_digest = [](const ops::vllm::KVCaches& kv) {
    return [&kv] {
      return std::make_pair(Inputs::bytes_of(kv.key_cache), Inputs::bytes_of(kv.value_cache));
    };
  };
  switch (x.in().ConsumeIntegralInRange(0, 4)) {
    case 0: {
      ops::vllm::ForwardDecodeParams p;
      p.kv = vllm_caches(x, s);
      p.query = x.tensor(DType::kF32, {x.dim(s.seqs), x.dim(s.q_heads), x.dim(s.head_dim)});
      p.output = x.tensor(DType::kF32, {x.dim(s.seqs), x.dim(s.q_heads), x.dim(s.head_dim)});
      p.block_tables = x.index(IndexType::kInt32, {x.dim(s.seqs), x.dim(s.max_blocks)});
      p.seq_lens = x.index(IndexType::kInt32, {x.dim(s.seqs)});
      p.max_seq_len = static_cast<std::int32_t>(x.index_value());
      p.num_kv_heads = static_cast<std::int32_t>(x.dim(s.kv_heads));
      p.scale = 0.5f;
      call_checked(
          "vllm::forward_decode", [&] { ops::vllm::forward_decode(p); }, caches_digest(p.kv));
      break;
    }
    case 1: {
      ops::vllm::ForwardPrefixParams p;
      p.kv = vllm_caches(x, s);
      p.query = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads), x.dim(s.head_dim)});
      p.output = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads), x.dim(s.head_dim)});
      p.block_tables = x.index(IndexType::kInt32, {x.dim(s.seqs), x.dim(s.max_blocks)});
      p.query_start_loc = x.index(IndexType::kInt32, {x.dim(s.seqs + 1)});
      p.seq_lens = x.index(IndexType::kInt32, {x.dim(s.seqs)});
      p.max_query_len = static_cast<std::int32_t>(x.index_value());
      if (x.in().ConsumeBool()) p.sliding_window = static_cast<std::int32_t>(x.index_value());
      call_checked(
          "vllm::forward_prefix", [&] { ops::vllm::forward_prefix(p); }, caches_digest(p.kv));
      break;
    }
    case 2: {
      ops::vllm::WriteToPagedCacheParams p;
      p.kv = vllm_caches(x, s);
      p.key = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.kv_heads), x.dim(s.head_dim)});
      p.value = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.kv_heads), x.dim(s.head_dim)});
      p.slot_mapping = x.index(IndexType::kInt64, {x.dim(s.tokens)});
      call_checked(
          "vllm::write_to_paged_cache", [&] { ops::vllm::write_to_paged_cache(p); },
          caches_digest(p.kv));
      break;
    }
    case 3: {
      const ops::vllm::KVCaches kv = vllm_caches(x, s);
      ops::vllm::CopyBlocksParams p;
      p.key_caches = {&kv.key_cache, 1};
      p.value_caches = {&kv.value_cache, 1};
      p.layout = kv.layout;
      p.block_mapping = x.index(IndexType::kInt64, {x.dim(s.max_blocks), x.dim(2)});
      call_checked(
          "vllm::copy_blocks", [&] { ops::vllm::copy_blocks(p); }, caches_digest(kv));
      break;
    }
    default: {
      const ops::vllm::KVCaches a = vllm_caches(x, s);
      ops::vllm::SwapBlocksParams p;
      p.src = a.key_cache;
      p.dst = a.value_cache;
      p.layout = a.layout;
      p.block_mapping = x.index(IndexType::kInt64, {x.dim(s.max_blocks), x.dim(2)});
      call_checked(
          "vllm::swap_blocks", [&] { ops::vllm::swap_blocks(p); }, caches_digest(a));
      break;
    }
  }
}

void fuzz_torch_xla(Inputs& x, const Sizes& s) {
  ops::torch_xla::RaggedPagedAttentionParams p;
  p.q = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads), x.dim(s.head_dim)});
  if (x.in().ConsumeBool()) {
    p.kv_pages = x.tensor(DType::kF32, {x.dim(s.blocks), x.dim(s.block_size), x.dim(2 * s.kv_heads),
                                        x.dim(s.head_dim)});
  } else {
    p.k_pages = x.tensor(DType::kF32,
                         {x.dim(s.blocks), x.dim(s.block_size), x.dim(s.kv_heads * s.head_dim)});
    p.v_pages = x.tensor(DType::kF32,
                         {x.dim(s.blocks), x.dim(s.block_size), x.dim(s.kv_heads * s.head_dim)});
  }
  p.kv_lens = x.index(IndexType::kInt32, {x.dim(s.seqs)});
  p.page_indices = x.index(IndexType::kInt32, {x.dim(s.seqs), x.dim(s.max_blocks)});
  p.cu_q_lens = x.index(IndexType::kInt32, {x.dim(s.seqs + 1)});
  p.num_seqs = x.index(IndexType::kInt32, {x.dim(1)});
  if (x.in().ConsumeBool()) p.sliding_window = static_cast<std::int32_t>(x.index_value());
  if (x.in().ConsumeBool()) p.soft_cap = x.in().ConsumeFloatingPointInRange(-2.0f, 50.0f);
  p.output = x.tensor(DType::kF32, {x.dim(s.tokens), x.dim(s.q_heads), x.dim(s.head_dim)});
  call_checked(
      "torch_xla::ragged_paged_attention", [&] { ops::torch_xla::ragged_paged_attention(p); },
      [] { return 0; });
}

void fuzz_tvm(Inputs& x, const Sizes& s) {
  KVCacheConfig config;
  config.num_qo_heads = static_cast<std::int32_t>(s.q_heads);
  config.num_kv_heads = static_cast<std::int32_t>(s.kv_heads);
  config.head_dim = static_cast<std::int32_t>(s.head_dim);
  config.page_size = static_cast<std::int32_t>(s.block_size);
  config.num_pages = 8;
  config.support_sliding_window = true;
  config.attention_plan.num_threads = 1;
  PagedKVCache cache(config);
  const auto digest = [&] { return cache.state_digest(); };
  for (std::int64_t id = 0; id < s.seqs; ++id) ops::tvm::kv_state_add_sequence(cache, id);
  const IndexView ids = x.index(IndexType::kInt64, {x.dim(s.seqs)});
  const IndexView lengths = x.index(IndexType::kInt64, {x.dim(s.seqs)});
  const auto* id_data = static_cast<const std::int64_t*>(ids.data);
  const auto* length_data = static_cast<const std::int64_t*>(lengths.data);
  if (ids.type == IndexType::kInt64 && lengths.type == IndexType::kInt64) {
    call_checked(
        "tvm::kv_state_begin_forward",
        [&] {
          ops::tvm::kv_state_begin_forward(cache, {id_data, static_cast<std::size_t>(ids.dim(0))},
                                           {length_data, static_cast<std::size_t>(lengths.dim(0))});
        },
        digest);
  }
  const std::int64_t tokens = cache.in_forward() ? cache.plan().num_tokens() : s.tokens;
  ops::tvm::AttentionWithFusedQKVParams p;
  p.layer_id = static_cast<std::int32_t>(x.in().ConsumeIntegralInRange(-1, 1));
  p.sm_scale = 0.5f;
  p.qkv =
      x.tensor(DType::kF32, {x.dim(tokens), x.dim(s.q_heads + 2 * s.kv_heads), x.dim(s.head_dim)});
  p.o = x.tensor(DType::kF32, {x.dim(tokens), x.dim(s.q_heads), x.dim(s.head_dim)});
  call_checked(
      "tvm::attention_with_fused_qkv",
      [&] { ops::tvm::attention_kv_cache_attention_with_fused_qkv(cache, p); }, digest);
  const std::int64_t window_seq = x.index_value();
  const auto window = static_cast<std::int32_t>(x.index_value());
  const auto sink = static_cast<std::int32_t>(x.index_value());
  call_checked(
      "tvm::kv_state_end_forward", [&] { ops::tvm::kv_state_end_forward(cache); }, digest);
  call_checked(
      "tvm::enable_sliding_window",
      [&] {
        ops::tvm::attention_kv_cache_enable_sliding_window_for_seq(cache, window_seq, window, sink);
      },
      digest);
  const std::int64_t pop_seq = x.index_value();
  const std::int64_t pop_count = x.index_value();
  call_checked(
      "tvm::kv_state_popn", [&] { ops::tvm::kv_state_popn(cache, pop_seq, pop_count); }, digest);
  cache.check_invariants();
}

}  // namespace
}  // namespace pagedattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedattn::fuzz;
  FuzzedDataProvider in(data, size);
  Inputs inputs(in);
  const int op = in.ConsumeIntegralInRange(0, 3);
  const Sizes sizes(in);
  switch (op) {
    case 0:
      fuzz_ort(inputs, sizes);
      break;
    case 1:
      fuzz_vllm(inputs, sizes);
      break;
    case 2:
      fuzz_torch_xla(inputs, sizes);
      break;
    default:
      fuzz_tvm(inputs, sizes);
      break;
  }
  return 0;
}
