#include "plan_views.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "array_conversion.h"
#include "pagedattn/errors.h"

namespace pagedattn::python {
namespace {

// A read-only 1-D view of `values`, kept alive by `base`.
template <typename T>
py::array_t<T> readonly_view(const std::vector<T>& values, py::handle base) {
  py::array_t<T> view({static_cast<py::ssize_t>(values.size())},
                      {static_cast<py::ssize_t>(sizeof(T))}, values.data(), base);
  view.attr("setflags")(py::arg("write") = false);
  return view;
}

// A property of BatchPlan returning the view of one of its vectors.
template <typename T>
auto plan_array(std::vector<T> BatchPlan::*member) {
  return [member](py::object self) {
    const auto& plan = self.cast<const BatchPlan&>();
    return readonly_view(plan.*member, self);
  };
}

// vLLM / torch_xla block table: row b holds sequence b's pages, padded
// with `pad` to the longest row (a new array).
py::array_t<std::int32_t> block_table(const BatchPlan& plan, std::int32_t pad) {
  std::int32_t width = 0;
  for (std::int32_t b = 0; b < plan.batch_size(); ++b)
    width = std::max(width, plan.kv_indptr[b + 1] - plan.kv_indptr[b]);
  py::array_t<std::int32_t> table({py::ssize_t{plan.batch_size()}, py::ssize_t{width}});
  auto t = table.mutable_unchecked<2>();
  for (std::int32_t b = 0; b < plan.batch_size(); ++b)
    for (std::int32_t i = 0; i < width; ++i) {
      const std::int32_t at = plan.kv_indptr[b] + i;
      t(b, i) = at < plan.kv_indptr[b + 1] ? plan.kv_indices[at] : pad;
    }
  return table;
}

// A writable view of `data` with element `shape` and `strides`, kept alive by `owner`.
py::array storage_view(void* data, const py::object& dtype, std::vector<py::ssize_t> shape,
                       std::vector<py::ssize_t> element_strides, const py::object& owner) {
  const py::dtype d = py::dtype::from_args(dtype);
  for (auto& s : element_strides) s *= d.itemsize();
  return py::array(d, std::move(shape), std::move(element_strides), data, owner);
}

OptionalFloat32Array head_scales(const float* scales, std::int32_t heads) {
  if (scales == nullptr) return py::none();
  return py::array_t<float>(heads, scales);  // a copy: the scales are configuration
}

constexpr const char* kPlanDoc =
    R"doc(The plan of one step (returned by KVCache.begin_forward and KVCache.plan).

A snapshot of the cache's C++ BatchPlan taken when the step began. Every
array is a read-only NumPy view of the snapshot (no copy per access; the
arrays keep this object alive, so they never dangle). After end_forward or
cancel_forward the arrays still read the finished step's values; a new
step has a new BatchPlan. Each array exports DLPack (torch.from_dlpack,
numpy.from_dlpack) without a copy. step_id names the step: pass the plan as
step= to KVCache.attention and the other per-step calls to have them refuse
a step that replaced this one.

FlashInfer conventions (B = batch_size, T = num_tokens, CSR page table):
    seq_ids          int64 [B]      the caller's order
    qo_indptr        int32 [B + 1]  offsets of each sequence's new tokens
    kv_indptr        int32 [B + 1]  offsets into kv_indices
    kv_indices       int32 [kv_indptr[B]] page ids, logical order
    kv_last_page_len int32 [B]      used slots of the last page (0 if none)
    kv_lens          int32 [B]      keys after the append (vLLM seq_lens)
    positions        int32 [T]      position of each new token
    slot_mapping     int64 [T]      vLLM: page * page_size + offset (-1: none)
    kv_sink_lens, kv_gap_lens int32 [B]  sliding windows with sinks: key j
                     sits at slot j (j < sink) or j + gap (see has_gaps)
    tree_begin, tree_node_indptr [B], [B + 1]; tree_enter, tree_exit,
    tree_positions [nodes]: the token-tree mask (see has_tree)
block_table(pad=0) gives the padded [B, max_pages] int32 table of vLLM and
torch_xla (a new array).)doc";

constexpr const char* kStorageDoc =
    R"doc(Zero-copy views of one layer's page storage (KVCache.layer_storage).

