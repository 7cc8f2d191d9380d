// pagedattn._core.GgufModel: a GGUF model's logits from Python, for checking
// the whole forward pass (weights, RoPE, cache, kernels) against an
// independent NumPy implementation.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"

namespace pagedattn::python {
namespace {

namespace py = pybind11;

class GgufModel {
 public:
  explicit GgufModel(const std::string& path) : model_(make_gguf_model(path)) {}

  const ModelSpec& spec() const { return model_->spec(); }

  // One sequence, teacher-forced: logits [n][vocab] of every position.
  // exact: deterministic mode, f32 activations in every product and f32
  // attention products (the accuracy tests' reference path); otherwise the
  // serving path, whose attention takes the product paths' defaults and whose
  // quantised products take int8 activations in batches of at most 8 rows
  // when int8_activations (ForwardBatch) or int8_activations_default()
  // (src/engine/gemm.h) is on, and bf16 products in larger ones when
  // bf16_products (ForwardBatch).
  py::array_t<float> logits(const std::vector<std::int32_t>& token_ids, const std::string& kv_dtype,
                            bool exact, bool int8_activations, bool bf16_products) {
    require(!token_ids.empty(), "GgufModel.logits: token_ids is empty");
    const ModelSpec& s = spec();
    KVCacheConfig k = kv_cache_config(s);
    k.page_size = 16;
    k.num_pages = (std::ssize(token_ids) + 15) / 16;
    k.kv_dtype = parse_dtype(kv_dtype);
    // exact: f32 attention products too (the bf16 paths are the defaults of
    // prefill and fp8 K/V elsewhere).
    k.attention_plan.fp8_fast_products = !exact;
    k.attention_plan.fast_prefill_products = !exact;
    PagedKVCache cache(k);
    const auto n = static_cast<std::int32_t>(token_ids.size());
    std::vector<std::int32_t> rows(token_ids.size());
    for (std::int32_t i = 0; i < n; ++i) rows[std::size_t(i)] = i;
    py::array_t<float> out({py::ssize_t(n), py::ssize_t(s.vocab_size)});
    const SeqId seq = 0;
    const std::int64_t length = n;
    cache.add_sequence(seq);
    cache.begin_forward({&seq, 1}, {&length, 1});
    {
      py::gil_scoped_release release;
      const std::lock_guard lock(mutex_);  // the model keeps its activations between calls
      model_->forward({token_ids, rows, exact, int8_activations, bf16_products}, cache,
                      {out.mutable_data(), std::size_t(n) * std::size_t(s.vocab_size)});
    }
    cache.end_forward();
    return out;
  }

 private:
  std::unique_ptr<Model> model_;
  std::mutex mutex_;
};

}  // namespace

void register_models(py::module_& m) {
  py::class_<GgufModel>(m, "GgufModel",
                        "A GGUF model's teacher-forced logits, for checking the whole forward\n"
                        "pass against an independent NumPy implementation (tests).")
      .def(py::init<const std::string&>(), py::arg("path"), "Loads the GGUF model file at path.")
      .def_property_readonly(
          "num_layers", [](const GgufModel& g) { return g.spec().num_layers; },
          "Transformer layers.")
      .def_property_readonly(
          "vocab_size", [](const GgufModel& g) { return g.spec().vocab_size; }, "Logits per token.")
      .def_property_readonly(
          "name", [](const GgufModel& g) { return g.spec().name; }, "The model's name.")
      .def("logits", &GgufModel::logits, py::arg("token_ids"), py::arg("kv_dtype") = "f32",
           py::arg("exact") = true, py::arg("int8_activations") = false,
           py::arg("bf16_products") = false,
           "Teacher-forced logits [len(token_ids)][vocab_size] of one sequence. exact "
           "(default): deterministic mode, f32 activations in every product; False: the "
           "serving path (with PAGEDATTN_INT8_ACTIVATIONS=1 in the environment, quantised "
           "weights take int8 activations in batches of at most 8 rows; so does "
           "int8_activations=True; bf16_products=True: batches of more than 8 rows on bf16 "
           "dot products where the CPU has AVX512-BF16).");
}

}  // namespace pagedattn::python
