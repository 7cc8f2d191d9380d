// Helpers the GGUF model tests share: a qwen2moe / qwen3moe file, a file's
// F32 twin, teacher-forced logits of one sequence, and the comparison of
// the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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

// The file `metadata_source` wrote, with every tensor of `file` as F32 (its
// dequantised values): the reference a quantised load must match.
std::vector<std::byte> as_f32(const GgufWriter& metadata_source, const GgufFile& file);

// Teacher-forced logits of `tokens` as one sequence on f32 K/V:
// [tokens.size()][vocab_size].
std::vector<float> teacher_forced_logits(Model& model, const std::vector<std::int32_t>& tokens);

// The file `w` writes, loaded with its weights as stored (quantised in
// place), gives the teacher-forced logits of its F32 twin (as_f32) within
// 1e-4 (relative above 1), every one finite (gtest failures otherwise).
void expect_same_logits_as_f32_copy(const GgufWriter& w, const std::vector<std::int32_t>& tokens = {
                                                             1, 5, 3, 3, 9, 0, 7});

}  // namespace pagedattn::test
