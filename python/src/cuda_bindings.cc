// pagedattn._core.cuda: the CUDA backend (include/pagedattn/cuda.h) on CUDA
// tensors of any DLPack producer (torch, CuPy, JAX), used in place: no copy
// of a tensor is made. Each call reads its tensors with `__dlpack__(stream=)`,
// so the producer orders its pending work before the call's stream (the
// DLPack stream protocol), keeps the capsules alive for the call, checks the
// shapes it needs to build the views (naming the argument), releases the GIL
// and enqueues the C++ call on `stream`; the C++ calls check the rest.
// BatchAttention owns the device copies of its page table and its workspace
// (cudaMalloc), ordered with events so that plan() and run() may use
// different streams.
#include <cuda_runtime.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "array_conversion.h"
#include "bindings.h"
#include "dlpack_abi.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"
#include "type_hints.h"

namespace pagedattn::python {
namespace {

namespace cu = pagedattn::cuda;
using detail::concat;

// --- argument types of the signatures -------------------------------------------------

// A tensor of a DLPack producer (torch.Tensor, CuPy, JAX array). The type
// stubs cannot name torch.Tensor without importing torch, so they say Any.
struct TensorHint {
  static constexpr auto name = py::detail::const_name("typing.Any");
};
using Tensor = Typed<TensorHint>;
using OptionalTensor = Typed<OrNone<TensorHint>>;

// A cudaStream_t as an int (torch.cuda.Stream.cuda_stream), an object with
// `cuda_stream` (torch.cuda.Stream), or None: the legacy default stream.
struct StreamHint {
  static constexpr auto name = py::detail::const_name("int | None");
};
using StreamArg = Typed<StreamHint>;

// --- CUDA runtime ------------------------------------------------------------------------

void check_cuda(cudaError_t status, const char* call, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorCode::kInternal,
                concat(call, ": ", what, " failed: ", cudaGetErrorString(status), " (",
                       cudaGetErrorName(status), ")"));
}

cudaStream_t native(cu::Stream stream) {
  return static_cast<cudaStream_t>(stream);
}

// The current device; Unsupported (NotImplementedError) without one.
int current_cuda_device(const char* call) {
  require<Unsupported>(cu::device_count() > 0, call, ": no CUDA device: ", cu::no_device_reason());
  int device = 0;
  check_cuda(cudaGetDevice(&device), call, "cudaGetDevice");
  return device;
}

cu::Stream stream_arg(py::handle obj, const char* call) {
  if (obj.is_none()) return nullptr;
  py::object value = py::reinterpret_borrow<py::object>(obj);
  if (!PyIndex_Check(obj.ptr()) && py::hasattr(obj, "cuda_stream")) value = obj.attr("cuda_stream");
  const std::int64_t handle = int_arg(value, call, "stream");
  require(handle >= 0, call, ": stream = ", handle, " is no cudaStream_t");
  return reinterpret_cast<cu::Stream>(static_cast<std::uintptr_t>(handle));
}

// The stream a consumer names in `__dlpack__(stream=)`: the cudaStream_t's
// value, except the legacy default stream, whose value 0 the protocol
// spells 1.
std::int64_t dlpack_stream(cu::Stream stream) {
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  return handle == 0 ? 1 : static_cast<std::int64_t>(handle);
}

// --- tensors from DLPack ----------------------------------------------------------------

enum class Element : std::uint8_t {
  kF32,
  kF16,
  kBF16,
  kFP8E4M3,
  kFP8E5M2,
  kInt8,
  kUInt8,
  kInt32,
  kInt64
};

struct ElementInfo {
  Element element;
  std::uint8_t code, bits;
  const char* name;
};
constexpr std::array<ElementInfo, 9> kElements = {{
    {Element::kF32, dlpack::kFloat, 32, "float32"},
    {Element::kF16, dlpack::kFloat, 16, "float16"},
    {Element::kBF16, dlpack::kBfloat, 16, "bfloat16"},
    {Element::kFP8E4M3, dlpack::kFloat8E4M3FN, 8, "float8_e4m3fn"},
    {Element::kFP8E5M2, dlpack::kFloat8E5M2, 8, "float8_e5m2"},
    {Element::kInt8, dlpack::kInt, 8, "int8"},
    {Element::kUInt8, dlpack::kUInt, 8, "uint8"},
    {Element::kInt32, dlpack::kInt, 32, "int32"},
    {Element::kInt64, dlpack::kInt, 64, "int64"},
}};

const char* element_name(Element element) {
  for (const ElementInfo& info : kElements)
    if (info.element == element) return info.name;
  return "?";
}

// The library dtype an element type stores (none for uint8 and the index types).
std::optional<DType> library_dtype(Element element) {
  switch (element) {
    case Element::kF32:
      return DType::kF32;
    case Element::kF16:
      return DType::kF16;
    case Element::kBF16:
      return DType::kBF16;
    case Element::kFP8E4M3:
      return DType::kFP8E4M3;
    case Element::kFP8E5M2:
      return DType::kFP8E5M2;
    case Element::kInt8:
      return DType::kINT8;
    default:
      return std::nullopt;
  }
}

// Where DLPack device `type` keeps data, for messages.
const char* device_type_name(std::int32_t type) {
  switch (type) {
    case dlpack::kCPU:
      return "CPU memory";
    case dlpack::kCUDA:
      return "CUDA device memory";
    case dlpack::kCUDAHost:
      return "CUDA pinned host memory";
    case dlpack::kROCMHost:
      return "ROCm pinned host memory";
    case dlpack::kCUDAManaged:
      return "CUDA managed memory";
    default:
      return "memory neither CPU nor CUDA";
  }
}

// A tensor's memory, element type, shape and element strides.
struct DeviceTensor {
  void* data = nullptr;
  Element element = Element::kF32;
  bool host = false;  // CPU memory (only where the call allows it)
  std::vector<std::int64_t> shape, strides;

  std::int32_t rank() const { return static_cast<std::int32_t>(shape.size()); }
  std::int64_t dim(std::int32_t d) const { return shape[static_cast<std::size_t>(d)]; }
  std::int64_t stride(std::int32_t d) const { return strides[static_cast<std::size_t>(d)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t extent : shape) n *= extent;
    return n;
  }
  // C-contiguous (axes of extent 1 may have any stride).
  bool dense() const {
    std::int64_t expected = 1;
    for (std::int32_t d = rank() - 1; d >= 0; --d) {
      if (dim(d) != 1 && stride(d) != expected) return false;
      expected *= dim(d);
    }
    return true;
  }
  // The last axis is contiguous (or of extent 1).
  bool rows_contiguous() const {
    return rank() == 0 || dim(rank() - 1) == 1 || stride(rank() - 1) == 1;
  }
};

std::string shape_string(const DeviceTensor& t) {
  std::string s = "[";
  for (std::int32_t d = 0; d < t.rank(); ++d) s += concat(d ? ", " : "", t.dim(d));
  return s + "]";
}

// Reads the tensors of one call: each view stays valid while the reader
// lives (it owns the consumed capsules, whose collection calls the
// producers' deleters). Destroy it with the GIL held.
class TensorReader {
 public:
  TensorReader(const char* call, cu::Stream stream) : call_(call), stream_(stream) {}

  const char* call() const { return call_; }

  // A tensor on the current CUDA device: TypeError naming `name` for a CPU
  // tensor (or anything else), InvalidArgument for another device.
  DeviceTensor device(py::handle obj, const char* name, bool writable = false) {
    return read(obj, name, writable, /*allow_host=*/false);
  }
  std::optional<DeviceTensor> optional_device(py::handle obj, const char* name,
                                              bool writable = false) {
    if (obj.is_none()) return std::nullopt;
    return device(obj, name, writable);
  }
  // A tensor on the current CUDA device or in CPU memory (swap_blocks).
  DeviceTensor device_or_host(py::handle obj, const char* name, bool writable = false) {
    return read(obj, name, writable, /*allow_host=*/true);
  }

