// pagedattn.GgufFile and pagedattn.gguf_dequantize: the GGUF reader and the
// weight dequantisation (include/pagedattn/gguf.h, gguf_types.h), mainly for
// parity tests against the `gguf` package and for inspecting model files.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"

namespace pagedattn::python {
namespace py = pybind11;
namespace {

// GGUF strings are UTF-8; undecodable bytes survive as surrogates.
py::str to_str(std::string_view s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::object scalar_to_python(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kBool:
      return py::bool_(v.uint_value != 0);
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
      return py::float_(v.float_value);
    case GgufValueType::kString:
      return to_str(v.string_value);
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
      return py::int_(v.int_value);
    default:
      return py::int_(v.uint_value);
  }
}

// A metadata value as Python: int / float / bool / str, lists for arrays
// (numeric arrays through NumPy's element type, then tolist()).
py::object value_to_python(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return scalar_to_python(v);
  py::list out;
  if (!v.items.empty() || v.element_type == GgufValueType::kString ||
      v.element_type == GgufValueType::kArray) {
    for (const GgufValue& item : v.items) out.append(value_to_python(item));
    return out;
  }
  static const char* const kNumpyTypes[] = {"<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<f4",
                                            "|b1", "",    "",    "<u8", "<i8", "<f8"};
  const py::dtype dtype(kNumpyTypes[static_cast<int>(v.element_type)]);
  const py::array array(dtype, {static_cast<py::ssize_t>(v.count)}, v.elements);
  return array.attr("tolist")();
}

py::array_t<float> dequantize_to_array(GgufType type, const std::byte* data, std::int64_t n,
                                       std::vector<py::ssize_t> shape) {
  py::array_t<float> out(shape);
  const std::int64_t row = shape.empty() ? n : shape.back();
  const std::int64_t row_bytes = gguf_row_bytes(type, row);
  float* dst = out.mutable_data();
  for (std::int64_t r = 0; row > 0 && r < n / row; ++r)
    dequantize_row(type, data + r * row_bytes, dst + r * row, row);
  return out;
}

// Dicts of values of several types are typed dict[str, Any] (as a GGUF
// metadata value is Any): callers know each key's type.
using InfoDict = py::typing::Dict<py::str, py::object>;

InfoDict tensor_to_dict(const GgufTensor& t) {
  InfoDict d;
  d["name"] = to_str(t.name);
  d["type"] = std::string(gguf_type_info(t.type).name);
  d["dims"] = t.dims;
  d["offset"] = t.offset;
  d["nbytes"] = t.nbytes;
  return d;
}

}  // namespace

void register_gguf(py::module_& m) {
  m.def(
      "gguf_dequantize",
      [](const std::string& type_name, py::buffer data, std::int64_t n) {
        const GgufType type = parse_gguf_type(type_name);
        const py::buffer_info info = data.request();
        const std::int64_t expected = gguf_row_bytes(type, n);
        py::ssize_t stride = info.itemsize;
        for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
          require(info.shape[d] <= 1 || info.strides[d] == stride,
                  "gguf_dequantize: data must be C-contiguous");
          stride *= info.shape[d];
        }
        const std::int64_t size = info.size * info.itemsize;
        require(size == expected, "gguf_dequantize: data has ", size, " bytes, ", n, " ", type_name,
                " elements take ", expected);
        return dequantize_to_array(type, static_cast<const std::byte*>(info.ptr), n, {n});
      },
      py::arg("type"), py::arg("data"), py::arg("n"),
      "Dequantises n elements of a ggml type ('Q4_K', 'F16', ...) from raw bytes to float32.");

