// Mixture-of-experts MLP layers of the built-in model (GGUF qwen2moe,
// qwen3moe, deepseek2): a router picks each token's top-k experts, every
// expert multiplies the rows routed to it in one product, and each token's
// output is the weighted sum of its experts' outputs (plus a shared expert:
// qwen2moe's scaled by a sigmoid gate, DeepSeek's as it is).
//
// Routing, as Hugging Face's Qwen2MoeTopKRouter / Qwen3MoeTopKRouter /
// DeepseekV2TopkRouter / DeepseekV3TopkRouter and llama.cpp's build_moe_ffn:
// scores p = softmax(x W_router^T), or sigmoid of each logit; the choice
// ranks p (sigmoid: p + the layer's selection bias, V3's
// e_score_correction_bias); with groups, only experts of the groups_used
// best groups compete (a group's score: its best choice value under
// softmax, as DeepSeek-V2's group_limited_greedy; the sum of its best two
// under sigmoid, as V3); the num_experts_used best, in descending order
// (equal values: the lower expert index first), are weighted by their p,
// divided by the chosen p's sum with normalize_weights, times
// weights_scale.
//
// Deterministic mode: a token's result does not depend on the batch. The
// router and expert products go through linear(), whose deterministic rows
// do not depend on the other rows of a call, and the experts' outputs are
// summed per token in its top-k order, then the shared expert added.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gemm.h"
#include "engine/product_split.h"
#include "engine/stacked_matrix.h"
#include "engine/weight_matrix.h"
#include "pagedattn/llama.h"

namespace pagedattn::engine {

// One gated MLP: down(act(gate x) * up x).
struct ExpertWeights {
  StackedMatrix gate_up;  // [2 I][H]: gate rows, then up rows
  WeightMatrix down;      // [H][I]
};

// One layer's experts; empty() for a dense layer.
struct MoeLayerWeights {
  WeightMatrix router;                 // [num_experts][H]
  std::vector<ExpertWeights> experts;  // [num_experts], width expert_intermediate_size
  ExpertWeights shared;                // width shared_expert_intermediate_size, or empty
  WeightMatrix shared_gate;            // [1][H]: sigmoid(x . row) scales the shared expert
  std::vector<float> selection_bias;   // [num_experts] (sigmoid gating), or empty
  bool empty() const { return experts.empty(); }
};

// A MoE layer's dimensions (from LlamaConfig, see its MoE fields; the
// intermediate widths are this tensor-parallel shard's).
struct MoeShape {
  std::int32_t hidden = 0;
  std::int32_t num_experts = 0;
  std::int32_t num_experts_used = 0;
  std::int32_t expert_intermediate = 0;
  std::int32_t shared_intermediate = 0;  // 0: no shared expert
  bool normalize_weights = false;
  MlpActivation activation = MlpActivation::kSilu;
  ExpertGating gating = ExpertGating::kSoftmax;
  float weights_scale = 1.0f;
  std::int32_t groups = 0;       // <= 1: no groups
  std::int32_t groups_used = 0;  // groups whose experts compete (groups > 1)
  bool shared_gated = true;      // shared expert x sigmoid(x . shared_gate)
};
MoeShape moe_shape(const LlamaConfig& config);

// InvalidArgument naming the field when the config's MoE fields are
// inconsistent. Under tensor parallelism every rank routes every token and
// holds a slice of each expert's intermediate features (validate_shard
// checks that the widths split).
void validate_moe_config(const LlamaConfig& config);
// InvalidArgument naming the tensor and the layer when a shape does not
// match `shape`.
void validate_moe_weights(const MoeShape& shape, const MoeLayerWeights& weights,
                          std::int64_t layer);

// Seeded synthetic weights for `layer` (streams of their own: a dense
// config's draws are unchanged), scaled like the dense model's MLP.
MoeLayerWeights draw_moe_weights(const LlamaConfig& config, std::int32_t layer);

// Each token's experts and weights, num_experts_used per token in top-k
// order: experts[t k + j], weights[t k + j]. selection_bias: [num_experts]
// added to the scores for the choice only, or null.
void route_tokens(const MoeShape& shape, const float* router_logits, std::int32_t tokens,
                  std::int32_t* experts, float* weights, const float* selection_bias = nullptr);

// Buffers reused across calls.
struct MoeScratch {
  std::vector<float> logits, weights;   // [T][E], [T k]
  std::vector<std::int32_t> experts;    // [T k]
  std::vector<std::int32_t> first_row;  // [E + 1]: expert e's rows [first_row[e], first_row[e + 1])
  std::vector<std::int32_t> row_of_slot;  // [T k]: the grouped row of token t's j-th expert
  std::vector<float> grouped_x, gate_up, act,
      grouped_y;  // [T k][H], [T k][2 I], [T k][I], [T k][H]
  std::vector<float> shared_gate_up, shared_act, shared_y, shared_logit;
  std::vector<std::int32_t> active;           // the experts with rows, in order
  ProductSplit gate_up_split, down_split;     // the threads' shares of the experts
  std::vector<LinearScratch> thread_scratch;  // [threads]: each piece's linear()
};

// y[tokens][H] = the MoE MLP of x[tokens][H] (x already normed), in one team
// (core/team.h): the calling one, whose threads all call it with the same
// arguments (the caller validated the weights before the team started),
// else one of its own. The rows routed to an expert are gathered and
// multiplied in one product per matrix, experts with no rows are skipped,
// and every thread takes a share of all the experts' columns at once
// (ProductSplit): a decode step's few small experts keep every thread busy.
// In deterministic mode units are kColumnBlock columns, so that a token's
// result depends neither on the batch nor on the thread count.
// InvalidArgument, outside a team, when the weights do not match `shape`
// or tokens < 0.
void moe_forward(const MoeShape& shape, const MoeLayerWeights& weights, const float* x,
                 std::int32_t tokens, float* y, bool deterministic, MoeScratch& scratch,
                 LinearScratch& linear_scratch);

}  // namespace pagedattn::engine