 private:
  DeviceTensor read(py::handle obj, const char* name, bool writable, bool allow_host) {
    const char* wanted = allow_host ? "a CUDA or CPU tensor" : "a CUDA tensor";
    if (!py::hasattr(obj, "__dlpack__"))
      throw py::type_error(concat(call_, ": ", name, " must be ", wanted,
                                  " (a DLPack producer such as a torch.Tensor), got ",
                                  py::str(py::type::of(obj).attr("__name__")).cast<std::string>()));
    // Where the data is, before exporting: a CPU producer refuses a stream.
    std::optional<bool> host;
    if (py::hasattr(obj, "__dlpack_device__")) {
      const py::tuple where = obj.attr("__dlpack_device__")();
      host = check_location(where[0].cast<std::int32_t>(), where[1].cast<std::int32_t>(), name,
                            allow_host);
    }
    const bool on_host = host.value_or(false);
    py::object capsule = export_capsule(
        obj, on_host || !host ? std::nullopt : std::optional(dlpack_stream(stream_)));
    const auto [t, read_only] = consume(capsule, name);
    DeviceTensor result;
    result.host = check_location(t->device.type, t->device.id, name, allow_host);
    const auto info = std::find_if(kElements.begin(), kElements.end(), [&](const ElementInfo& e) {
      return e.code == t->dtype.code && e.bits == t->dtype.bits;
    });
    if (info == kElements.end() || t->dtype.lanes != 1)
      throw py::type_error(concat(call_, ": ", name, " has DLPack dtype (code ", int{t->dtype.code},
                                  ", bits ", int{t->dtype.bits}, ", lanes ", t->dtype.lanes,
                                  "), expected float32, float16, bfloat16, float8_e4m3fn, "
                                  "float8_e5m2, int8, uint8, int32 or int64"));
    require(!(writable && read_only), call_, ": ", name, " is read-only; it is written in place");
    result.element = info->element;
    result.shape.assign(t->shape, t->shape + t->ndim);
    result.strides.resize(result.shape.size());
    // Empty tensors may carry any strides; nothing is addressed: dense.
    const bool producer_strides = t->strides != nullptr && result.numel() != 0;
    std::int64_t dense = 1;
    for (std::int32_t d = t->ndim - 1; d >= 0; --d) {
      const auto a = static_cast<std::size_t>(d);
      result.strides[a] = producer_strides ? t->strides[d] : dense;
      dense *= result.shape[a];
    }
    if (t->data) result.data = static_cast<std::byte*>(t->data) + t->byte_offset;
    return result;
  }

  // Whether (type, id) is host memory the call allows; else TypeError
  // (neither CUDA nor allowed host memory) or InvalidArgument (another GPU).
  bool check_location(std::int32_t type, std::int32_t id, const char* name, bool allow_host) {
    if (allow_host && dlpack::host_device(type)) return true;
    if (type != dlpack::kCUDA && type != dlpack::kCUDAManaged)
      throw py::type_error(concat(
          call_, ": ", name, " must be ", allow_host ? "a CUDA or CPU tensor" : "a CUDA tensor",
          ", got one in ", device_type_name(type), " (DLPack device type ", type, ")"));
    if (!device_) device_ = current_cuda_device(call_);
    require(id == *device_, call_, ": ", name, " is on CUDA device ", id,
            " but the current device is ", *device_,
            ": make its device current (torch.cuda.set_device(", id, ")) or move it");
    return false;
  }

  // obj.__dlpack__(stream=, max_version=(1, 1)), or without max_version for
  // a producer from before DLPack 1.0.
  static py::object export_capsule(py::handle obj, std::optional<std::int64_t> stream) {
    const py::object dlpack = obj.attr("__dlpack__");
    py::dict kwargs;
    if (stream) kwargs["stream"] = *stream;
    kwargs["max_version"] = py::make_tuple(1, 1);
    try {
      return dlpack(**kwargs);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
    }
    kwargs.attr("pop")("max_version");
    return dlpack(**kwargs);
  }

  // Consumes the capsule (renamed "used_...", as the protocol wants) and
  // keeps its managed tensor until the reader is destroyed.
  std::pair<const dlpack::Tensor*, bool> consume(const py::object& capsule, const char* name) {
    ConsumedDlpack consumed = consume_dlpack_capsule(capsule, concat(call_, ": ", name));
    owners_.push_back(std::move(consumed.owner));
    return {static_cast<const dlpack::Tensor*>(consumed.tensor), consumed.read_only};
  }

  const char* call_;
  cu::Stream stream_;
  std::optional<int> device_;
  std::vector<py::capsule> owners_;
};

// --- views of tensors -------------------------------------------------------------------

void require_rank(const DeviceTensor& t, std::int32_t rank, const char* call, const char* name,
                  const char* axes) {
  require(t.rank() == rank, call, ": ", name, " has shape ", shape_string(t), ", expected ", axes);
}

void require_dim(const DeviceTensor& t, std::int32_t d, std::int64_t expected, const char* call,
                 const char* name, const char* what) {
  require(t.dim(d) == expected, call, ": ", name, " has shape ", shape_string(t), ": axis ", d,
          " (", what, ") must be ", expected);
}

DType activation_dtype(const DeviceTensor& t, const char* call, const char* name) {
  const std::optional<DType> dtype = library_dtype(t.element);
  if (!dtype || !is_activation_dtype(*dtype))
    throw py::type_error(concat(call, ": ", name, " has dtype ", element_name(t.element),
                                ", expected float32, float16 or bfloat16"));
  return *dtype;
}

// A [num_tokens][num_heads][dim] activation tensor with contiguous rows.
HeadTensor head_tensor(const DeviceTensor& t, const char* call, const char* name) {
  require_rank(t, 3, call, name, "rank 3 [num_tokens, num_heads, head_dim]");
  HeadTensor h;
  h.dtype = activation_dtype(t, call, name);
  require(t.rows_contiguous(), call, ": ", name, " must have a contiguous last axis (stride ",
          t.stride(2), ")");
  h.data = t.data;
  h.token_stride = t.stride(0);
  h.head_stride = t.stride(1);
  return h;
}

// The data of a C-contiguous float32 tensor of `shape`.
float* f32_data(const DeviceTensor& t, const std::vector<std::int64_t>& shape, const char* call,
                const char* name, const char* axes) {
  if (t.element != Element::kF32)
    throw py::type_error(
        concat(call, ": ", name, " has dtype ", element_name(t.element), ", expected float32"));
  require(t.shape == shape, call, ": ", name, " has shape ", shape_string(t), ", expected ", axes);
  require(t.dense(), call, ": ", name, " must be contiguous");
  return static_cast<float*>(t.data);
}

template <typename Int>
const Int* index_data(const DeviceTensor& t, Element element, const char* call, const char* name) {
  if (t.element != element)
    throw py::type_error(concat(call, ": ", name, " has dtype ", element_name(t.element),
                                ", expected ", element_name(element)));
  require_rank(t, 1, call, name, "rank 1");
  require(t.dense(), call, ": ", name, " must be contiguous");
  return static_cast<const Int*>(t.data);
}

KVLayout parse_layout(const std::string& layout, const char* call) {
  if (layout == "NHD") return KVLayout::kNHD;
  if (layout == "HND") return KVLayout::kHND;
  throw InvalidArgument(concat(call, ": layout = \"", layout,
                               "\" must be \"NHD\" [num_pages, page_size, num_kv_heads, head_dim] "
                               "or \"HND\" [num_pages, num_kv_heads, page_size, head_dim]"));
}

const char* layout_name(KVLayout layout) {
  return layout == KVLayout::kNHD ? "NHD" : "HND";
}

const char* cache_axes(KVLayout layout) {
  return layout == KVLayout::kNHD ? "rank 4 [num_pages, page_size, num_kv_heads, head_dim]"
                                  : "rank 4 [num_pages, num_kv_heads, page_size, head_dim]";
}

// "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2" or "int8" (the
// storage types the CUDA attention serves).
DType parse_kv_dtype(const std::string& name, const char* call) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8})
    if (name == dtype_name(t)) return t;
  throw InvalidArgument(concat(call, ": kv_dtype = \"", name,
                               "\" must be \"bfloat16\", \"float16\", \"float8_e4m3fn\", "
                               "\"float8_e5m2\" or \"int8\""));
}

// The storage dtype of a cache: `expected` (raw uint8 bytes carry fp8), or
// the tensor's own.
DType cache_dtype(const DeviceTensor& t, std::optional<DType> expected, const char* call,
                  const char* name) {
  const std::optional<DType> own = library_dtype(t.element);
  if (expected) {
    if (own == expected || (t.element == Element::kUInt8 && is_fp8(*expected))) return *expected;
    throw py::type_error(concat(call, ": ", name, " has dtype ", element_name(t.element),
                                " but kv_dtype is ", dtype_name(*expected)));
  }
  if (t.element == Element::kUInt8)
    throw py::type_error(concat(call, ": ", name,
                                " holds raw uint8 bytes: say which with kv_dtype=\"float8_e4m3fn\" "
                                "or \"float8_e5m2\""));
  if (!own)
    throw py::type_error(concat(call, ": ", name, " has dtype ", element_name(t.element),
                                ", expected a K/V storage type"));
  return *own;
}

