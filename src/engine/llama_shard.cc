// Tensor-parallel slicing of the built-in Llama model's weights: column
// split of Q/K/V and gate/up (this rank's heads and intermediate slice),
// row split of the attention output and down projections (their matching
// input columns). With more ranks than KV heads each rank keeps a copy of
// the one KV head its query heads use. Latent attention (MLA) keeps this
// rank's query heads and their up-projections; the latent projection (the
// one KV head) is on every rank. Mixture-of-experts layers split every
// expert, shared one included, like a dense MLP; the router is on every
// rank. The LM head is split by vocabulary rows when the shard can
// all-gather the logits; norms and the embedding stay whole.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/gemm.h"
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

std::int32_t kv_heads_per_rank(const LlamaConfig& c, std::int32_t size) {
  return std::max(1, c.num_kv_heads / size);
}

// Split: rank r's heads start at r num_kv_heads / size. Replicated: the
// same formula names the head shared by size / num_kv_heads ranks.
std::int32_t first_kv_head(const LlamaConfig& c, std::int32_t rank, std::int32_t size) {
  return static_cast<std::int32_t>(std::int64_t{rank} * c.num_kv_heads / size);
}

// Whether every query head of every rank finds, at the place the rank's own
// grouping looks (hq / hkv query heads per local KV head), the KV head that
// grouped-query attention gives it in the whole model.
bool grouping_preserved(const LlamaConfig& c, std::int32_t size) {
  const std::int32_t hq = c.num_qo_heads / size, hkv = kv_heads_per_rank(c, size);
  if (hq % hkv != 0) return false;
  const std::int32_t group = c.num_qo_heads / c.num_kv_heads, local_group = hq / hkv;
  for (std::int32_t r = 0; r < size; ++r)
    for (std::int32_t i = 0; i < hq; ++i)
      if ((r * hq + i) / group != first_kv_head(c, r, size) + i / local_group) return false;
  return true;
}

// Why `size` ranks cannot split the model; empty when they can.
std::string split_problems(const LlamaConfig& c, std::int32_t size) {
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (c.num_qo_heads % size != 0)
    add(detail::concat("num_qo_heads = ", c.num_qo_heads,
                       " is not divisible by the tensor-parallel size ", size));
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0)
    add(detail::concat("num_kv_heads = ", c.num_kv_heads, " and the tensor-parallel size ", size,
                       " do not divide one another (a rank holds whole KV heads, or one KV head "
                       "shared by size / num_kv_heads ranks)"));
  else if (problems.empty() && !grouping_preserved(c, size))
    add(detail::concat("a rank's num_qo_heads / size = ", c.num_qo_heads / size,
                       " query heads would not all use its KV heads (num_qo_heads = ",
                       c.num_qo_heads, ", num_kv_heads = ", c.num_kv_heads, ")"));
  const bool dense_layers = c.num_experts == 0 || c.leading_dense_layers > 0;
  if (dense_layers && c.intermediate_size % size != 0)
    add(detail::concat("intermediate_size = ", c.intermediate_size,
                       " is not divisible by the tensor-parallel size ", size));
  if (c.expert_intermediate_size % size != 0)
    add(detail::concat("expert_intermediate_size = ", c.expert_intermediate_size,
                       " is not divisible by the tensor-parallel size ", size));
  if (c.shared_expert_intermediate_size % size != 0)
    add(detail::concat("shared_expert_intermediate_size = ", c.shared_expert_intermediate_size,
                       " is not divisible by the tensor-parallel size ", size));
  return problems;
}

// The sizes that split the model (all divide num_qo_heads), as "1, 3".
std::string working_sizes(const LlamaConfig& c) {
  std::string sizes;
  for (std::int32_t n = 1; n <= c.num_qo_heads; ++n)
    if (split_problems(c, n).empty()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
  return sizes;
}

}  // namespace