    layout "HND": k [num_pages, Hkv, page_size, D], v [num_pages, Hkv, page_size, Dv]
    layout "NHD": k [num_pages, page_size, Hkv, D], v [num_pages, page_size, Hkv, Dv]

dtype float32 / float16 / int8 as such; bfloat16 and float8 as ml_dtypes
arrays (raw uint16 / uint8 bits without ml_dtypes). Dequantised value =
stored * scale: int8 has k_scales / v_scales [num_pages, Hkv, page_size]
float32 (one per token and head; strided views: a page's scales sit in its
K page, after its K block); fp8 has k_scale / v_scale, or per-head
k_head_scales / v_head_scales [Hkv] (copies). The arrays are writable views
of the cache's memory and keep the cache alive. They bypass the cache's
lock: do not write pages other sequences hold, and do not use them while
another thread runs a call on the cache. A step whose K/V you write
yourself (through plan.slot_mapping) must be declared with
KVCache.mark_layer_appended(layer) before end_forward.)doc";

}  // namespace

LayerStorage layer_storage_views(const PagedKVStorage& s, const py::object& owner) {
  const py::object dtype = storage_numpy_dtype(s.dtype);
  const bool hnd = s.layout == KVLayout::kHND;
  const py::ssize_t pages = s.num_pages, heads = s.num_kv_heads, slots = s.page_size;
  const auto shape = [&](py::ssize_t dim) {
    return hnd ? std::vector<py::ssize_t>{pages, heads, slots, dim}
               : std::vector<py::ssize_t>{pages, slots, heads, dim};
  };
  const auto strides = [&](std::int64_t page, std::int64_t head, std::int64_t token) {
    return hnd ? std::vector<py::ssize_t>{page, head, token, 1}
               : std::vector<py::ssize_t>{page, token, head, 1};
  };
  // int8: [num_pages, Hkv, page_size] float32 views, else None.
  const auto token_scales = [&](float* data) -> OptionalFloat32Array {
    if (s.dtype != DType::kINT8) return py::none();
    return storage_view(data, py::dtype::of<float>(), {pages, heads, slots},
                        {static_cast<py::ssize_t>(s.token_scale_page_step()), slots, 1}, owner);
  };
  return LayerStorage{
      .k = storage_view(s.k_data, dtype, shape(s.head_dim),
                        strides(s.k_page_stride, s.k_head_stride, s.k_token_stride), owner),
      .v = storage_view(s.v_data, dtype, shape(s.v_head_dim),
                        strides(s.v_page_stride, s.v_head_stride, s.v_token_stride), owner),
      .k_scales = token_scales(s.k_token_scales),
      .v_scales = token_scales(s.v_token_scales),
      .k_head_scales = head_scales(s.k_head_scales, s.num_kv_heads),
      .v_head_scales = head_scales(s.v_head_scales, s.num_kv_heads),
      .k_scale = s.k_scale,
      .v_scale = s.v_scale,
      .dtype = std::string(dtype_name(s.dtype)),
      .layout = hnd ? "HND" : "NHD",
      .page_size = s.page_size,
  };
}