  py::class_<GgufFile>(m, "GgufFile",
                       "A GGUF model file, memory mapped and validated (include/pagedattn/gguf.h).")
      .def(py::init([](const std::string& path) { return GgufFile::open(path); }), py::arg("path"))
      .def_property_readonly("version", &GgufFile::version, "GGUF format version (2 or 3).")
      .def_property_readonly("alignment", &GgufFile::alignment, "Tensor data alignment in bytes.")
      .def_property_readonly("data_offset", &GgufFile::data_offset,
                             "Byte offset of the tensor data section.")
      .def(
          "keys",
          [](const GgufFile& f) {
            py::typing::List<py::str> keys;
            for (std::string_view k : f.keys()) keys.append(to_str(k));
            return keys;
          },
          "Metadata keys in file order.")
      .def(
          "get",
          [](const GgufFile& f, const std::string& key) { return value_to_python(f.get(key)); },
          py::arg("key"), "The value of a metadata key (int, float, bool, str or list).")
      .def(
          "value_type",
          [](const GgufFile& f, const std::string& key) { return f.get(key).type_name(); },
          py::arg("key"), "GGUF type name of a metadata key's value (e.g. \"uint32\", \"array\").")
      .def(
          "tensors",
          [](const GgufFile& f) {
            py::typing::List<InfoDict> out;
            for (const GgufTensor& t : f.tensors()) out.append(tensor_to_dict(t));
            return out;
          },
          "Tensor infos in file order: dicts of name, type, dims (ggml order), offset, nbytes.")
      .def(
          "tensor_bytes",
          [](const GgufFile& f, const std::string& name) {
            const GgufTensor& t = f.tensor(name);
            return py::bytes(reinterpret_cast<const char*>(t.data),
                             static_cast<std::size_t>(t.nbytes));
          },
          py::arg("name"), "A tensor's raw bytes as stored (ggml blocks for quantised types).")
      .def(
          "dequantize",
          [](const GgufFile& f, const std::string& name) {
            const GgufTensor& t = f.tensor(name);
            require<Unsupported>(gguf_type_info(t.type).dequantizable, "gguf ", f.source_name(),
                                 ": tensor '", name, "' has type ", gguf_type_info(t.type).name,
                                 ", which pagedattn cannot dequantise");
            std::vector<py::ssize_t> shape(t.dims.rbegin(), t.dims.rend());
            return dequantize_to_array(t.type, t.data, t.element_count(), shape);
          },
          py::arg("name"), "The tensor as float32, shape = dims reversed (NumPy order).")
      .def(
          "model_config",
          [](const GgufFile& f) {
            const GgufModelConfig c = read_model_config(f);
            InfoDict d;
            d["arch"] = c.arch_name;
            d["num_layers"] = c.num_layers;
            d["hidden_size"] = c.hidden_size;
            d["intermediate_size"] = c.intermediate_size;
            d["num_qo_heads"] = c.num_qo_heads;
            d["num_kv_heads"] = c.num_kv_heads;
            d["head_dim"] = c.head_dim;
            d["vocab_size"] = c.vocab_size;
            d["context_length"] = c.context_length;
            d["rope_theta"] = c.rope_theta;
            d["rope_layout"] = c.rope_layout == GgufRopeLayout::kNeox ? "neox" : "interleaved";
            d["rms_norm_eps"] = c.rms_norm_eps;
            d["tie_embeddings"] = c.tie_embeddings;
            d["bos_token_id"] = c.bos_token_id;
            d["eos_token_id"] = c.eos_token_id;
            d["rotary_dim"] = c.rotary_dim;
            d["rope_scaling"] = c.rope_scaling.type;
            d["rope_scaling_factor"] = c.rope_scaling.factor;
            d["rope_freq_factors"] = !c.rope_scaling.freq_factors_tensor.empty();
            d["layer_windows"] = c.layer_windows;
            d["rope_theta_windowed"] = c.rope_theta_windowed;
            d["attention_scale"] = c.attention_scale;
            d["attention_softcap"] = c.attention_softcap;
            d["final_softcap"] = c.final_softcap;
            d["embedding_scale"] = c.embedding_scale;
            d["activation"] = c.activation == GgufActivation::kGeluTanh ? "gelu_tanh" : "silu";
            d["num_experts"] = c.num_experts;  // 0: dense MLPs
            d["num_experts_used"] = c.num_experts_used;
            d["expert_intermediate_size"] = c.expert_intermediate_size;
            d["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
            d["normalize_expert_weights"] = c.normalize_expert_weights;
            d["expert_gating"] =
                c.expert_gating == GgufExpertGating::kSigmoid ? "sigmoid" : "softmax";
            d["expert_weights_scale"] = c.expert_weights_scale;
            d["expert_groups"] = c.expert_groups;
            d["expert_groups_used"] = c.expert_groups_used;
            d["shared_expert_gated"] = c.shared_expert_gated;
            d["leading_dense_layers"] = c.leading_dense_layers;
            d["q_lora_rank"] = c.q_lora_rank;  // latent attention (deepseek2); 0 elsewhere
            d["kv_lora_rank"] = c.kv_lora_rank;
            d["qk_nope_head_dim"] = c.qk_nope_head_dim;
            d["v_head_dim"] = c.v_head_dim;
            return d;
          },
          "The model hyperparameters pagedattn reads (arch, layers, heads, RoPE, ...) as a dict.");
}

}  // namespace pagedattn::python