// One cache tensor's geometry, by layout.
struct CacheAxes {
  std::int64_t num_pages = 0, page_size = 0, num_heads = 0, head_dim = 0;
  std::int64_t page_stride = 0, token_stride = 0, head_stride = 0;
};

CacheAxes cache_axes_of(const DeviceTensor& t, KVLayout layout, const char* call,
                        const char* name) {
  require_rank(t, 4, call, name, cache_axes(layout));
  require(t.rows_contiguous(), call, ": ", name, " must have a contiguous last axis (stride ",
          t.stride(3), ")");
  const bool nhd = layout == KVLayout::kNHD;
  CacheAxes a;
  a.num_pages = t.dim(0);
  a.page_size = t.dim(nhd ? 1 : 2);
  a.num_heads = t.dim(nhd ? 2 : 1);
  a.head_dim = t.dim(3);
  a.page_stride = t.stride(0);
  a.token_stride = t.stride(nhd ? 1 : 2);
  a.head_stride = t.stride(nhd ? 2 : 1);
  require(a.page_size <= INT32_MAX && a.num_heads <= INT32_MAX && a.head_dim <= INT32_MAX, call,
          ": ", name, " has shape ", shape_string(t),
          ", whose page, head and dim extents must fit int32");
  return a;
}

// The K/V storage of two cache tensors (strides kept as they are).
// Names: the call's names of the K and V caches.
struct CacheNames {
  const char* k;
  const char* v;
};
constexpr CacheNames kRunCaches{"k_cache", "v_cache"}, kOpCaches{"key_cache", "value_cache"};

PagedKVStorage paged_storage(const DeviceTensor& k, const DeviceTensor& v, KVLayout layout,
                             std::optional<DType> kv_dtype, const char* call, CacheNames names) {
  const CacheAxes ka = cache_axes_of(k, layout, call, names.k);
  const CacheAxes va = cache_axes_of(v, layout, call, names.v);
  require(
      ka.num_pages == va.num_pages && ka.page_size == va.page_size && ka.num_heads == va.num_heads,
      call, ": ", names.k, " ", shape_string(k), " and ", names.v, " ", shape_string(v),
      " must have the same pages, page size and heads (layout ", layout_name(layout), ")");
  require(k.element == v.element, call, ": ", names.k, " has dtype ", element_name(k.element),
          " and ", names.v, " ", element_name(v.element), ", expected the same");
  PagedKVStorage s;
  s.k_data = k.data;
  s.v_data = v.data;
  s.dtype = cache_dtype(k, kv_dtype, call, names.k);
  s.layout = layout;
  s.page_size = static_cast<std::int32_t>(ka.page_size);
  s.num_kv_heads = static_cast<std::int32_t>(ka.num_heads);
  s.head_dim = static_cast<std::int32_t>(ka.head_dim);
  s.v_head_dim = static_cast<std::int32_t>(va.head_dim);
  s.num_pages = ka.num_pages;
  s.k_page_stride = ka.page_stride;
  s.k_head_stride = ka.head_stride;
  s.k_token_stride = ka.token_stride;
  s.v_page_stride = va.page_stride;
  s.v_head_stride = va.head_stride;
  s.v_token_stride = va.token_stride;
  return s;
}

// Dequantisation scales: fp8 per tensor, int8 per token (device tensors
// [num_pages][num_kv_heads][page_size] float32, required for int8 only).
void set_scales(PagedKVStorage& s, float k_scale, float v_scale,
                const std::optional<DeviceTensor>& k_token_scales,
                const std::optional<DeviceTensor>& v_token_scales, const char* call) {
  s.k_scale = k_scale;
  s.v_scale = v_scale;
  const bool int8 = s.dtype == DType::kINT8;
  require(int8 == k_token_scales.has_value() && int8 == v_token_scales.has_value(), call,
          int8 ? ": int8 caches need k_token_scales and v_token_scales"
               : ": k_token_scales / v_token_scales are for int8 caches only");
  if (!int8) return;
  const std::vector<std::int64_t> shape{s.num_pages, s.num_kv_heads, s.page_size};
  constexpr const char* kAxes = "[num_pages, num_kv_heads, page_size]";
  s.k_token_scales = f32_data(*k_token_scales, shape, call, "k_token_scales", kAxes);
  s.v_token_scales = f32_data(*v_token_scales, shape, call, "v_token_scales", kAxes);
}

// Page copies move whole pages [page_stride elements]: the caches must be
// packed (C-contiguous), so that a page's bytes are its elements only.
void require_packed(const DeviceTensor& t, const char* call, const char* name) {
  require(t.dense(), call, ": ", name, " must be contiguous (pages are copied as whole blocks)");
}

// Index arguments the host reads (page tables, block mappings): TypeError
// naming `name` for a device tensor.
void require_host_array(py::handle obj, const char* call, const char* name) {
  if (!py::hasattr(obj, "__dlpack_device__")) return;
  const py::tuple where = obj.attr("__dlpack_device__")();
  if (!dlpack::host_device(where[0].cast<std::int32_t>()))
    throw py::type_error(concat(call, ": ", name,
                                " must be a host array (a list, NumPy array or CPU tensor): it is "
                                "read on the host"));
}

// (src, dst) page pairs from a host array (N, 2) (a list of pairs, NumPy or
// a CPU tensor).
std::vector<std::pair<std::int64_t, std::int64_t>> page_pairs(py::handle obj, const char* call) {
  require_host_array(obj, call, "block_mapping");
  std::vector<py::array> keep;
  const ops::IndexView v = index_arg(obj, "block_mapping", keep, ops::IndexType::kInt64);
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  if (v.rank == 1 && v.dim(0) == 0) return pairs;
  require(v.rank == 2 && v.dim(1) == 2, call, ": block_mapping must be (N, 2) rows (src, dst)");
  for (std::int64_t i = 0; i < v.dim(0); ++i) pairs.emplace_back(v.at(i, 0), v.at(i, 1));
  return pairs;
}

std::optional<DType> optional_kv_dtype(const std::optional<std::string>& name, const char* call) {
  if (!name) return std::nullopt;
  return parse_kv_dtype(*name, call);
}

// --- CUDA resources of BatchAttention --------------------------------------------------