void validate_shard(const LlamaConfig& c) {
  const TensorParallelShard& s = c.shard;
  require(s.size >= 1 && s.rank >= 0 && s.rank < s.size, "LlamaConfig.shard: rank ", s.rank,
          " of size ", s.size, " is not a valid tensor-parallel rank");
  if (s.size == 1) return;
  require(static_cast<bool>(s.all_reduce_sum),
          "LlamaConfig.shard.all_reduce_sum is empty (required for size ", s.size, ")");
  require(c.num_qo_heads >= 1 && c.num_kv_heads >= 1 && c.num_qo_heads % c.num_kv_heads == 0 &&
              (c.intermediate_size >= 1 || c.num_experts > 0),
          "tensor parallelism: model '", c.name, "' has num_qo_heads = ", c.num_qo_heads,
          ", num_kv_heads = ", c.num_kv_heads, ", intermediate_size = ", c.intermediate_size,
          " (need num_kv_heads >= 1 dividing num_qo_heads, intermediate_size >= 1 without "
          "experts)");
  const std::string problems = split_problems(c, s.size);
  if (problems.empty()) return;
  throw InvalidArgument(detail::concat(
      "tensor parallelism: model '", c.name, "' cannot be split over ", s.size, " ranks: ",
      problems, ". Tensor-parallel sizes that work for this model: ", working_sizes(c)));
}

std::int32_t shard_qo_heads(const LlamaConfig& c) {
  return c.num_qo_heads / c.shard.size;
}

std::int32_t shard_kv_heads(const LlamaConfig& c) {
  return kv_heads_per_rank(c, c.shard.size);
}

bool vocab_parallel(const LlamaConfig& c) {
  return c.shard.size > 1 && static_cast<bool>(c.shard.all_gather);
}

VocabSlice vocab_slice(std::int32_t vocab_size, std::int32_t rank, std::int32_t size) {
  require(vocab_size >= 1 && size >= 1 && rank >= 0 && rank < size,
          "vocab_slice: vocab_size = ", vocab_size, ", rank = ", rank, ", size = ", size,
          " (need vocab_size >= 1 and rank in [0, size))");
  const std::int64_t blocks = (vocab_size + kColumnBlock - 1) / kColumnBlock;
  auto start = [&](std::int32_t r) {
    return static_cast<std::int32_t>(
        std::min<std::int64_t>(vocab_size, blocks * r / size * kColumnBlock));
  };
  return {start(rank), start(rank + 1) - start(rank)};
}

std::int32_t lm_head_rows(const LlamaConfig& c) {
  return vocab_parallel(c) ? vocab_slice(c.vocab_size, c.shard.rank, c.shard.size).count
                           : c.vocab_size;
}

namespace {

// The gate/up rows and down columns of slice r of n of a gated MLP's
// intermediate features (an empty MLP stays empty).
void shard_mlp(StackedMatrix& gate_up, WeightMatrix& down, std::int32_t r, std::int32_t n,
               const char* gate_up_name, const char* down_name) {
  if (down.empty()) return;
  const std::int32_t width = down.in(), inter = width / n;
  gate_up = gate_up.gather_rows({{r * inter, inter}, {width + r * inter, inter}}, gate_up_name);
  down = down.slice(0, down.out(), r * inter, inter, down_name);
}

// This rank's query heads of a latent-attention layer: their rows of the
// query projection (q_b, or q within the stacked input) and their key /
// value up-projections; q_a and the latent projection kv_a stay whole.
void shard_latent_attention(const LlamaConfig& c, std::int32_t r, MlaLayerWeights& m) {
  const std::int32_t heads = shard_qo_heads(c), head_q = c.qk_nope_head_dim + c.rotary_dim;
  const std::int32_t q = heads * head_q;
  if (c.q_lora_rank > 0) {
    m.q_b = m.q_b.slice(r * q, q, 0, m.q_b.in(), "attn_q_b");
  } else {
    const std::int32_t q_all = c.num_qo_heads * head_q;
    m.input = m.input.gather_rows({{r * q, q}, {q_all, c.kv_lora_rank + c.rotary_dim}},
                                  "attn_q with attn_kv_a_mqa");
  }
  const auto mine = [&](std::vector<WeightMatrix>& per_head) {
    per_head = std::vector<WeightMatrix>(per_head.begin() + std::ptrdiff_t(r) * heads,
                                         per_head.begin() + std::ptrdiff_t(r + 1) * heads);
  };
  mine(m.k_absorb);
  mine(m.v_up);
}

}  // namespace

