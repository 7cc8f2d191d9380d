// Helpers the GGUF model tests share: a qwen2moe / qwen3moe file, a
// deepseek2 file, a file's F32 twin, teacher-forced logits of one
// sequence, and the comparison of the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf_writer.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model.h"

namespace pagedattn::test {

// The experts of moe_model's file.
struct TinyExperts {
  std::uint64_t hidden = 64, experts = 4, expert_ff = 32, shared_ff = 64;
  std::uint32_t used = 2;
};

// A two-layer qwen2moe or qwen3moe file: tiny_model's attention and norms
// (its dense MLP tensors stay unread; qwen3moe with q/k norms, qwen2moe
// with biases and a gated shared expert) plus the experts, gate / up / down
// of different in-place types (Q4_0, Q8_0, Q4_1) and a F32 router.
GgufWriter moe_model(const std::string& arch, TinyExperts e = {});

// The dimensions of deepseek_model's files.
namespace tiny_deepseek {
inline constexpr std::uint64_t kHidden = 64, kHeads = 4, kLatent = 32, kNope = 16, kRope = 8,
                               kV = 16, kFf = 96, kExperts = 8, kExpertFf = 32, kVocab = 10;
}

// What deepseek_model writes.
struct DeepseekForm {
  bool split = true;                  // attn_k_b + attn_v_b (else attn_kv_b)
  std::uint32_t q_lora_rank = 0;      // 0: attn_q
  bool sigmoid = false;               // V3 routing: sigmoid, exp_probs_b, groups, renormalised
  bool quantised = true;              // Q8_0 / Q4_0 where the row lengths allow
  bool layer1_up_projections = true;  // false: layer 1 has neither form
  // Integer keys (suffixes after "deepseek2.") written with other values.
  std::vector<std::pair<std::string, std::uint32_t>> overrides = {};
};

// A two-layer deepseek2 file (tiny_deepseek's shapes) with keys as
// llama.cpp's converter writes them for the form: latent attention, a
// leading dense layer, then 8 routed experts (2 used) and a shared one.
GgufWriter deepseek_model(const DeepseekForm& form);

// The file `metadata_source` wrote, with every tensor of `file` as F32 (its
// dequantised values): the reference a quantised load must match.
std::vector<std::byte> as_f32(const GgufWriter& metadata_source, const GgufFile& file);

// Teacher-forced logits of `tokens` as one sequence on f32 K/V, in one step
// (ForwardBatch::deterministic as given): [tokens.size()][vocab_size].
std::vector<float> teacher_forced_logits(Model& model, const std::vector<std::int32_t>& tokens,
                                         bool deterministic = false);

// The file `w` writes, loaded with its weights as stored (quantised in
// place), gives the teacher-forced logits of its F32 twin (as_f32) within
// 1e-4 (relative above 1), every one finite (gtest failures otherwise).
void expect_same_logits_as_f32_copy(const GgufWriter& w, const std::vector<std::int32_t>& tokens = {
                                                             1, 5, 3, 3, 9, 0, 7});

}  // namespace pagedattn::test