void register_plan_views(py::module_& m) {
  py::class_<BatchPlan, std::shared_ptr<BatchPlan>>(m, "BatchPlan", kPlanDoc)
      .def_property_readonly("batch_size", &BatchPlan::batch_size, "Sequences in the step (B).")
      .def_property_readonly("num_tokens", &BatchPlan::num_tokens, "New tokens in the step (T).")
      .def_readonly("page_size", &BatchPlan::page_size, "Tokens per page.")
      .def_readonly("step_id", &BatchPlan::step_id,
                    "The step's identity (1, 2, ... per cache): per-step calls given this\n"
                    "plan as step= are refused once another step replaced it.")
      .def_readonly("has_gaps", &BatchPlan::has_gaps,
                    "Some sequence has a sliding-window gap (kv_gap_lens != 0): its keys are\n"
                    "not the first kv_lens slots of its pages.")
      .def_readonly("has_tree", &BatchPlan::has_tree,
                    "Some sequence has an open token tree (the tree_* arrays are filled).")
      .def_property_readonly("seq_ids", plan_array(&BatchPlan::seq_ids), "int64 [B]")
      .def_property_readonly("qo_indptr", plan_array(&BatchPlan::qo_indptr), "int32 [B + 1]")
      .def_property_readonly("kv_indptr", plan_array(&BatchPlan::kv_indptr), "int32 [B + 1]")
      .def_property_readonly("kv_indices", plan_array(&BatchPlan::kv_indices),
                             "int32 [kv_indptr[B]] page ids")
      .def_property_readonly("kv_last_page_len", plan_array(&BatchPlan::kv_last_page_len),
                             "int32 [B]")
      .def_property_readonly("kv_lens", plan_array(&BatchPlan::kv_lens), "int32 [B]")
      .def_property_readonly("kv_sink_lens", plan_array(&BatchPlan::kv_sink_lens), "int32 [B]")
      .def_property_readonly("kv_gap_lens", plan_array(&BatchPlan::kv_gap_lens), "int32 [B]")
      .def_property_readonly("positions", plan_array(&BatchPlan::positions), "int32 [T]")
      .def_property_readonly("slot_mapping", plan_array(&BatchPlan::slot_mapping), "int64 [T]")
      .def_property_readonly("tree_begin", plan_array(&BatchPlan::tree_begin), "int32 [B]")
      .def_property_readonly("tree_node_indptr", plan_array(&BatchPlan::tree_node_indptr),
                             "int32 [B + 1]")
      .def_property_readonly("tree_enter", plan_array(&BatchPlan::tree_enter), "int32 [nodes]")
      .def_property_readonly("tree_exit", plan_array(&BatchPlan::tree_exit), "int32 [nodes]")
      .def_property_readonly("tree_positions", plan_array(&BatchPlan::tree_positions),
                             "int32 [nodes]")
      .def("block_table", &block_table, py::arg("pad") = 0,
           "block_table(pad=0) -> int32 [B, max_pages]: row b = sequence b's pages, padded.")
      .def("__repr__", [](const BatchPlan& p) {
        return detail::concat("BatchPlan(batch_size=", p.batch_size(),
                              ", num_tokens=", p.num_tokens(), ", pages=", p.kv_indices.size(),
                              ")");
      });

  py::class_<LayerStorage>(m, "LayerStorage", kStorageDoc)
      .def_readonly("k", &LayerStorage::k, "K pages (writable view).")
      .def_readonly("v", &LayerStorage::v, "V pages (writable view).")
      .def_readonly("k_scales", &LayerStorage::k_scales, "int8: K scales per token and head.")
      .def_readonly("v_scales", &LayerStorage::v_scales, "int8: V scales per token and head.")
      .def_readonly("k_head_scales", &LayerStorage::k_head_scales,
                    "fp8: per-head K scales or None.")
      .def_readonly("v_head_scales", &LayerStorage::v_head_scales,
                    "fp8: per-head V scales or None.")
      .def_readonly("k_scale", &LayerStorage::k_scale, "fp8: per-tensor K scale (1 otherwise).")
      .def_readonly("v_scale", &LayerStorage::v_scale, "fp8: per-tensor V scale (1 otherwise).")
      .def_readonly("dtype", &LayerStorage::dtype, "Storage dtype name.")
      .def_readonly("layout", &LayerStorage::layout, "\"HND\" or \"NHD\".")
      .def_readonly("page_size", &LayerStorage::page_size, "Tokens per page.");
}

}  // namespace pagedattn::python