// Device bytes from cudaMalloc, grown on demand.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  std::size_t capacity() const { return capacity_; }
  void* data() const { return data_; }
  // Holds at least `bytes` (contents lost); the caller has waited for every
  // use of the old buffer.
  void reserve(std::size_t bytes, const char* call, const char* what) {
    if (bytes <= capacity_) return;
    if (data_) {
      const cudaError_t freed = cudaFree(data_);
      data_ = nullptr;
      capacity_ = 0;
      check_cuda(freed, call, "cudaFree");
    }
    check_cuda(cudaMalloc(&data_, bytes), call, what);
    capacity_ = bytes;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// A CUDA event, created at its first record. Waiting for one never recorded
// returns at once (as cudaStreamWaitEvent does for an unrecorded event).
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }
  void record(cu::Stream stream, const char* call) {
    if (!event_)
      check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), call,
                 "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(event_, native(stream)), call, "cudaEventRecord");
  }
  // Work enqueued on `stream` from now on waits for the recorded work.
  void order_before(cu::Stream stream, const char* call) const {
    if (event_)
      check_cuda(cudaStreamWaitEvent(native(stream), event_, 0), call, "cudaStreamWaitEvent");
  }
  // The host waits for the recorded work.
  void synchronize(const char* call) const {
    if (event_) check_cuda(cudaEventSynchronize(event_), call, "cudaEventSynchronize");
  }
  // The same, for destructors (errors are dropped).
  void synchronize_quietly() const noexcept {
    if (event_) cudaEventSynchronize(event_);
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// --- BatchAttention ---------------------------------------------------------------------

struct AttentionConfig {
  std::int32_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0, page_size = 0;
  KVLayout layout = KVLayout::kNHD;
  DType kv_dtype = DType::kBF16;
  AttentionOptions options;  // scale, causal, window_left, softcap (pointers: per run)
};

// The page table on the host as one int32 array: [qo_indptr (B+1) |
// kv_indptr (B+1) | kv_indices (kv_indptr[B]) | kv_last_page_len (B) |
// kv_lens (B)], copied to the device as one block of the same layout.
struct HostTable {
  std::vector<std::int32_t> data;
  std::int32_t batch_size = 0;
  std::int32_t num_tokens = 0;  // qo_indptr[B]
  std::size_t kv_indptr_at = 0, kv_indices_at = 0, last_page_len_at = 0, kv_lens_at = 0;

  PagedKVTable view(const std::int32_t* base, std::int32_t page_size) const {
    PagedKVTable t;
    t.batch_size = batch_size;
    t.page_size = page_size;
    t.qo_indptr = base;
    t.kv_indptr = base + kv_indptr_at;
    t.kv_indices = base + kv_indices_at;
    t.kv_last_page_len = base + last_page_len_at;
    t.kv_lens = base + kv_lens_at;
    return t;
  }
};

std::vector<std::int32_t> host_ints(py::handle obj, const char* call, const char* name) {
  require_host_array(obj, call, name);
  std::vector<py::array> keep;
  const ops::IndexView v = index_arg(obj, name, keep, ops::IndexType::kInt32);
  require(v.rank == 1, call, ": ", name, " must be 1-D");
  std::vector<std::int32_t> values(static_cast<std::size_t>(v.dim(0)));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<std::int32_t>(v.at(static_cast<std::int64_t>(i)));
  return values;
}

// indptr[0] == 0 and nondecreasing, of length batch_size + 1.
void require_indptr(const std::vector<std::int32_t>& indptr, std::size_t batch_size,
                    const char* call, const char* name) {
  require(indptr.size() == batch_size + 1, call, ": ", name, " has ", indptr.size(),
          " entries, expected batch_size + 1 = ", batch_size + 1);
  require(indptr[0] == 0, call, ": ", name, "[0] = ", indptr[0], " must be 0");
  for (std::size_t b = 0; b < batch_size; ++b)
    require(indptr[b + 1] >= indptr[b], call, ": ", name, " decreases at [", b + 1,
            "] = ", indptr[b + 1]);
}

// The table of plan()'s arguments: kv_lens or, FlashInfer's way,
// kv_last_page_len (kv_len = (pages - 1) * page_size + last_page_len).
HostTable host_table(py::handle qo_indptr_obj, py::handle kv_indptr_obj, py::handle kv_indices_obj,
                     py::handle kv_last_page_len_obj, py::handle kv_lens_obj,
                     std::int32_t page_size) {
  constexpr const char* kCall = "BatchAttention.plan";
  require(kv_last_page_len_obj.is_none() != kv_lens_obj.is_none(), kCall,
          ": give exactly one of kv_last_page_len and kv_lens");
  const std::vector<std::int32_t> qo_indptr = host_ints(qo_indptr_obj, kCall, "qo_indptr");
  const std::vector<std::int32_t> kv_indptr = host_ints(kv_indptr_obj, kCall, "kv_indptr");
  const std::vector<std::int32_t> kv_indices = host_ints(kv_indices_obj, kCall, "kv_indices");
  require(!qo_indptr.empty(), kCall, ": qo_indptr must hold batch_size + 1 >= 1 entries");
  const std::size_t batch = qo_indptr.size() - 1;
  require_indptr(qo_indptr, batch, kCall, "qo_indptr");
  require_indptr(kv_indptr, batch, kCall, "kv_indptr");
  const auto used_pages = static_cast<std::size_t>(kv_indptr[batch]);
  require(kv_indices.size() >= used_pages, kCall, ": kv_indices has ", kv_indices.size(),
          " entries but kv_indptr[-1] = ", used_pages);
  const bool from_lens = !kv_lens_obj.is_none();
  const std::vector<std::int32_t> given =
      from_lens ? host_ints(kv_lens_obj, kCall, "kv_lens")
                : host_ints(kv_last_page_len_obj, kCall, "kv_last_page_len");
  const char* given_name = from_lens ? "kv_lens" : "kv_last_page_len";
  require(given.size() == batch, kCall, ": ", given_name, " has ", given.size(),
          " entries, expected batch_size = ", batch);
  std::vector<std::int32_t> last_page_len(batch), kv_lens(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t pages = kv_indptr[b + 1] - kv_indptr[b];
    if (from_lens) {
      require(given[b] >= 0, kCall, ": kv_lens[", b, "] = ", given[b], " must be >= 0");
      kv_lens[b] = given[b];
      const std::int64_t used = (std::int64_t{given[b]} + page_size - 1) / page_size;
      last_page_len[b] =
          used <= 0 ? 0 : static_cast<std::int32_t>(given[b] - (used - 1) * page_size);
      continue;
    }
    require(given[b] >= 0 && given[b] <= page_size && (pages > 0 || given[b] == 0), kCall,
            ": kv_last_page_len[", b, "] = ", given[b], " must be in [0, ",
            pages > 0 ? page_size : 0, "] for a sequence of ", pages, " pages");
    const std::int64_t len = pages == 0 ? 0 : (pages - 1) * page_size + given[b];
    require(len <= INT32_MAX, kCall, ": sequence ", b, " has ", len,
            " keys, more than int32 holds");
    last_page_len[b] = given[b];
    kv_lens[b] = static_cast<std::int32_t>(len);
  }
  HostTable t;
  t.batch_size = static_cast<std::int32_t>(batch);
  t.num_tokens = qo_indptr[batch];
  t.data = qo_indptr;
  t.kv_indptr_at = t.data.size();
  t.data.insert(t.data.end(), kv_indptr.begin(), kv_indptr.end());
  t.kv_indices_at = t.data.size();
  t.data.insert(t.data.end(), kv_indices.begin(),
                kv_indices.begin() + static_cast<std::ptrdiff_t>(used_pages));
  t.last_page_len_at = t.data.size();
  t.data.insert(t.data.end(), last_page_len.begin(), last_page_len.end());
  t.kv_lens_at = t.data.size();
  t.data.insert(t.data.end(), kv_lens.begin(), kv_lens.end());
  return t;
}

// What a plan was made from besides the table: a run whose tensors differ
// in any of these is planned again.
struct PlanKey {
  DType q_dtype = DType::kF32, o_dtype = DType::kF32;
  bool lse = false, alibi = false, sinks = false, token_scales = false;
  std::int64_t num_pages = 0;
  std::array<std::int64_t, 6> strides{};
  float k_scale = 1.0f, v_scale = 1.0f;
  bool operator==(const PlanKey&) const = default;
};

PlanKey plan_key(const AttentionParams& p) {
  PlanKey key;
  key.q_dtype = p.q.dtype;
  key.o_dtype = p.o.dtype;
  key.lse = p.lse != nullptr;
  key.alibi = p.options.alibi_slopes != nullptr;
  key.sinks = p.options.sinks != nullptr;
  key.token_scales = p.kv.k_token_scales != nullptr;
  key.num_pages = p.kv.num_pages;
  key.strides = {p.kv.k_page_stride, p.kv.k_head_stride, p.kv.k_token_stride,
                 p.kv.v_page_stride, p.kv.v_head_stride, p.kv.v_token_stride};
  key.k_scale = p.kv.k_scale;
  key.v_scale = p.kv.v_scale;
  return key;
}

// FlashInfer-like plan / run over the CUDA backend. plan() copies the page
// table to a device buffer this object owns; the CUDA plan itself (work
// items, workspace size) is made at the first run() after it, as it depends
// on the run's tensors too (query dtype, cache pages and strides), and is
// reused by the runs after it with the same such tensors (one per layer of
// a decode step). Events order plan() and run() on any streams: a plan()
// waits for the runs before it, a run() for its plan() and the run before
// it (they share the workspace).
class BatchAttention {
 public:
  explicit BatchAttention(const AttentionConfig& config) : config_(config) {}
  BatchAttention(const BatchAttention&) = delete;
  BatchAttention& operator=(const BatchAttention&) = delete;
  ~BatchAttention() {
    // The buffers are freed with the members: no work may still use them.
    last_run_done_.synchronize_quietly();
    table_ready_.synchronize_quietly();
  }

  const AttentionConfig& config() const { return config_; }
  std::int32_t batch_size() const {
    const std::lock_guard lock(mutex_);
    return table_ ? table_->batch_size : -1;
  }
  std::int32_t num_tokens() const {
    const std::lock_guard lock(mutex_);
    return table_ ? table_->num_tokens : -1;
  }
  std::size_t workspace_bytes() const {
    const std::lock_guard lock(mutex_);
    return planned_for_ ? plan_.workspace_bytes : 0;
  }

  // Without the GIL.
  void plan(HostTable table, const cu::CudaPlanOptions& options, cu::Stream stream) {
    constexpr const char* kCall = "BatchAttention.plan";
    const std::lock_guard lock(mutex_);
    use_device(kCall);
    table_.reset();
    planned_for_.reset();
    const std::size_t bytes = table.data.size() * sizeof(std::int32_t);
    if (bytes > table_device_.capacity()) {
      last_run_done_.synchronize(kCall);
      table_ready_.synchronize(kCall);
      table_device_.reserve(bytes, kCall, "cudaMalloc (page table)");
    }
    last_run_done_.order_before(stream, kCall);
    table_ready_.order_before(stream, kCall);
    // From pageable memory: the copy has read the vector when it returns.
    check_cuda(cudaMemcpyAsync(table_device_.data(), table.data.data(), bytes,
                               cudaMemcpyHostToDevice, native(stream)),
               kCall, "cudaMemcpyAsync (page table)");
    table_ready_.record(stream, kCall);
    table_ = std::move(table);
    plan_options_ = options;
  }

  // `params` with device pointers, its table unset, for `num_tokens` query
  // tokens (checked again here: another thread may have planned since).
  // Without the GIL.
  void run(AttentionParams params, std::int64_t num_tokens, cu::Stream stream) {
    constexpr const char* kCall = "BatchAttention.run";
    const std::lock_guard lock(mutex_);
    require<InvalidState>(table_.has_value(), kCall, ": call plan() first");
    require(num_tokens == table_->num_tokens, kCall, ": q has ", num_tokens,
            " tokens but the plan qo_indptr[-1] = ", table_->num_tokens);
    use_device(kCall);
    AttentionParams host_view = params;
    host_view.table = table_->view(table_->data.data(), config_.page_size);
    params.table =
        table_->view(static_cast<const std::int32_t*>(table_device_.data()), config_.page_size);
    const PlanKey key = plan_key(params);
    if (planned_for_ != key) {
      planned_for_.reset();
      plan_ = cu::plan_cuda_attention(host_view, plan_options_);
      planned_for_ = key;
    }
    const std::size_t bytes = std::max<std::size_t>(plan_.workspace_bytes, 256);
    if (bytes > workspace_.capacity()) {
      last_run_done_.synchronize(kCall);
      workspace_.reserve(bytes, kCall, "cudaMalloc (workspace)");
    }
    table_ready_.order_before(stream, kCall);
    last_run_done_.order_before(stream, kCall);
    cu::cuda_paged_attention(params, plan_, workspace_.data(), stream);
    last_run_done_.record(stream, kCall);
  }

 private:
  // The device of the first plan(); each call must find it current.
  void use_device(const char* call) {
    const int current = current_cuda_device(call);
    if (device_ < 0) device_ = current;
    require(current == device_, call, ": this BatchAttention holds memory on CUDA device ", device_,
            " but the current device is ", current);
  }

  AttentionConfig config_;
  mutable std::mutex mutex_;  // plan() and run() of threads that released the GIL
  int device_ = -1;
  std::optional<HostTable> table_;
  cu::CudaPlanOptions plan_options_;
  std::optional<PlanKey> planned_for_;  // plan_ is valid for runs like this
  cu::CudaAttentionPlan plan_;
  DeviceBuffer table_device_, workspace_;
  Event table_ready_, last_run_done_;
};

AttentionConfig attention_config(const Index& num_qo_heads, const Index& num_kv_heads,
                                 const Index& head_dim, const Index& page_size,
                                 const OptionalIndex& v_head_dim, const std::string& layout,
                                 const std::string& kv_dtype, bool causal, const Index& window_left,
                                 float softcap, std::optional<float> scale) {
  constexpr const char* kCall = "BatchAttention";
  AttentionConfig c;
  c.num_qo_heads = int32_arg(num_qo_heads, kCall, "num_qo_heads");
  c.num_kv_heads = int32_arg(num_kv_heads, kCall, "num_kv_heads");
  c.head_dim = int32_arg(head_dim, kCall, "head_dim");
  c.page_size = int32_arg(page_size, kCall, "page_size");
  c.v_head_dim = v_head_dim.is_none() ? c.head_dim : int32_arg(v_head_dim, kCall, "v_head_dim");
  require(c.num_kv_heads >= 1, kCall, ": num_kv_heads = ", c.num_kv_heads, " must be >= 1");
  require(c.num_qo_heads >= 1 && c.num_qo_heads % c.num_kv_heads == 0, kCall,
          ": num_qo_heads = ", c.num_qo_heads,
          " must be a positive multiple of num_kv_heads = ", c.num_kv_heads);
  require(c.head_dim >= 1, kCall, ": head_dim = ", c.head_dim, " must be >= 1");
  require(c.v_head_dim >= 1, kCall, ": v_head_dim = ", c.v_head_dim, " must be >= 1");
  require(c.page_size >= 1, kCall, ": page_size = ", c.page_size, " must be >= 1");
  c.layout = parse_layout(layout, kCall);
  c.kv_dtype = parse_kv_dtype(kv_dtype, kCall);
  c.options.causal = causal;
  c.options.window_left = int32_arg(window_left, kCall, "window_left");
  require(c.options.window_left >= -1, kCall, ": window_left = ", c.options.window_left,
          " must be -1 (off) or >= 0");
  require(std::isfinite(softcap) && softcap >= 0.0f, kCall, ": softcap = ", softcap,
          " must be 0 (off) or a positive finite value");
  c.options.softcap = softcap;
  require(!scale || std::isfinite(*scale), kCall, ": scale = ", scale.value_or(0.0f),
          " must be finite (None: 1 / sqrt(head_dim))");
  c.options.scale = scale;
  return c;
}

void plan_attention(BatchAttention& self, const ArrayLike& qo_indptr, const ArrayLike& kv_indptr,
                    const ArrayLike& kv_indices, const OptionalArrayLike& kv_last_page_len,
                    const OptionalArrayLike& kv_lens, const Index& num_sms,
                    const Index& fixed_kv_chunk, const StreamArg& stream) {
  constexpr const char* kCall = "BatchAttention.plan";
  const cu::Stream s = stream_arg(stream, kCall);
  cu::CudaPlanOptions options;
  options.num_sms = int32_arg(num_sms, kCall, "num_sms");
  options.fixed_kv_chunk = int32_arg(fixed_kv_chunk, kCall, "fixed_kv_chunk");
  require(options.num_sms >= 0 && options.fixed_kv_chunk >= 0, kCall,
          ": num_sms = ", options.num_sms, " and fixed_kv_chunk = ", options.fixed_kv_chunk,
          " must be >= 0");
  HostTable table = host_table(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens,
                               self.config().page_size);
  py::gil_scoped_release release;
  self.plan(std::move(table), options, s);
}

// The run's views of q, out, lse and the caches, checked against the
// constructor's shape.
AttentionParams run_params(const BatchAttention& self, TensorReader& reader, py::handle q,
                           py::handle k_cache, py::handle v_cache, py::handle out, py::handle lse,
                           float k_scale, float v_scale, py::handle k_token_scales,
                           py::handle v_token_scales, py::handle alibi_slopes, py::handle sinks,
                           std::int64_t& num_tokens) {
  const char* call = reader.call();
  const AttentionConfig& c = self.config();
  const std::int64_t tokens = self.num_tokens();
  require<InvalidState>(tokens >= 0, call, ": call plan() first");
  const DeviceTensor qt = reader.device(q, "q");
  const DeviceTensor ot = reader.device(out, "out", /*writable=*/true);
  AttentionParams p;
  p.q = head_tensor(qt, call, "q");
  p.o = head_tensor(ot, call, "out");
  num_tokens = tokens;
  require_dim(qt, 0, tokens, call, "q", "tokens: qo_indptr[-1] of the plan");
  require_dim(qt, 1, c.num_qo_heads, call, "q", "num_qo_heads");
  require_dim(qt, 2, c.head_dim, call, "q", "head_dim");
  require_dim(ot, 0, tokens, call, "out", "tokens: qo_indptr[-1] of the plan");
  require_dim(ot, 1, c.num_qo_heads, call, "out", "num_qo_heads");
  require_dim(ot, 2, c.v_head_dim, call, "out", "v_head_dim");
  p.num_qo_heads = c.num_qo_heads;
  if (const auto t = reader.optional_device(lse, "lse", /*writable=*/true))
    p.lse = f32_data(*t, {tokens, c.num_qo_heads}, call, "lse", "[num_tokens, num_qo_heads]");

  const DeviceTensor kt = reader.device(k_cache, "k_cache");
  const DeviceTensor vt = reader.device(v_cache, "v_cache");
  p.kv = paged_storage(kt, vt, c.layout, c.kv_dtype, call, kRunCaches);
  const CacheAxes axes = cache_axes_of(kt, c.layout, call, "k_cache");
  require(axes.page_size == c.page_size && axes.num_heads == c.num_kv_heads &&
              axes.head_dim == c.head_dim && p.kv.v_head_dim == c.v_head_dim,
          call, ": k_cache ", shape_string(kt), " and v_cache ", shape_string(vt),
          " do not match page_size = ", c.page_size, ", num_kv_heads = ", c.num_kv_heads,
          ", head_dim = ", c.head_dim, ", v_head_dim = ", c.v_head_dim, " (layout ",
          layout_name(c.layout), ")");
  set_scales(p.kv, k_scale, v_scale, reader.optional_device(k_token_scales, "k_token_scales"),
             reader.optional_device(v_token_scales, "v_token_scales"), call);

  p.options = c.options;
  constexpr const char* kHeads = "[num_qo_heads]";
  if (const auto t = reader.optional_device(alibi_slopes, "alibi_slopes"))
    p.options.alibi_slopes = f32_data(*t, {c.num_qo_heads}, call, "alibi_slopes", kHeads);
  if (const auto t = reader.optional_device(sinks, "sinks"))
    p.options.sinks = f32_data(*t, {c.num_qo_heads}, call, "sinks", kHeads);
  return p;
}

py::object run_attention(BatchAttention& self, const Tensor& q, const Tensor& k_cache,
                         const Tensor& v_cache, const Tensor& out, const OptionalTensor& lse,
                         float k_scale, float v_scale, const OptionalTensor& k_token_scales,
                         const OptionalTensor& v_token_scales, const OptionalTensor& alibi_slopes,
                         const OptionalTensor& sinks, const StreamArg& stream) {
  constexpr const char* kCall = "BatchAttention.run";
  const cu::Stream s = stream_arg(stream, kCall);
  TensorReader reader(kCall, s);
  std::int64_t num_tokens = 0;
  const AttentionParams params =
      run_params(self, reader, q, k_cache, v_cache, out, lse, k_scale, v_scale, k_token_scales,
                 v_token_scales, alibi_slopes, sinks, num_tokens);
  {
    py::gil_scoped_release release;
    self.run(params, num_tokens, s);
  }
  return out;
}

// --- block ops, RoPE, merge ---------------------------------------------------------------

void reshape_and_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                       const Tensor& value_cache, const Tensor& slot_mapping,
                       const std::string& layout, float k_scale, float v_scale,
                       const OptionalTensor& k_token_scales, const OptionalTensor& v_token_scales,
                       const std::optional<std::string>& kv_dtype, const StreamArg& stream) {
  constexpr const char* kCall = "reshape_and_cache";
  const cu::Stream s = stream_arg(stream, kCall);
  const KVLayout cache_layout = parse_layout(layout, kCall);
  const std::optional<DType> dtype = optional_kv_dtype(kv_dtype, kCall);
  TensorReader reader(kCall, s);
  const DeviceTensor kt = reader.device(key, "key");
  const DeviceTensor vt = reader.device(value, "value");
  const DeviceTensor kc = reader.device(key_cache, "key_cache", /*writable=*/true);
  const DeviceTensor vc = reader.device(value_cache, "value_cache", /*writable=*/true);
  const DeviceTensor slots = reader.device(slot_mapping, "slot_mapping");
  AppendParams p;
  p.kv = paged_storage(kc, vc, cache_layout, dtype, kCall, kOpCaches);
  set_scales(p.kv, k_scale, v_scale,
             reader.optional_device(k_token_scales, "k_token_scales", /*writable=*/true),
             reader.optional_device(v_token_scales, "v_token_scales", /*writable=*/true), kCall);
  p.slot_mapping = index_data<std::int64_t>(slots, Element::kInt64, kCall, "slot_mapping");
  const std::int64_t tokens = slots.dim(0);
  require(tokens <= INT32_MAX, kCall, ": slot_mapping has ", tokens, " entries, more than int32");
  p.num_tokens = static_cast<std::int32_t>(tokens);
  p.k = head_tensor(kt, kCall, "key");
  p.v = head_tensor(vt, kCall, "value");
  for (const auto& [t, name, dim] :
       {std::tuple{&kt, "key", p.kv.head_dim}, std::tuple{&vt, "value", p.kv.v_head_dim}}) {
    require(t->dim(0) >= tokens && t->dim(1) == p.kv.num_kv_heads && t->dim(2) == dim, kCall, ": ",
            name, " has shape ", shape_string(*t), ", expected [>= ", tokens,
            " (slot_mapping's length), ", p.kv.num_kv_heads, ", ", dim, "] as the caches");
  }
  py::gil_scoped_release release;
  cu::cuda_append_paged_kv(p, s);
}

