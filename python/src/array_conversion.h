// Python arrays <-> the library's tensor views, without copies. Accepts NumPy
// arrays, objects with the buffer protocol and DLPack producers
// (`__dlpack__`: torch, JAX, ... CPU tensors, bfloat16 and float8 included);
// the returned views point into the caller's memory, which the `Array`
// keeps alive. Shapes, strides and contiguity are left to the C++ calls,
// which check them and name the argument; only what a view cannot express
// (an unknown dtype, rank > 4, a read-only array that is written) is refused
// here.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/ops/tensor.h"

namespace pagedattn::python {

namespace py = pybind11;

// A NumPy array over the caller's memory: `obj` as is when it is an
// ndarray, else an array over its DLPack capsule (read here rather than by
// numpy.from_dlpack, which refuses bfloat16 and float8: those become
// ml_dtypes arrays, or raw bits tagged with their dtype, see dtype_tag) or
// numpy.asarray(obj) (buffer protocol). The producer's strides are kept.
// TypeError naming `name` for anything else, or for memory not on the CPU.
py::array as_array(py::handle obj, const char* name);

// A DLPack capsule consumed as the protocol wants (renamed "used_..."): its
// tensor, whether the producer marked it read-only, and a capsule that
// releases the managed tensor when collected. TypeError naming `name` for
// anything but a DLPack 1.x or pre-1.0 capsule.
struct ConsumedDlpack {
  const void* tensor = nullptr;  // a dlpack::Tensor (python/src/dlpack_abi.h)
  bool read_only = false;
  py::capsule owner;
};
ConsumedDlpack consume_dlpack_capsule(const py::object& capsule, const std::string& name);

// The library dtype a raw-bits array read from DLPack without ml_dtypes is
// tagged with (NumPy dtype metadata), if any.
std::optional<DType> dtype_tag(const py::array& array);

// The library dtype of `array`: float32, float16, the ml_dtypes types
// bfloat16 / float8_e4m3fn / float8_e5m2, tagged raw bits (dtype_tag), or
// raw uint16 / uint8 / int8 bits read as `raw_dtype` ("bfloat16",
// "float8_e4m3fn", "float8_e5m2", "int8"), which must then be given and
// match the item size. TypeError otherwise.
DType dtype_of(const py::array& array, const char* name,
               const std::optional<std::string>& raw_dtype = std::nullopt);

// Element shape and strides of `array` (rank <= max_rank, byte strides that
// are whole elements), as a float tensor view.
ops::TensorView tensor_view(const py::array& array, DType dtype, const char* name,
                            bool writable = false);
// The same for any array-like: as_array + dtype_of + tensor_view. `keep`
// receives the array so that the view stays valid.
ops::TensorView tensor_arg(py::handle obj, const char* name, std::vector<py::array>& keep,
                           const std::optional<std::string>& raw_dtype = std::nullopt,
                           bool writable = false);
// An index array of rank 1 or 2 as `expected` (the adapter's index type):
// a list or tuple of ints, or an array of any integer dtype (NumPy, DLPack,
// buffer protocol). An array of another integer dtype is converted (a copy)
// after a range check: InvalidArgument naming `name`, the bad value and its
// position when a value does not fit `expected`. TypeError for non-integers.
ops::IndexView index_arg(py::handle obj, const char* name, std::vector<py::array>& keep,
                         ops::IndexType expected);

// A new C-contiguous array of `shape` in the library dtype `dtype`, as
// float32 / float16, or ml_dtypes' type when `like` has one, else as the raw
// bits (uint16 / uint8 / int8), tagged when `like` is tagged.
py::array new_array(const std::vector<py::ssize_t>& shape, DType dtype, const py::array& like);

// The NumPy dtype that shows storage of `dtype`: float32 / float16 / int8,
// ml_dtypes' bfloat16 / float8 types when ml_dtypes is installed, else the
// raw bits (uint16 / uint8).
py::object storage_numpy_dtype(DType dtype);

// A dense view of an array made by new_array.
ops::TensorView output_view(py::array& array, DType dtype);

// A Python int (or any object with __index__, e.g. numpy.int64) as int64:
// TypeError naming `call` and `name` for another type, InvalidArgument
// (ValueError) when it does not fit. pybind11's own conversion would raise
// a bare RuntimeError or a TypeError that does not say which argument.
std::int64_t int_arg(py::handle obj, const char* call, const char* name);
// The same for an int32 attribute (InvalidArgument when it does not fit).
std::int32_t int32_arg(py::handle obj, const char* call, const char* name);
// A sequence of such ints (a list, tuple or 1-D integer array).
std::vector<std::int64_t> int_list_arg(py::handle obj, const char* call, const char* name);

// Element count of an array's shape.
std::int64_t element_count(const py::array& array);

}  // namespace pagedattn::python
