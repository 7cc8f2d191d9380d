#include "array_conversion.h"

#include <string_view>

#include "pagedattn/errors.h"

namespace pagedattn::python {
namespace {

py::module_ numpy() {
  return py::module_::import("numpy");
}

// ml_dtypes' dtype for a library dtype, or None when the package is absent.
py::object ml_dtype(DType dtype) {
  py::module_ ml;
  try {
    ml = py::module_::import("ml_dtypes");
  } catch (const py::error_already_set&) {
    return py::none();
  }
  return numpy().attr("dtype")(ml.attr(std::string(dtype_name(dtype)).c_str()));
}

// The raw-bits NumPy dtype that carries a library dtype.
py::dtype raw_numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return py::dtype::of<float>();
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBF16:
      return py::dtype::of<std::uint16_t>();
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
      return py::dtype::of<std::uint8_t>();
    case DType::kINT8:
      return py::dtype::of<std::int8_t>();
  }
  return py::dtype::of<float>();
}

std::string dtype_str(const py::dtype& d) {
  return py::str(d).cast<std::string>();
}

}  // namespace

py::array as_array(py::handle obj, const char* name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (py::hasattr(obj, "__dlpack__")) return numpy().attr("from_dlpack")(obj);
  if (PyObject_CheckBuffer(obj.ptr())) return numpy().attr("asarray")(obj);
  throw py::type_error(detail::concat(name,
                                      " must be an array (NumPy, buffer protocol or DLPack), got ",
                                      py::str(py::type::of(obj)).cast<std::string>()));
}

DType dtype_of(const py::array& array, const char* name,
               const std::optional<std::string>& raw_dtype) {
  const py::dtype d = array.dtype();
  const std::string dname = d.attr("name").cast<std::string>();
  const char kind = d.kind();
  if (kind == 'V') {  // ml_dtypes types are NumPy user types named like ours
    for (DType t : {DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2}) {
      if (dname == dtype_name(t)) {
        if (raw_dtype && parse_dtype(*raw_dtype) != t)
          throw py::type_error(detail::concat(name, " has dtype ", dname, " but dtype \"",
                                              *raw_dtype, "\" was given"));
        return t;
      }
    }
  }
  if (dname == "float32") return DType::kF32;
  if (dname == "float16") return DType::kF16;
  if (dname == "uint16" || dname == "uint8" || dname == "int8") {
    if (!raw_dtype)
      throw py::type_error(detail::concat(
          name, " has dtype ", dname,
          ": raw bits need an explicit dtype string (\"bfloat16\" for uint16, "
          "\"float8_e4m3fn\" / \"float8_e5m2\" for uint8), or pass an ml_dtypes array"));
    const DType t = parse_dtype(*raw_dtype);
    if (dtype_size(t) != static_cast<std::size_t>(d.itemsize()) || t == DType::kF16 ||
        t == DType::kF32)
      throw py::type_error(detail::concat(name, " has dtype ", dname,
                                          ", which cannot carry dtype \"", *raw_dtype, "\""));
    return t;
  }
  throw py::type_error(detail::concat(name, " has dtype ", dtype_str(d),
                                      ", expected float32, float16, or bfloat16 / float8 data"));
}

ops::TensorView tensor_view(const py::array& array, DType dtype, const char* name, bool writable) {
  if (array.ndim() > ops::kMaxTensorRank)
    throw InvalidArgument(detail::concat(name, " has rank ", array.ndim(), ", at most ",
                                         ops::kMaxTensorRank, " is supported"));
  if (writable && !array.writeable())
    throw InvalidArgument(detail::concat(name, " is read-only; it is written in place"));
  ops::TensorView t;
  // The adapters only read through `data`; const is restored by `writable`.
  t.data = const_cast<void*>(array.data());
  t.dtype = dtype;
  t.rank = static_cast<std::int32_t>(array.ndim());
  const auto item = static_cast<py::ssize_t>(array.itemsize());
  for (std::int32_t d = 0; d < t.rank; ++d) {
    const py::ssize_t stride = array.strides(d);
    if (stride % item != 0)
      throw InvalidArgument(detail::concat(name, " has stride ", stride, " bytes on axis ", d,
                                           ", not a multiple of its item size ", item));
    t.shape[static_cast<std::size_t>(d)] = array.shape(d);
    t.strides[static_cast<std::size_t>(d)] = stride / item;
  }
  // NumPy gives empty arrays arbitrary strides (often 0); nothing is
  // addressed, so describe them as dense.
  if (array.size() == 0) t.strides = ops::dense_strides(t.shape, t.rank);
  return t;
}

ops::TensorView tensor_arg(py::handle obj, const char* name, std::vector<py::array>& keep,
                           const std::optional<std::string>& raw_dtype, bool writable) {
  py::array array = as_array(obj, name);
  const DType dtype = dtype_of(array, name, raw_dtype);
  keep.push_back(array);
  return tensor_view(array, dtype, name, writable);
}

