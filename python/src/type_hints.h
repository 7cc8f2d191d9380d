// Python types for the arguments the bindings convert themselves. The type
// stubs of pagedattn._core are generated from the bindings' signatures
// (pybind11-stubgen, python/CMakeLists.txt), and a bare py::handle or
// py::object is typed Any there. A binding that takes an array-like, an int
// with __index__ or a union of types therefore takes one of the objects
// below: any Python object at run time (the binding checks and converts it,
// naming the argument when it is wrong), named by its hint in signatures.
#pragma once

#include <pybind11/pybind11.h>

namespace pagedattn::python {

namespace py = pybind11;

inline int accepts_any_object(PyObject* /*object*/) {
  return 1;
}

// Any object, typed Hint::name in signatures.
template <typename Hint>
class Typed : public py::object {
  PYBIND11_OBJECT_DEFAULT(Typed, object, accepts_any_object)
};

// Hint, or None.
template <typename Hint>
struct OrNone {
  static constexpr auto name = Hint::name + py::detail::const_name(" | None");
};

// A NumPy array, a DLPack producer (e.g. a torch tensor) or a buffer-protocol
// object (as_array); index arrays also take lists of ints (index_arg).
struct ArrayLikeHint {
  static constexpr auto name = py::detail::const_name("numpy.typing.ArrayLike");
};
using ArrayLike = Typed<ArrayLikeHint>;
using OptionalArrayLike = Typed<OrNone<ArrayLikeHint>>;

// An int or an object with __index__, e.g. numpy.int64 (int_arg).
struct IndexHint {
  static constexpr auto name = py::detail::const_name("typing.SupportsIndex");
};
using Index = Typed<IndexHint>;
using OptionalIndex = Typed<OrNone<IndexHint>>;

// A list or tuple of such ints, or a 1-D integer array (int_list_arg).
struct IndexSequenceHint {
  static constexpr auto name = py::detail::const_name(
      "collections.abc.Sequence[typing.SupportsIndex] | numpy.typing.NDArray[numpy.integer]");
};
using IndexSequence = Typed<IndexSequenceHint>;
using OptionalIndexSequence = Typed<OrNone<IndexSequenceHint>>;

// A float32 array, or None (a result).
struct Float32ArrayHint {
  static constexpr auto name = py::detail::const_name("numpy.typing.NDArray[numpy.float32]");
};
using OptionalFloat32Array = Typed<OrNone<Float32ArrayHint>>;

}  // namespace pagedattn::python

namespace pybind11::detail {

template <typename Hint>
struct handle_type_name<pagedattn::python::Typed<Hint>> {
  static constexpr auto name = Hint::name;
};

}  // namespace pybind11::detail
