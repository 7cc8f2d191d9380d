// Tensor-parallel slicing of the built-in Llama model's weights: column
// split of Q/K/V and gate/up (this rank's heads and intermediate slice),
// row split of the attention output and down projections (their matching
// input columns). Norms, embeddings and the LM head stay whole.
#include <vector>

#include "engine/llama_weights.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

using RowRange = StackedMatrix::RowRange;

std::vector<float> gather(const std::vector<float>& v, const std::vector<RowRange>& ranges) {
  std::vector<float> out;
  for (const RowRange& range : ranges)
    out.insert(out.end(), v.begin() + range.begin, v.begin() + range.begin + range.count);
  return out;
}

}  // namespace

void validate_shard(const LlamaConfig& c) {
  const TensorParallelShard& s = c.shard;
  require(s.size >= 1 && s.rank >= 0 && s.rank < s.size, "LlamaConfig.shard: rank ", s.rank,
          " of size ", s.size, " is not a valid tensor-parallel rank");
  if (s.size == 1) return;
  require(static_cast<bool>(s.all_reduce_sum),
          "LlamaConfig.shard.all_reduce_sum is empty (required for size ", s.size, ")");
  require(c.num_kv_heads % s.size == 0, "tensor parallelism: num_kv_heads = ", c.num_kv_heads,
          " (num_qo_heads = ", c.num_qo_heads, ") of model '", c.name,
          "' is not divisible by the tensor-parallel size ", s.size,
          " (each rank needs whole KV heads)");
  require(c.intermediate_size % s.size == 0,
          "tensor parallelism: intermediate_size = ", c.intermediate_size, " of model '", c.name,
          "' is not divisible by the tensor-parallel size ", s.size);
}

void shard_llama_weights(const LlamaConfig& c, LlamaWeights& w) {
  validate_shard(c);
  const std::int32_t n = c.shard.size, r = c.shard.rank;
  if (n == 1) return;
  const std::int32_t d = c.head_dim, inter = c.intermediate_size / n;
  const std::int32_t q = c.num_qo_heads / n * d, kv = c.num_kv_heads / n * d;
  const std::int32_t q_all = c.num_qo_heads * d, kv_all = c.num_kv_heads * d;
  // Rows of the fused q|k|v matrix: this rank's q heads, k heads, v heads.
  const std::vector<RowRange> qkv = {
      {r * q, q}, {q_all + r * kv, kv}, {q_all + kv_all + r * kv, kv}};
  for (LlamaLayerWeights& l : w.layers) {
    l.qkv = l.qkv.gather_rows(qkv, "attn_qkv");
    if (!l.qkv_bias.empty()) l.qkv_bias = gather(l.qkv_bias, qkv);
    l.o = l.o.slice(0, l.o.out(), r * q, q, "attn_output");
    l.gate_up = l.gate_up.gather_rows(
        {{r * inter, inter}, {c.intermediate_size + r * inter, inter}}, "ffn_gate_up");
    l.down = l.down.slice(0, l.down.out(), r * inter, inter, "ffn_down");
  }
}

}  // namespace pagedattn::engine