void shard_llama_weights(const LlamaConfig& c, LlamaWeights& w) {
  validate_shard(c);
  const std::int32_t n = c.shard.size, r = c.shard.rank;
  if (n == 1) return;
  const std::int32_t d = c.head_dim;
  const std::int32_t q = shard_qo_heads(c) * d, kv = shard_kv_heads(c) * d;
  const std::int32_t kv_begin = first_kv_head(c, r, n) * d;
  const std::int32_t q_all = c.num_qo_heads * d, kv_all = c.num_kv_heads * d;
  // Rows of the fused q|k|v matrix: this rank's q heads, k heads, v heads.
  const std::vector<RowRange> qkv = {
      {r * q, q}, {q_all + kv_begin, kv}, {q_all + kv_all + kv_begin, kv}};
  // The attention output's input columns: this rank's heads' values.
  const std::int32_t values = shard_qo_heads(c) * (c.kv_lora_rank > 0 ? c.v_head_dim : d);
  for (LlamaLayerWeights& l : w.layers) {
    if (c.kv_lora_rank > 0) {
      shard_latent_attention(c, r, l.mla);
    } else {
      l.qkv = l.qkv.gather_rows(qkv, "attn_qkv");
      if (!l.qkv_bias.empty()) l.qkv_bias = gather(l.qkv_bias, qkv);
    }
    l.o = l.o.slice(0, l.o.out(), r * values, values, "attn_output");
    shard_mlp(l.gate_up, l.down, r, n, "ffn_gate_up", "ffn_down");
    for (ExpertWeights& e : l.moe.experts)
      shard_mlp(e.gate_up, e.down, r, n, "ffn_gate_up_exps", "ffn_down_exps");
    shard_mlp(l.moe.shared.gate_up, l.moe.shared.down, r, n, "ffn_gate_up_shexp", "ffn_down_shexp");
  }
  if (!vocab_parallel(c) || c.tie_embeddings) return;  // a tied head reads the embedding's rows
  require(w.lm_head.out() == c.vocab_size, "LlamaModel: the LM head has ", w.lm_head.out(),
          " rows, the config needs vocab_size = ", c.vocab_size);
  const VocabSlice mine = vocab_slice(c.vocab_size, r, n);
  w.lm_head = w.lm_head.slice(mine.begin, mine.count, 0, w.lm_head.in(), "output (the LM head)");
}

namespace {

// rows x count logits of this rank's vocabulary rows into `y` (row stride count).
void project_vocab_slice(const LlamaConfig& c, const LlamaWeights& w, const float* x,
                         std::int32_t rows, const VocabSlice& mine, bool deterministic,
                         LinearScratch& scratch, float* y) {
  const WeightMatrix& head = c.tie_embeddings ? w.embedding : w.lm_head;
  const std::int64_t first_row = c.tie_embeddings ? mine.begin : 0;  // the embedding is whole
  const auto* weights = static_cast<const std::byte*>(head.data()) +
                        first_row * weight_row_bytes(head.format(), head.in());
  linear({.x = x,
          .rows = rows,
          .in = head.in(),
          .w = weights,
          .out = mine.count,
          .y = y,
          .deterministic = deterministic,
          .w_format = head.format()},
         scratch);
}

}  // namespace

void project_lm_head(const LlamaConfig& c, const LlamaWeights& w, const float* x, std::int32_t rows,
                     std::span<float> logits, bool deterministic, LinearScratch& scratch,
                     std::vector<float>& gathered) {
  const std::int32_t vocab = c.vocab_size, n = c.shard.size;
  require(rows >= 0 && logits.size() == std::size_t(rows) * std::size_t(vocab),
          "project_lm_head: logits has ", logits.size(), " floats, need rows = ", rows, " x ",
          vocab);
  if (!vocab_parallel(c)) {
    const WeightMatrix& head = c.tie_embeddings ? w.embedding : w.lm_head;
    project_vocab_slice(c, w, x, rows, {0, head.out()}, deterministic, scratch, logits.data());
    return;
  }
  if (rows == 0) return;  // the same on every rank: none waits in the gather
  // Rank q's block of `gathered`: [rows][its count], blocks as long as the widest.
  std::int32_t widest = 0;
  for (std::int32_t q = 0; q < n; ++q) widest = std::max(widest, vocab_slice(vocab, q, n).count);
  const std::size_t block = std::size_t(rows) * std::size_t(widest);
  gathered.resize(block * std::size_t(n));
  const VocabSlice mine = vocab_slice(vocab, c.shard.rank, n);
  if (mine.count > 0)
    project_vocab_slice(c, w, x, rows, mine, deterministic, scratch,
                        gathered.data() + block * std::size_t(c.shard.rank));
  c.shard.all_gather(gathered);
  for (std::int32_t q = 0; q < n; ++q) {
    const VocabSlice s = vocab_slice(vocab, q, n);
    const float* from = gathered.data() + block * std::size_t(q);
    for (std::int32_t t = 0; t < rows; ++t)
      std::copy_n(from + std::size_t(t) * s.count, s.count,
                  logits.data() + std::size_t(t) * vocab + s.begin);
  }
}

}  // namespace pagedattn::engine
