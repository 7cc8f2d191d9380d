// Zero-copy NumPy views of a step's plan (pagedattn.BatchPlan) and of a
// layer's page storage (pagedattn.LayerStorage), for users' own kernels and
// for pagedattn.ops / other libraries.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "pagedattn/kv_cache.h"
#include "type_hints.h"

namespace pagedattn::python {

namespace py = pybind11;

// A BatchPlan owned by Python (pagedattn.BatchPlan): a snapshot of the cache's
// plan taken when the step began. Its arrays are read-only views whose base
// is this object, so they never dangle (after end_forward they describe the
// finished step).
using PlanSnapshot = std::shared_ptr<BatchPlan>;

// pagedattn.LayerStorage: one layer's storage views.
struct LayerStorage {
  // Page arrays (see the class doc).
  py::array k, v;
  // int8: [num_pages, Hkv, page_size] float32 views, else None.
  OptionalFloat32Array k_scales, v_scales;
  // fp8: per-head scales [Hkv] (copies), else None.
  OptionalFloat32Array k_head_scales, v_head_scales;
  float k_scale = 1.0f, v_scale = 1.0f;
  std::string dtype, layout;
  std::int32_t page_size = 0;
};

// The K/V pages (and int8 scales) of one layer as writable views whose base
// is `owner` (the KVCache), shaped per layout (see LayerStorage's doc).
LayerStorage layer_storage_views(const PagedKVStorage& storage, const py::object& owner);

// Registers pagedattn.BatchPlan and pagedattn.LayerStorage.
void register_plan_views(py::module_& m);

}  // namespace pagedattn::python
