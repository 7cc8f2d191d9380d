// The gated MLP activation of the dense and the expert MLPs, vectorised.
#pragma once

#include <cstdint>

#include "pagedattn/llama.h"

namespace pagedattn::engine {

// act [rows][width] = act(gate) * up, from gate_up [rows][2 width] (each row
// its gate half, then its up half). act is SiLU (g / (1 + e^-g)) or the
// tanh-approximated GELU (PyTorch's gelu(approximate="tanh")); a NaN gate
// or up gives NaN. Large inputs spread over OpenMP threads.
void gated_activation(const float* gate_up, std::int32_t rows, std::int32_t width,
                      MlpActivation activation, float* act);

}  // namespace pagedattn::engine
