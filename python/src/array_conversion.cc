#include "array_conversion.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>

#include "dlpack_abi.h"
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

// NumPy dtype metadata naming the library dtype of raw bits: arrays read
// from DLPack bfloat16 / float8 data without ml_dtypes carry it, so they
// need no dtype string and outputs made like them carry it on.
constexpr const char* kDTypeTag = "pagedattn_dtype";

py::object tagged_raw_dtype(DType dtype) {
  py::dict metadata;
  metadata[kDTypeTag] = std::string(dtype_name(dtype));
  return numpy().attr("dtype")(raw_numpy_dtype(dtype), py::arg("metadata") = metadata);
}

std::optional<DType> tag_of(const py::dtype& d) {
  const py::object metadata = py::getattr(d, "metadata", py::none());
  if (metadata.is_none()) return std::nullopt;
  const py::object tag = metadata.attr("get")(kDTypeTag);
  if (tag.is_none()) return std::nullopt;
  return parse_dtype(tag.cast<std::string>());
}

// The NumPy dtype of DLPack data: NumPy's own for integers, bool, floats
// and complex; ml_dtypes' type for bfloat16 / float8 (tagged raw bits
// without ml_dtypes). TypeError naming `name` for anything else.
py::object dlpack_numpy_dtype(const dlpack::DataType& type, const char* name) {
  const auto bits_in = [&](std::initializer_list<int> allowed) {
    return std::find(allowed.begin(), allowed.end(), int{type.bits}) != allowed.end();
  };
  const char* kind = nullptr;
  std::optional<DType> library;
  switch (type.code) {
    case dlpack::kInt:
      kind = bits_in({8, 16, 32, 64}) ? "i" : nullptr;
      break;
    case dlpack::kUInt:
      kind = bits_in({8, 16, 32, 64}) ? "u" : nullptr;
      break;
    case dlpack::kFloat:
      kind = bits_in({16, 32, 64}) ? "f" : nullptr;
      break;
    case dlpack::kComplex:
      kind = bits_in({64, 128}) ? "c" : nullptr;
      break;
    case dlpack::kBool:
      kind = bits_in({8}) ? "b" : nullptr;
      break;
    case dlpack::kBfloat:
      if (bits_in({16})) library = DType::kBF16;
      break;
    case dlpack::kFloat8E4M3FN:
      if (bits_in({8})) library = DType::kFP8E4M3;
      break;
    case dlpack::kFloat8E5M2:
      if (bits_in({8})) library = DType::kFP8E5M2;
      break;
    default:
      break;
  }
  if (type.lanes != 1 || (kind == nullptr && !library))
    throw py::type_error(detail::concat(
        name, " has DLPack dtype (code ", int{type.code}, ", bits ", int{type.bits}, ", lanes ",
        type.lanes, "), expected float32, float16, bfloat16, float8 or integer data"));
  if (library) {
    py::object ml = ml_dtype(*library);
    return ml.is_none() ? tagged_raw_dtype(*library) : ml;
  }
  if (*kind == 'b') return numpy().attr("dtype")("bool");
  return numpy().attr("dtype")(detail::concat(kind, type.bits / 8));
}

// A NumPy array over a DLPack producer's memory, without a copy: it owns
// the producer's managed tensor (consumed from the capsule, as the protocol
// wants) and keeps the producer's strides; read-only when the producer
// says so.
py::array from_dlpack(py::handle obj, const char* name) {
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 1));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")();  // a producer from before DLPack 1.0
  }
  const ConsumedDlpack consumed = consume_dlpack_capsule(capsule, name);
  const auto* t = static_cast<const dlpack::Tensor*>(consumed.tensor);
  const py::capsule& owner = consumed.owner;
  const bool read_only = consumed.read_only;
  if (!dlpack::host_device(t->device.type))
    throw py::type_error(detail::concat(name, " is on DLPack device (", t->device.type, ", ",
                                        t->device.id,
                                        "), not in CPU memory: pagedattn runs on the CPU"));
  const auto dtype = py::reinterpret_borrow<py::dtype>(dlpack_numpy_dtype(t->dtype, name));
  const auto item = static_cast<py::ssize_t>(dtype.itemsize());
  std::vector<py::ssize_t> shape(static_cast<std::size_t>(t->ndim));
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t dense = item;
  for (std::int32_t d = t->ndim - 1; d >= 0; --d) {
    const auto a = static_cast<std::size_t>(d);
    shape[a] = static_cast<py::ssize_t>(t->shape[d]);
    strides[a] = t->strides ? static_cast<py::ssize_t>(t->strides[d]) * item : dense;
    dense *= shape[a];
  }
  if (t->data == nullptr && dense != 0)
    throw py::type_error(detail::concat(name, " is a DLPack tensor without data"));
  void* data = t->data ? static_cast<std::byte*>(t->data) + t->byte_offset : nullptr;
  py::array array(dtype, shape, strides, data, data ? py::handle(owner) : py::handle());
  if (read_only) array.attr("setflags")(py::arg("write") = false);
  return array;
}

// Release a managed tensor once its owner capsule is collected.
void release_managed(void* managed) {
  auto* m = static_cast<dlpack::Managed*>(managed);
  if (m->deleter) m->deleter(m);
}
void release_managed_versioned(void* managed) {
  auto* m = static_cast<dlpack::ManagedVersioned*>(managed);
  if (m->deleter) m->deleter(m);
}

}  // namespace

ConsumedDlpack consume_dlpack_capsule(const py::object& capsule, const std::string& name) {
  PyObject* raw = capsule.ptr();
  if (PyCapsule_IsValid(raw, "dltensor_versioned")) {
    auto* m =
        static_cast<dlpack::ManagedVersioned*>(PyCapsule_GetPointer(raw, "dltensor_versioned"));
    if (m->version.major != 1)  // not consumed: the capsule releases it
      throw py::type_error(detail::concat(name, " is DLPack ", m->version.major, ".",
                                          m->version.minor, ", expected version 1.x"));
    PyCapsule_SetName(raw, "used_dltensor_versioned");
    return {&m->tensor, (m->flags & dlpack::kReadOnlyFlag) != 0,
            py::capsule(m, release_managed_versioned)};
  }
  if (PyCapsule_IsValid(raw, "dltensor")) {
    auto* m = static_cast<dlpack::Managed*>(PyCapsule_GetPointer(raw, "dltensor"));
    PyCapsule_SetName(raw, "used_dltensor");
    return {&m->tensor, false, py::capsule(m, release_managed)};
  }
  throw py::type_error(detail::concat(name, ".__dlpack__() returned no DLPack capsule"));
}

std::optional<DType> dtype_tag(const py::array& array) {
  return tag_of(array.dtype());
}

py::array as_array(py::handle obj, const char* name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name);
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
  if (const std::optional<DType> tagged = tag_of(d)) {
    if (raw_dtype && parse_dtype(*raw_dtype) != *tagged)
      throw py::type_error(detail::concat(name, " has dtype ", dtype_name(*tagged), " but dtype \"",
                                          *raw_dtype, "\" was given"));
    return *tagged;
  }
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
    // Keep the caller's convention: ml_dtypes in, ml_dtypes out; tagged
    // raw bits (DLPack without ml_dtypes) in, tagged raw bits out.
    if (like.dtype().kind() == 'V') {
      py::object ml = ml_dtype(dtype);
      if (!ml.is_none()) numpy_dtype = ml;
    } else if (tag_of(like.dtype())) {
      numpy_dtype = tagged_raw_dtype(dtype);
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
