// Zero-copy NumPy views of a step's plan (pagedattn.BatchPlan) and of a
// layer's page storage (pagedattn.LayerStorage), for users' own kernels and
// for pagedattn.ops / other libraries.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "pagedattn/kv_cache.h"

namespace pagedattn::python {

namespace py = pybind11;

// A BatchPlan owned by Python: a snapshot of the cache's plan taken when the
// step began. Its arrays are read-only views whose base is this object, so
// they never dangle (after end_forward they describe the finished step).
py::object plan_object(std::shared_ptr<const BatchPlan> plan);

// The K/V pages (and int8 scales) of one layer as writable views whose base
// is `owner` (the KVCache), shaped per layout (see LayerStorage's doc).
py::object layer_storage_object(const PagedKVStorage& storage, py::object owner);

// Registers pagedattn.BatchPlan and pagedattn.LayerStorage.
void register_plan_views(py::module_& m);

}  // namespace pagedattn::python
