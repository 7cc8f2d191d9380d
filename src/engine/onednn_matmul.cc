#include "onednn_matmul.h"

#include "core/env_switch.h"

#if PAGEDATTN_HAS_ONEDNN
#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <utility>
#include <vector>

#include "pagedattn/errors.h"
#endif

namespace pagedattn::engine {
namespace {
core::EnvSwitch onednn_switch("PAGEDATTN_ONEDNN", true);
}  // namespace

void set_onednn_products(bool on) {
  onednn_switch.set(on);
}

#if PAGEDATTN_HAS_ONEDNN
namespace {

using dnnl::memory;

struct MatmulShape {
  std::int32_t rows, cols, in, ldy;
  bool accumulate;
  memory::data_type inputs;  // x's and w's: f32 or bf16
  bool operator==(const MatmulShape&) const = default;
};

// One shape's matmul and its memory descriptions; the buffers are bound at
// each call. An empty matmul: oneDNN made no primitive for the shape, and
// is not asked again while the shape is kept.
struct Matmul {
  MatmulShape shape;
  memory::desc x, w, y;
  dnnl::matmul matmul;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

Matmul make_matmul(const MatmulShape& s) {
  Matmul p{s,
           memory::desc({s.rows, s.in}, s.inputs, memory::dims{s.in, 1}),
           // w[cols][in] row-major is the in x cols matrix with strides {1, in}.
           memory::desc({s.in, s.cols}, s.inputs, memory::dims{1, s.in}),
           memory::desc({s.rows, s.cols}, memory::data_type::f32, memory::dims{s.ldy, 1}),
           {}};
  dnnl::primitive_attr attr;
  if (s.accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  p.matmul = dnnl::matmul(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(p.x, p.w, p.y), attr, cpu_engine()));
  return p;
}

// The most recently used shapes first: a step's prefill rows change from
// step to step, so the oldest shape goes.
Matmul& matmul_for(const MatmulShape& s) {
  thread_local std::vector<Matmul> kept;
  auto it = std::find_if(kept.begin(), kept.end(), [&](const Matmul& p) { return p.shape == s; });
  if (it == kept.end()) {
    Matmul made{s, {}, {}, {}, {}};
    try {
      made = make_matmul(s);
    } catch (const dnnl::error&) {  // kept empty: the caller's kernel takes the shape
    }
    if (kept.size() == kOneDnnShapesKept) kept.pop_back();
    kept.insert(kept.begin(), std::move(made));
  } else if (it != kept.begin()) {
    std::rotate(kept.begin(), it, it + 1);
  }
  return kept.front();
}

// oneDNN threads a call by omp_get_max_threads() outside a parallel region:
// the callers split the work themselves, so each call runs on its thread.
class OneOmpThread {
 public:
  OneOmpThread() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneOmpThread() { omp_set_num_threads(previous_); }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int previous_;
};

}  // namespace

bool onednn_products() {
  return onednn_switch.on();
}

// oneDNN's names of the instruction sets it dispatches to.
constexpr std::pair<dnnl::cpu_isa, const char*> kIsaNames[] = {
    {dnnl::cpu_isa::sse41, "sse41"},
    {dnnl::cpu_isa::avx, "avx"},
    {dnnl::cpu_isa::avx2, "avx2"},
    {dnnl::cpu_isa::avx2_vnni, "avx2_vnni"},
    {dnnl::cpu_isa::avx512_core, "avx512_core"},
    {dnnl::cpu_isa::avx512_core_vnni, "avx512_core_vnni"},
    {dnnl::cpu_isa::avx512_core_bf16, "avx512_core_bf16"},
    {dnnl::cpu_isa::avx512_core_amx, "avx512_core_amx"},
};

std::string onednn_kernels() {
  if (!onednn_products()) return "";
  const dnnl::cpu_isa here = dnnl::get_effective_cpu_isa();
  const char* isa = "other";
  for (const auto& [value, name] : kIsaNames)
    if (value == here) isa = name;
  const dnnl::version_t* v = dnnl::version();
  return detail::concat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (", isa, ")");
}

bool onednn_bf16_products() {
  if (!onednn_products()) return false;
  static const bool bf16 = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return bf16;
}

namespace {

bool run_matmul(const MatmulShape& shape, const void* x, const void* w, float* y) noexcept {
  OneOmpThread one;
  try {
    Matmul& p = matmul_for(shape);
    if (!p.matmul) return false;
    thread_local dnnl::stream stream(cpu_engine());
    dnnl::engine& engine = cpu_engine();
    p.matmul.execute(stream, {{DNNL_ARG_SRC, memory(p.x, engine, const_cast<void*>(x))},
                              {DNNL_ARG_WEIGHTS, memory(p.w, engine, const_cast<void*>(w))},
                              {DNNL_ARG_DST, memory(p.y, engine, y)}});
    stream.wait();
    return true;
  } catch (...) {  // no memory for the primitive or its scratch
    return false;
  }
}

}  // namespace

bool onednn_sgemm(const float* x, std::int32_t rows, std::int32_t in, const float* w,
                  std::int32_t cols, float* y, std::int32_t ldy, bool accumulate) noexcept {
  return onednn_products() &&
         run_matmul({rows, cols, in, ldy, accumulate, memory::data_type::f32}, x, w, y);
}

bool onednn_bf16_gemm(const std::uint16_t* x, std::int32_t rows, std::int32_t in,
                      const std::uint16_t* w, std::int32_t cols, float* y, std::int32_t ldy,
                      bool accumulate) noexcept {
  return onednn_bf16_products() &&
         run_matmul({rows, cols, in, ldy, accumulate, memory::data_type::bf16}, x, w, y);
}

#else  // a build without oneDNN: every product stays on OpenBLAS

bool onednn_products() {
  return false;
}

std::string onednn_kernels() {
  return "";
}

bool onednn_bf16_products() {
  return false;
}

bool onednn_sgemm(const float*, std::int32_t, std::int32_t, const float*, std::int32_t, float*,
                  std::int32_t, bool) noexcept {
  return false;
}

bool onednn_bf16_gemm(const std::uint16_t*, std::int32_t, std::int32_t, const std::uint16_t*,
                      std::int32_t, float*, std::int32_t, bool) noexcept {
  return false;
}

#endif

}  // namespace pagedattn::engine
