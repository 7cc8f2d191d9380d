// Large products on oneDNN's matmul (Debian libdnnl-dev), where the build
// has it: prefill's and large batches' f32 products, which otherwise call
// OpenBLAS's sgemm, and the bf16 batch products (--bf16-products), which
// otherwise run dot_tiles. oneDNN's JIT kernels run them nearer the FMA
// limit, on AMX tiles where the CPU has them (docs/benchmarks.md, "oneDNN's
// matmul against the model's products").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedattn::engine {

// Whether this build has oneDNN and the process may use it (PAGEDATTN_ONEDNN=0
// in the environment, or set_onednn_products(false), turns it off).
bool onednn_products();
void set_onednn_products(bool on);
// onednn_products() and oneDNN has bf16 kernels for this CPU (AVX512-BF16 or
// AMX-BF16): onednn_bf16_gemm runs there.
bool onednn_bf16_products();

// "oneDNN <version> (<the instructions its kernels use here>)", or "" where
// !onednn_products().
std::string onednn_kernels();

// y[rows][cols] (+)= x[rows][in] w[cols][in]^T on the calling thread alone
// (inside or outside a parallel region), row strides in, in and ldy, where
// onednn_products(); false, with y untouched, where not or where oneDNN
// could not make a primitive for the shape (the caller then uses another
// kernel). Primitives are made once per shape and kept per thread, the most
// recent kOneDnnShapesKept. The arguments are the caller's (gemm.cc), not
// checked again.
inline constexpr std::size_t kOneDnnShapesKept = 32;
bool onednn_sgemm(const float* x, std::int32_t rows, std::int32_t in, const float* w,
                  std::int32_t cols, float* y, std::int32_t ldy, bool accumulate) noexcept;
// The same with x and w as bf16 bits (f32 sums, f32 y), where
// onednn_bf16_products().
bool onednn_bf16_gemm(const std::uint16_t* x, std::int32_t rows, std::int32_t in,
                      const std::uint16_t* w, std::int32_t cols, float* y, std::int32_t ldy,
                      bool accumulate) noexcept;

}  // namespace pagedattn::engine