void copy_blocks(const Tensor& key_cache, const Tensor& value_cache, const ArrayLike& block_mapping,
                 const std::string& layout, const OptionalTensor& k_token_scales,
                 const OptionalTensor& v_token_scales, const std::optional<std::string>& kv_dtype,
                 const StreamArg& stream) {
  constexpr const char* kCall = "copy_blocks";
  const cu::Stream s = stream_arg(stream, kCall);
  const KVLayout cache_layout = parse_layout(layout, kCall);
  const std::optional<DType> dtype = optional_kv_dtype(kv_dtype, kCall);
  const auto pairs = page_pairs(block_mapping, kCall);
  TensorReader reader(kCall, s);
  const DeviceTensor kc = reader.device(key_cache, "key_cache", /*writable=*/true);
  const DeviceTensor vc = reader.device(value_cache, "value_cache", /*writable=*/true);
  require_packed(kc, kCall, "key_cache");
  require_packed(vc, kCall, "value_cache");
  PagedKVStorage storage = paged_storage(kc, vc, cache_layout, dtype, kCall, kOpCaches);
  set_scales(storage, 1.0f, 1.0f,
             reader.optional_device(k_token_scales, "k_token_scales", /*writable=*/true),
             reader.optional_device(v_token_scales, "v_token_scales", /*writable=*/true), kCall);
  py::gil_scoped_release release;
  cu::cuda_copy_pages(storage, storage, pairs, s);
}

