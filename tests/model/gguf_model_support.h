// Helpers the GGUF model tests share: a file's F32 twin, teacher-forced
// logits of one sequence, and the comparison of the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/gguf_writer.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model.h"

namespace pagedattn::test {

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
