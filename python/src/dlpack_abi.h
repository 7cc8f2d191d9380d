// The DLPack ABI (dlpack.h 1.x), as producers fill it in: the structs a
// `__dlpack__` capsule holds, read by array_conversion.cc (CPU arrays) and
// cuda_bindings.cc (CUDA tensors). NumPy's own from_dlpack refuses bfloat16
// and float8 (kDLBfloat, kDLFloat8_*), so capsules are read here.
#pragma once

#include <cstdint>

namespace pagedattn::python::dlpack {

struct Device {
  std::int32_t type;
  std::int32_t id;
};
struct DataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // elements; null: C-contiguous
  std::uint64_t byte_offset;
};
struct Managed {
  Tensor tensor;
  void* manager_ctx;
  void (*deleter)(Managed*);
};
struct Version {
  std::uint32_t major, minor;
};
struct ManagedVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedVersioned*);
  std::uint64_t flags;
  Tensor tensor;
};
constexpr std::uint64_t kReadOnlyFlag = 1;
enum Code : std::uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kComplex = 5,
  kBool = 6,
  kFloat8E4M3FN = 10,
  kFloat8E5M2 = 12,
};
// DLDeviceType values (kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged).
enum DeviceType : std::int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kROCMHost = 11,
  kCUDAManaged = 13,
};
// CPU memory: kDLCPU, kDLCUDAHost (pinned), kDLROCMHost.
inline bool host_device(std::int32_t type) {
  return type == kCPU || type == kCUDAHost || type == kROCMHost;
}

}  // namespace pagedattn::python::dlpack