// One cache tensor as a storage whose V is its K (PagedKVStorage's v_in_k:
// page copies move K only).
PagedKVStorage single_storage(const DeviceTensor& t, KVLayout layout, std::optional<DType> kv_dtype,
                              const char* call, const char* name) {
  const CacheAxes a = cache_axes_of(t, layout, call, name);
  require_packed(t, call, name);
  PagedKVStorage s;
  s.k_data = s.v_data = t.data;
  s.dtype = cache_dtype(t, kv_dtype, call, name);
  s.layout = layout;
  s.page_size = static_cast<std::int32_t>(a.page_size);
  s.num_kv_heads = static_cast<std::int32_t>(a.num_heads);
  s.head_dim = s.v_head_dim = static_cast<std::int32_t>(a.head_dim);
  s.num_pages = a.num_pages;
  s.k_page_stride = s.v_page_stride = a.page_stride;
  s.k_head_stride = s.v_head_stride = a.head_stride;
  s.k_token_stride = s.v_token_stride = a.token_stride;
  s.v_in_k = true;
  return s;
}

void swap_blocks(const Tensor& src, const Tensor& dst, const ArrayLike& block_mapping,
                 const std::string& layout, const OptionalTensor& src_token_scales,
                 const OptionalTensor& dst_token_scales, const std::optional<std::string>& kv_dtype,
                 const StreamArg& stream) {
  constexpr const char* kCall = "swap_blocks";
  const cu::Stream s = stream_arg(stream, kCall);
  const KVLayout cache_layout = parse_layout(layout, kCall);
  const std::optional<DType> dtype = optional_kv_dtype(kv_dtype, kCall);
  const auto pairs = page_pairs(block_mapping, kCall);
  TensorReader reader(kCall, s);
  const DeviceTensor st = reader.device_or_host(src, "src");
  const DeviceTensor dt = reader.device_or_host(dst, "dst", /*writable=*/true);
  require(st.host != dt.host, kCall, ": one of src and dst must be a CPU tensor (pinned, for the ",
          "copy to overlap) and the other a CUDA tensor; both are ", st.host ? "CPU" : "CUDA",
          " tensors (copy_blocks copies within the device)");
  PagedKVStorage from = single_storage(st, cache_layout, dtype, kCall, "src");
  PagedKVStorage to = single_storage(dt, cache_layout, dtype, kCall, "dst");
  const bool int8 = from.dtype == DType::kINT8;
  require(int8 == !src_token_scales.is_none() && int8 == !dst_token_scales.is_none(), kCall,
          int8 ? ": int8 caches need src_token_scales and dst_token_scales"
               : ": src_token_scales / dst_token_scales are for int8 caches only");
  if (int8) {
    constexpr const char* kAxes = "[num_pages, num_kv_heads, page_size]";
    for (auto [storage, obj, name, host] :
         {std::tuple{&from, &src_token_scales, "src_token_scales", st.host},
          std::tuple{&to, &dst_token_scales, "dst_token_scales", dt.host}}) {
      const DeviceTensor t = reader.device_or_host(*obj, name, /*writable=*/storage == &to);
      require(t.host == host, kCall, ": ", name, " must be in the same memory as its cache (",
              host ? "CPU" : "CUDA", ")");
      storage->k_token_scales = f32_data(
          t, {storage->num_pages, storage->num_kv_heads, storage->page_size}, kCall, name, kAxes);
      storage->share_k_scales_with_v();
    }
  }
  const auto direction =
      st.host ? cu::SwapDirection::kHostToDevice : cu::SwapDirection::kDeviceToHost;
  py::gil_scoped_release release;
  cu::cuda_swap_pages(from, to, pairs, direction, s);
}