namespace {

// A (nested) list or tuple of ints as an array; an empty one as int64.
py::array index_list(py::handle obj) {
  py::array array = numpy().attr("asarray")(obj);
  if (array.size() == 0) return array.attr("astype")("int64");
  return array;
}

// `array` (of an integer dtype) as `expected`, its values checked to fit.
py::array converted_indices(const py::array& array, const char* name, ops::IndexType expected) {
  const bool to_int32 = expected == ops::IndexType::kInt32;
  const py::dtype target = to_int32 ? py::dtype::of<std::int32_t>() : py::dtype::of<std::int64_t>();
  if (array.dtype().equal(target)) return array;
  if (array.size() > 0) {
    // Compare in Python ints: exact for every integer dtype (uint64 too).
    const py::object flat = array.attr("reshape")(-1);
    const py::object lowest = flat.attr("argmin")(), highest = flat.attr("argmax")();
    const long long min_allowed = to_int32 ? INT32_MIN : INT64_MIN;
    const long long max_allowed = to_int32 ? INT32_MAX : INT64_MAX;
    for (const py::object& at : {lowest, highest}) {
      const py::int_ value = flat[at].attr("item")();
      if (value < py::int_(min_allowed) || value > py::int_(max_allowed))
        throw InvalidArgument(detail::concat(name, " holds ", py::str(value).cast<std::string>(),
                                             " (flat index ", py::str(at).cast<std::string>(),
                                             "), which does not fit ", to_int32 ? "int32" : "int64",
                                             ", the index type the operator takes"));
    }
  }
  return array.attr("astype")(target);
}

}  // namespace

ops::IndexView index_arg(py::handle obj, const char* name, std::vector<py::array>& keep,
                         ops::IndexType expected) {
  const bool is_list = py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj);
  py::array array = is_list ? index_list(obj) : as_array(obj, name);
  const char kind = array.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::type_error(detail::concat(name, " has dtype ", dtype_str(array.dtype()),
                                        ", expected an integer array (int32 or int64)"));
  if (array.ndim() < 1 || array.ndim() > 2)
    throw InvalidArgument(detail::concat(name, " has rank ", array.ndim(), ", expected 1 or 2"));
  array = converted_indices(array, name, expected);
  ops::IndexView v;
  v.data = array.data();
  v.type = expected;
  v.rank = static_cast<std::int32_t>(array.ndim());
  const auto item = static_cast<py::ssize_t>(array.itemsize());
  for (std::int32_t d = 0; d < v.rank; ++d) {
    if (array.strides(d) % item != 0)
      throw InvalidArgument(detail::concat(name, " has a stride that is not a whole element"));
    v.shape[static_cast<std::size_t>(d)] = array.shape(d);
    v.strides[static_cast<std::size_t>(d)] = array.strides(d) / item;
  }
  keep.push_back(array);
  return v;
}

py::array new_array(const std::vector<py::ssize_t>& shape, DType dtype, const py::array& like) {
  py::object numpy_dtype = raw_numpy_dtype(dtype);
  if (dtype == DType::kBF16 || is_fp8(dtype)) {
    // Keep the caller's convention: ml_dtypes in, ml_dtypes out.
    if (like.dtype().kind() == 'V') {
      py::object ml = ml_dtype(dtype);
      if (!ml.is_none()) numpy_dtype = ml;
    }
  }
  py::tuple dims(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) dims[d] = py::int_(shape[d]);
  return numpy().attr("empty")(dims, numpy_dtype);
}

py::object storage_numpy_dtype(DType dtype) {
  if (dtype == DType::kBF16 || is_fp8(dtype)) {
    py::object ml = ml_dtype(dtype);
    if (!ml.is_none()) return ml;
  }
  return raw_numpy_dtype(dtype);
}

ops::TensorView output_view(py::array& array, DType dtype) {
  return tensor_view(array, dtype, "output", /*writable=*/true);
}

std::int64_t int_arg(py::handle obj, const char* call, const char* name) {
  const auto type_name = [&] {
    return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
  };
  if (PyBool_Check(obj.ptr()) || PyFloat_Check(obj.ptr()) || !PyIndex_Check(obj.ptr()))
    throw py::type_error(detail::concat(call, ": ", name, " must be an int, got ", type_name()));
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0)
    throw InvalidArgument(detail::concat(call, ": ", name, " = ",
                                         py::str(index).cast<std::string>(),
                                         " does not fit a signed 64-bit integer"));
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<std::int64_t>(value);
}

std::int32_t int32_arg(py::handle obj, const char* call, const char* name) {
  const std::int64_t value = int_arg(obj, call, name);
  if (value < INT32_MIN || value > INT32_MAX)
    throw InvalidArgument(
        detail::concat(call, ": ", name, " = ", value, " does not fit a signed 32-bit integer"));
  return static_cast<std::int32_t>(value);
}

std::vector<std::int64_t> int_list_arg(py::handle obj, const char* call, const char* name) {
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
      !PySequence_Check(obj.ptr()))
    throw py::type_error(
        detail::concat(call, ": ", name, " must be a sequence of ints, got ",
                       py::str(py::type::of(obj).attr("__name__")).cast<std::string>()));
  const py::sequence items = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<std::int64_t> values;
  values.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string item_name = detail::concat(name, "[", i, "]");
    values.push_back(int_arg(items[i], call, item_name.c_str()));
  }
  return values;
}

std::int64_t element_count(const py::array& array) {
  return static_cast<std::int64_t>(array.size());
}

}  // namespace pagedattn::python
