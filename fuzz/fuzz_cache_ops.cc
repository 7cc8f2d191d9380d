// libFuzzer harness: the bytes decode into a small cache configuration and a
// sequence of PagedKVCache calls (sequences, forks, rollback, sliding windows,
// steps with token trees, attention, debug writes). After every call the
// invariants hold; every call that throws leaves state_digest() unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_support.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::fuzz {
namespace {

constexpr DType kStorageTypes[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                                   DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8};
constexpr DType kActivationTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

KVCacheConfig consume_config(FuzzedDataProvider& in) {
  KVCacheConfig config;
  config.num_layers = in.ConsumeIntegralInRange(1, 2);
  config.num_kv_heads = in.ConsumeIntegralInRange(1, 2);
  config.num_qo_heads = config.num_kv_heads * in.ConsumeIntegralInRange(1, 2);
  config.head_dim = 4 << in.ConsumeIntegralInRange(0, 2);
  config.v_head_dim = in.ConsumeBool() ? 0 : 4 << in.ConsumeIntegralInRange(0, 2);
  config.page_size = in.ConsumeIntegralInRange(1, 8);
  config.num_pages = in.ConsumeIntegralInRange(0, 24);
  config.kv_dtype = in.PickValueInArray(kStorageTypes);
  config.layout = in.ConsumeBool() ? KVLayout::kNHD : KVLayout::kHND;
  config.support_sliding_window = in.ConsumeBool();
  config.rope_mode = static_cast<RopeMode>(in.ConsumeIntegralInRange(0, 2));
  config.attention_plan.num_threads = 1;
  return config;
}

SeqId consume_seq(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<SeqId>(-1, 4);
}

std::vector<SeqId> consume_seqs(FuzzedDataProvider& in) {
  std::vector<SeqId> ids(in.ConsumeIntegralInRange(0, 4));
  for (SeqId& id : ids) id = consume_seq(in);
  return ids;
}

std::vector<std::int64_t> consume_lengths(FuzzedDataProvider& in, std::size_t count, int lo,
                                          int hi) {
  // Usually one per sequence; sometimes a wrong count (must be refused).
  if (in.ConsumeIntegralInRange(0, 15) == 0) count = in.ConsumeIntegralInRange<std::size_t>(0, 5);
  std::vector<std::int64_t> lengths(count);
  for (std::int64_t& n : lengths) n = in.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  return lengths;
}

// A dense [tokens][heads][dim] activation buffer in a fuzzed dtype.
struct Activation {
  std::vector<std::uint8_t> bytes;
  HeadTensor tensor;
  Activation(FuzzedDataProvider& in, std::int64_t tokens, std::int32_t heads, std::int32_t dim) {
    tensor.dtype = in.PickValueInArray(kActivationTypes);
    const std::size_t elements = static_cast<std::size_t>(tokens * heads * dim);
    bytes.assign(elements * dtype_size(tensor.dtype) + 1, 0);
    for (std::size_t i = 0; i < elements; ++i) {  // small finite values
      store_from_float(bytes.data(), tensor.dtype, i, static_cast<float>(i % 7) * 0.25f - 0.5f);
    }
    tensor.data = bytes.data();
    tensor.token_stride = std::int64_t{heads} * dim;
    tensor.head_stride = dim;
  }
};

void attention(FuzzedDataProvider& in, PagedKVCache& kv) {
  const KVCacheConfig& c = kv.config();
  const std::int64_t tokens =
      kv.in_forward() ? kv.plan().num_tokens() : in.ConsumeIntegralInRange(0, 3);
  const std::int32_t layer = in.ConsumeIntegralInRange(-1, c.num_layers);
  AttentionOptions options;
  options.causal = in.ConsumeBool();
  options.window_left = in.ConsumeIntegralInRange(-2, 6);
  options.softcap = in.ConsumeBool() ? 0.0f : in.ConsumeFloatingPointInRange(-1.0f, 30.0f);
  Activation q(in, tokens, c.num_qo_heads, c.head_dim);
  Activation k(in, tokens, c.num_kv_heads, c.head_dim);
  Activation v(in, tokens, c.num_kv_heads, c.v_head_dim);
  Activation out(in, tokens, c.num_qo_heads, c.v_head_dim);
  call_checked(
      "attention", [&] { kv.attention(layer, q.tensor, k.tensor, v.tensor, out.tensor, options); },
      [&] { return kv.state_digest(); });
}

void debug_set_kv(FuzzedDataProvider& in, PagedKVCache& kv) {
  const KVCacheConfig& c = kv.config();
  const SeqId seq = consume_seq(in);
  const std::int64_t start = in.ConsumeIntegralInRange<std::int64_t>(-1, 12);
  const std::int64_t end = in.ConsumeIntegralInRange<std::int64_t>(-1, 12);
  const std::int64_t tokens = end > start ? end - start : 0;
  std::size_t k_count =
      static_cast<std::size_t>(c.num_layers * tokens * c.num_kv_heads * c.head_dim);
  std::size_t v_count =
      static_cast<std::size_t>(c.num_layers * tokens * c.num_kv_heads * c.v_head_dim);
  if (in.ConsumeIntegralInRange(0, 7) == 0) k_count = in.ConsumeIntegralInRange<std::size_t>(0, 64);
  const std::vector<float> k(k_count, 1.5f), v(v_count, -0.75f);
  call_checked(
      "debug_set_kv", [&] { kv.debug_set_kv(seq, start, end, k, v); },
      [&] { return kv.state_digest(); });
  std::vector<float> k_out(k_count), v_out(v_count);
  call_checked(
      "debug_get_kv", [&] { kv.debug_get_kv(seq, start, end, k_out, v_out); },
      [&] { return kv.state_digest(); });
}

void run_one(FuzzedDataProvider& in, PagedKVCache& kv) {
  const auto digest = [&] { return kv.state_digest(); };
  switch (in.ConsumeIntegralInRange(0, 10)) {
    case 0: {
      const SeqId seq = consume_seq(in);
      call_checked(
          "add_sequence", [&] { kv.add_sequence(seq); }, digest);
      break;
    }
    case 1: {
      const SeqId seq = consume_seq(in);
      call_checked(
          "remove_sequence", [&] { kv.remove_sequence(seq); }, digest);
      break;
    }
    case 2: {
      const SeqId parent = consume_seq(in), child = consume_seq(in);
      const std::int64_t pos = in.ConsumeIntegralInRange<std::int64_t>(-2, 20);
      call_checked(
          "fork_sequence", [&] { kv.fork_sequence(parent, child, pos); }, digest);
      break;
    }
    case 3: {
      const SeqId seq = consume_seq(in);
      const std::int64_t n = in.ConsumeIntegralInRange<std::int64_t>(-1, 10);
      call_checked(
          "pop_n", [&] { kv.pop_n(seq, n); }, digest);
      break;
    }
    case 4: {
      const SeqId seq = consume_seq(in);
      const std::int64_t window = in.ConsumeIntegralInRange<std::int64_t>(-1, 10);
      const std::int64_t sink = in.ConsumeIntegralInRange<std::int64_t>(-1, 4);
      call_checked(
          "enable_sliding_window", [&] { kv.enable_sliding_window(seq, window, sink); }, digest);
      break;
    }
    case 5: {
      const std::vector<SeqId> ids = consume_seqs(in);
      const std::vector<std::int64_t> lengths = consume_lengths(in, ids.size(), -1, 12);
      call_checked(
          "begin_forward", [&] { kv.begin_forward(ids, lengths); }, digest);
      break;
    }
    case 6: {
      const std::vector<SeqId> ids = consume_seqs(in);
      const std::vector<std::int64_t> lengths = consume_lengths(in, ids.size(), -1, 4);
      std::vector<std::int64_t> parents;
      for (std::int64_t n : lengths) {
        for (std::int64_t i = 0; i < n && parents.size() < 32; ++i) {
          parents.push_back(in.ConsumeIntegralInRange<std::int64_t>(-2, i));
        }
      }
      call_checked(
          "begin_forward(tree)", [&] { kv.begin_forward(ids, lengths, parents); }, digest);
      break;
    }
    case 7: {
      const std::vector<SeqId> ids = consume_seqs(in);
      const std::vector<std::int64_t> leaves = consume_lengths(in, ids.size(), -2, 8);
      call_checked(
          "commit_accepted_token_tree_nodes",
          [&] { kv.commit_accepted_token_tree_nodes(ids, leaves); }, digest);
      break;
    }
    case 8:
      call_checked(
          "end_forward", [&] { kv.end_forward(); }, digest);
      break;
    case 9:
      attention(in, kv);
      break;
    default:
      debug_set_kv(in, kv);
      break;
  }
}

}  // namespace
}  // namespace pagedattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedattn;
  FuzzedDataProvider in(data, size);
  KVCacheConfig config = fuzz::consume_config(in);
  std::optional<PagedKVCache> kv;
  try {
    kv.emplace(config);
  } catch (const Error&) {
    return 0;  // a refused configuration
  }
  for (int calls = 0; calls < 64 && in.remaining_bytes() > 0; ++calls) {
    fuzz::run_one(in, *kv);
    kv->check_invariants();  // throws InternalError: an uncaught exception is a crash
  }
  return 0;
}