RopeStyle parse_rope_style(const std::string& style) {
  if (style == "neox") return RopeStyle::kNeox;
  if (style == "gptj") return RopeStyle::kGptJ;
  throw InvalidArgument(
      "apply_rope: style = \"" + style +
      "\" must be \"neox\" (pairs (t, t + R/2)) or \"gptj\" (pairs (2t, 2t + 1))");
}

void apply_rope(const Tensor& x, const Tensor& positions, const Index& rotary_dim, float theta,
                const std::string& style, float scale, const StreamArg& stream) {
  constexpr const char* kCall = "apply_rope";
  const cu::Stream s = stream_arg(stream, kCall);
  RopeConfig config;
  config.style = parse_rope_style(style);
  config.rotary_dim = int32_arg(rotary_dim, kCall, "rotary_dim");
  config.theta = theta;
  config.scale = scale;
  TensorReader reader(kCall, s);
  const DeviceTensor xt = reader.device(x, "x", /*writable=*/true);
  const DeviceTensor pt = reader.device(positions, "positions");
  const HeadTensor h = head_tensor(xt, kCall, "x");
  const std::int32_t* pos = index_data<std::int32_t>(pt, Element::kInt32, kCall, "positions");
  require(xt.dim(0) <= INT32_MAX && xt.dim(1) <= INT32_MAX && xt.dim(2) <= INT32_MAX, kCall,
          ": x has shape ", shape_string(xt), ", whose extents must fit int32");
  require(pt.dim(0) >= xt.dim(0), kCall, ": positions has ", pt.dim(0), " entries, x ", xt.dim(0),
          " tokens");
  const auto tokens = static_cast<std::int32_t>(xt.dim(0));
  const auto heads = static_cast<std::int32_t>(xt.dim(1));
  const auto dim = static_cast<std::int32_t>(xt.dim(2));
  py::gil_scoped_release release;
  cu::cuda_apply_rope(h, tokens, heads, dim, pos, config, s);
}

void merge_states(const Tensor& v_a, const Tensor& s_a, const Tensor& v_b, const Tensor& s_b,
                  const Tensor& v_out, const Tensor& s_out, const StreamArg& stream) {
  constexpr const char* kCall = "merge_states";
  const cu::Stream s = stream_arg(stream, kCall);
  TensorReader reader(kCall, s);
  const DeviceTensor va = reader.device(v_a, "v_a");
  require(va.rank() >= 1, kCall, ": v_a must have at least one axis [..., dim]");
  const std::vector<std::int64_t> v_shape = va.shape;
  const std::vector<std::int64_t> s_shape(v_shape.begin(), v_shape.end() - 1);
  const std::int64_t dim = v_shape.back();
  require(dim <= INT32_MAX, kCall, ": v_a's last axis ", dim, " must fit int32");
  constexpr const char* kV = "v_a's shape [..., dim]";
  constexpr const char* kS = "v_a's shape without its last axis";
  const float* a = f32_data(va, v_shape, kCall, "v_a", kV);
  const float* sa = f32_data(reader.device(s_a, "s_a"), s_shape, kCall, "s_a", kS);
  const float* b = f32_data(reader.device(v_b, "v_b"), v_shape, kCall, "v_b", kV);
  const float* sb = f32_data(reader.device(s_b, "s_b"), s_shape, kCall, "s_b", kS);
  float* vo = f32_data(reader.device(v_out, "v_out", true), v_shape, kCall, "v_out", kV);
  float* so = f32_data(reader.device(s_out, "s_out", true), s_shape, kCall, "s_out", kS);
  std::int64_t rows = 1;
  for (std::int64_t extent : s_shape) rows *= extent;
  py::gil_scoped_release release;
  cu::cuda_merge_states(a, sa, b, sb, vo, so, rows, static_cast<std::int32_t>(dim), s);
}

py::dict device_info() {
  const cu::DeviceInfo info = cu::current_device_info();
  py::dict d;
  d["name"] = info.name;
  d["major"] = info.major;
  d["minor"] = info.minor;
  d["sm_count"] = info.sm_count;
  d["max_shared_bytes_per_block"] = info.max_shared_bytes_per_block;
  d["global_bytes"] = info.global_bytes;
  return d;
}

void register_batch_attention(py::module_& m) {
  using py::arg;
  py::class_<BatchAttention>(
      m, "BatchAttention",
      R"doc(Paged attention over a ragged batch on the GPU, planned then run (FlashInfer's
BatchPrefillWithPagedKVCacheWrapper / BatchDecodeWithPagedKVCacheWrapper in one).

    attn = BatchAttention(num_qo_heads, num_kv_heads, head_dim, page_size)
    attn.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len)  # host arrays, per step
    attn.run(q, k_cache, v_cache, out)                              # CUDA tensors, per layer

Caches: layout "NHD" [num_pages, page_size, num_kv_heads, head_dim] or "HND"
[num_pages, num_kv_heads, page_size, head_dim] (any strides, contiguous last
axis); kv_dtype "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2" (or
uint8 bytes) or "int8" (with per-token scales). causal: bottom-right aligned;
window_left W >= 0: query at p sees keys [p - W, p]; softcap > 0:
softcap * tanh(s / softcap); scale None: 1 / sqrt(head_dim).)doc")
      .def(py::init([](const Index& num_qo_heads, const Index& num_kv_heads, const Index& head_dim,
                       const Index& page_size, const OptionalIndex& v_head_dim,
                       const std::string& layout, const std::string& kv_dtype, bool causal,
                       const Index& window_left, float softcap, std::optional<float> scale) {
             return std::make_unique<BatchAttention>(
                 attention_config(num_qo_heads, num_kv_heads, head_dim, page_size, v_head_dim,
                                  layout, kv_dtype, causal, window_left, softcap, scale));
           }),
           arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("page_size"),
           py::kw_only(), arg("v_head_dim") = py::none(), arg("layout") = "NHD",
           arg("kv_dtype") = "bfloat16", arg("causal") = true, arg("window_left") = -1,
           arg("softcap") = 0.0f, arg("scale") = py::none())
      .def("plan", &plan_attention, arg("qo_indptr"), arg("kv_indptr"), arg("kv_indices"),
           arg("kv_last_page_len") = py::none(), py::kw_only(), arg("kv_lens") = py::none(),
           arg("num_sms") = 0, arg("fixed_kv_chunk") = 0, arg("stream") = py::none(),
           R"doc(Takes a step's page table (host arrays: lists, NumPy or CPU tensors, int32
range) and copies it to the device on `stream`.

qo_indptr [B+1] offsets of each sequence's query tokens; kv_indptr [B+1]
offsets into kv_indices; kv_indices [kv_indptr[B]] page ids in logical
order; kv_last_page_len [B] used slots of each last page (FlashInfer: kv_len
= (pages - 1) * page_size + last), or kv_lens [B] keys per sequence (the
step's own keys included). num_sms: SMs to spread KV splits over (0: the
device's); fixed_kv_chunk > 0: split every sequence's keys into chunks of
that many (results then independent of the batch). The CUDA plan (work
items, workspace) is made at the next run(), which knows the tensors too,
and kept for the runs after it with the same dtypes and caches.)doc")
      .def("run", &run_attention, arg("q"), arg("k_cache"), arg("v_cache"), arg("out"),
           arg("lse") = py::none(), py::kw_only(), arg("k_scale") = 1.0f, arg("v_scale") = 1.0f,
           arg("k_token_scales") = py::none(), arg("v_token_scales") = py::none(),
           arg("alibi_slopes") = py::none(), arg("sinks") = py::none(), arg("stream") = py::none(),
           R"doc(Enqueues attention of the planned batch on `stream`; returns out.

q [num_tokens, num_qo_heads, head_dim] and out [num_tokens, num_qo_heads,
v_head_dim] (float16, bfloat16 or float32; contiguous last axis; num_tokens =
qo_indptr[-1]); k_cache, v_cache as the constructor's layout and kv_dtype;
lse [num_tokens, num_qo_heads] float32 natural-log LSE, written if given;
k_scale, v_scale: fp8 dequantisation (value = stored * scale);
k_token_scales, v_token_scales [num_pages, num_kv_heads, page_size] float32
for int8 caches; alibi_slopes, sinks [num_qo_heads] float32. Every tensor is
a CUDA tensor on the current device, read in place through DLPack (the
producer's current stream is ordered before `stream`); stream: a
cudaStream_t int (torch.cuda.current_stream().cuda_stream) or None (the
legacy default stream). The tensors must outlive the work on `stream`.)doc")
      .def_property_readonly(
          "num_qo_heads", [](const BatchAttention& a) { return a.config().num_qo_heads; },
          "Query heads.")
      .def_property_readonly(
          "num_kv_heads", [](const BatchAttention& a) { return a.config().num_kv_heads; },
          "K/V heads.")
      .def_property_readonly(
          "head_dim", [](const BatchAttention& a) { return a.config().head_dim; },
          "Query and key head dim.")
      .def_property_readonly(
          "v_head_dim", [](const BatchAttention& a) { return a.config().v_head_dim; },
          "Value (and output) head dim.")
      .def_property_readonly(
          "page_size", [](const BatchAttention& a) { return a.config().page_size; },
          "Tokens per page.")
      .def_property_readonly(
          "layout",
          [](const BatchAttention& a) { return std::string(layout_name(a.config().layout)); },
          "\"NHD\" or \"HND\".")
      .def_property_readonly(
          "kv_dtype",
          [](const BatchAttention& a) { return std::string(dtype_name(a.config().kv_dtype)); },
          "The caches' storage dtype.")
      .def_property_readonly(
          "batch_size",
          [](const BatchAttention& a) -> std::optional<int> {
            if (a.batch_size() < 0) return std::nullopt;
            return a.batch_size();
          },
          "Sequences of the last plan(), None before the first.")
      .def_property_readonly(
          "num_tokens",
          [](const BatchAttention& a) -> std::optional<int> {
            if (a.num_tokens() < 0) return std::nullopt;
            return a.num_tokens();
          },
          "Query tokens of the last plan() (qo_indptr[-1]), None before the first.")
      .def_property_readonly(
          "workspace_bytes", [](const BatchAttention& a) { return a.workspace_bytes(); },
          "Device workspace of the current CUDA plan (0 until a run made one).");
}

}  // namespace

void register_cuda(py::module_& m) {
  py::module_ cuda = m.def_submodule(
      "cuda", "The CUDA backend on CUDA tensors (DLPack, in place); see pagedattn.cuda.");
  using py::arg;
  cuda.def("device_count", &cu::device_count,
           "CUDA devices the runtime sees: 0 without a driver or GPU (never raises).");
  cuda.def("no_device_reason", &cu::no_device_reason,
           "Why device_count() is 0 (the CUDA runtime's error), or \"\" when a device exists.");
  cuda.def("device_info", &device_info,
           "The current device: name, compute capability (major, minor), sm_count, "
           "max_shared_bytes_per_block, global_bytes. UnsupportedError without one.");
  register_batch_attention(cuda);
  cuda.def("reshape_and_cache", &reshape_and_cache, arg("key"), arg("value"), arg("key_cache"),
           arg("value_cache"), arg("slot_mapping"), py::kw_only(), arg("layout") = "NHD",
           arg("k_scale") = 1.0f, arg("v_scale") = 1.0f, arg("k_token_scales") = py::none(),
           arg("v_token_scales") = py::none(), arg("kv_dtype") = py::none(),
           arg("stream") = py::none(),
           R"doc(vLLM reshape_and_cache on the GPU: writes each token's K/V to its slot, in place.

key [>= N, num_kv_heads, head_dim], value [>= N, num_kv_heads, v_head_dim]
(float32, float16, bfloat16; contiguous last axis); key_cache, value_cache
as BatchAttention's (layout "NHD" or "HND"); slot_mapping [N] int64 CUDA
tensor, page * page_size + offset, -1 skips. fp8 caches (float8 dtypes, or
uint8 with kv_dtype) store value / k_scale (v_scale), saturating; int8
caches store round(value / s), s = max|row| / 127 written to k_token_scales,
v_token_scales [num_pages, num_kv_heads, page_size] float32.)doc");
  cuda.def("copy_blocks", &copy_blocks, arg("key_cache"), arg("value_cache"), arg("block_mapping"),
           py::kw_only(), arg("layout") = "NHD", arg("k_token_scales") = py::none(),
           arg("v_token_scales") = py::none(), arg("kv_dtype") = py::none(),
           arg("stream") = py::none(),
           R"doc(vLLM copy_blocks on the GPU: copies pages src -> dst within the caches.

key_cache, value_cache: contiguous CUDA caches (layout "NHD" or "HND");
block_mapping: host (N, 2) pairs (src, dst) (a list, NumPy or CPU tensor);
int8 caches copy their k_token_scales / v_token_scales too. Destinations
must be distinct and no page both a source and a destination.)doc");
  cuda.def("swap_blocks", &swap_blocks, arg("src"), arg("dst"), arg("block_mapping"), py::kw_only(),
           arg("layout") = "NHD", arg("src_token_scales") = py::none(),
           arg("dst_token_scales") = py::none(), arg("kv_dtype") = py::none(),
           arg("stream") = py::none(),
           R"doc(vLLM swap_blocks: copies pages of src into dst between host and device memory.

One of src / dst is a CPU tensor (pinned, for the copy to run asynchronously
on `stream`), the other a CUDA tensor, both contiguous caches of the same
page shape and dtype [num_pages, ...] (layout "NHD" or "HND");
block_mapping: host (N, 2) pairs (src page, dst page). int8 caches need
src_token_scales / dst_token_scales [num_pages, num_kv_heads, page_size]
float32 in their cache's memory.)doc");
  cuda.def("apply_rope", &apply_rope, arg("x"), arg("positions"), py::kw_only(),
           arg("rotary_dim") = 0, arg("theta") = 10000.0f, arg("style") = "neox",
           arg("scale") = 1.0f, arg("stream") = py::none(),
           R"doc(Rotary embedding in place on the GPU.

x [num_tokens, num_heads, head_dim] (float32, float16, bfloat16; contiguous
last axis), token i rotated at positions[i] (int32 CUDA tensor [>=
num_tokens]); rotary_dim R (0: head_dim) even, dims >= R pass through;
style "neox" (pairs (t, t + R/2)) or "gptj" (pairs (2t, 2t + 1)); scale
multiplies every frequency theta^(-2t/R).)doc");
  cuda.def("merge_states", &merge_states, arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"),
           arg("v_out"), arg("s_out"), py::kw_only(), arg("stream") = py::none(),
           R"doc(Merges two partial attention states on the GPU into v_out, s_out.

v_a, v_b, v_out [..., D] float32 normalised outputs; s_a, s_b, s_out [...]
float32 natural-log LSE (-inf: an empty state); all contiguous CUDA tensors.
v = (e^s_a v_a + e^s_b v_b) / (e^s_a + e^s_b), s = log(e^s_a + e^s_b);
v_out / s_out may be v_a / s_a.)doc");
}

}  // namespace pagedattn::python
