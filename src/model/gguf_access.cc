// GgufFile: opening (mmap), typed metadata getters and tensor lookup.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/own_thread.h"
#include "model/gguf_bytes.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"

namespace pagedattn {

// A read-only private mapping of a whole file, unmapped on destruction.
struct GgufFile::Mapping {
  void* address = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, size);
  }
};

namespace {

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() { close(fd); }
};

std::string errno_text() {
  return std::strerror(errno);
}

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

using gguf_detail::load;

}  // namespace

void GgufFile::release_pages(const GgufTensor& tensor) const noexcept {
  if (mapping_ == nullptr || tensor.nbytes == 0) return;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(tensor.data);
  const std::uintptr_t first = (begin + page - 1) / page * page;      // whole pages only: the
  const std::uintptr_t last = (begin + tensor.nbytes) / page * page;  // neighbours' stay
  if (last > first)
    madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // best effort
}

GgufFile GgufFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO or a device must not wait for a writer before
  // the type check below refuses it (it changes nothing for a regular file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  require(fd >= 0, "gguf ", path, ": cannot open: ", errno_text());
  FdCloser closer{fd};
  struct stat info {};
  require(fstat(fd, &info) == 0, "gguf ", path, ": cannot stat: ", errno_text());
  require(S_ISREG(info.st_mode), "gguf ", path, ": not a regular file (",
          file_type_name(info.st_mode), ")");
  require(info.st_size > 0, "gguf ", path, ": file is empty (0 bytes)");
  auto mapping = std::make_unique<Mapping>();
  mapping->size = static_cast<std::size_t>(info.st_size);
  void* address = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
  require(address != MAP_FAILED, "gguf ", path, ": mmap of ", mapping->size,
          " bytes failed: ", errno_text());
  mapping->address = address;
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(address), mapping->size);
  GgufFile file = parse(bytes, path);
  file.mapping_ = std::move(mapping);
  return file;
}

GgufFile::GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

// --- value types ---------------------------------------------------------

std::string_view gguf_value_type_name(GgufValueType type) noexcept {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const noexcept {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

std::string GgufValue::type_name() const {
  if (type != GgufValueType::kArray) return std::string(gguf_value_type_name(type));
  if (element_type == GgufValueType::kArray) {
    // Describe the first nested array (elements may differ; the first is typical).
    return items.empty() ? "array[array]" : "array[" + items.front().type_name() + "]";
  }
  return "array[" + std::string(gguf_value_type_name(element_type)) + "]";
}

namespace {

bool is_signed_integer(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

// Element i of a numeric array as a value of its element type.
GgufValue array_element(const GgufValue& array, std::uint64_t i) {
  GgufValue v;
  v.type = array.element_type;
  switch (array.element_type) {
    case GgufValueType::kUint8:
      v.uint_value = load<std::uint8_t>(array.elements + i);
      break;
    case GgufValueType::kBool:
      v.uint_value = load<std::uint8_t>(array.elements + i);
      break;
    case GgufValueType::kInt8:
      v.int_value = load<std::int8_t>(array.elements + i);
      break;
    case GgufValueType::kUint16:
      v.uint_value = load<std::uint16_t>(array.elements + 2 * i);
      break;
    case GgufValueType::kInt16:
      v.int_value = load<std::int16_t>(array.elements + 2 * i);
      break;
    case GgufValueType::kUint32:
      v.uint_value = load<std::uint32_t>(array.elements + 4 * i);
      break;
    case GgufValueType::kInt32:
      v.int_value = load<std::int32_t>(array.elements + 4 * i);
      break;
    case GgufValueType::kFloat32:
      v.float_value = load<float>(array.elements + 4 * i);
      break;
    case GgufValueType::kUint64:
      v.uint_value = load<std::uint64_t>(array.elements + 8 * i);
      break;
    case GgufValueType::kInt64:
      v.int_value = load<std::int64_t>(array.elements + 8 * i);
      break;
    case GgufValueType::kFloat64:
      v.float_value = load<double>(array.elements + 8 * i);
      break;
    default:
      break;
  }
  return v;
}

}  // namespace

// --- metadata getters ----------------------------------------------------

const GgufValue* GgufFile::find(std::string_view key) const noexcept {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &values_[it->second];
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* value = find(key);
  require(value != nullptr, "gguf ", source_name_, ": missing key '", key, "'");
  return *value;
}

namespace {

// The integer value of `v` within [lo, hi], else InvalidArgument naming the key.
std::int64_t checked_int(const std::string& source, std::string_view key, const GgufValue& v,
                         std::string_view wanted, long double lo, long double hi) {
  require(v.is_integer(), "gguf ", source, ": key '", key, "' has type ", v.type_name(),
          ", expected an integer (", wanted, ")");
  const long double value = is_signed_integer(v.type) ? static_cast<long double>(v.int_value)
                                                      : static_cast<long double>(v.uint_value);
  if (value < lo || value > hi) {
    if (is_signed_integer(v.type))
      throw InvalidArgument(detail::concat("gguf ", source, ": key '", key, "' value ", v.int_value,
                                           " does not fit ", wanted));
    throw InvalidArgument(detail::concat("gguf ", source, ": key '", key, "' value ", v.uint_value,
                                         " does not fit ", wanted));
  }
  return is_signed_integer(v.type) ? v.int_value : static_cast<std::int64_t>(v.uint_value);
}

}  // namespace

std::uint32_t GgufFile::get_u32(std::string_view key) const {
  return static_cast<std::uint32_t>(checked_int(source_name_, key, get(key), "uint32", 0,
                                                std::numeric_limits<std::uint32_t>::max()));
}

std::uint64_t GgufFile::get_u64(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type == GgufValueType::kUint64) return v.uint_value;
  return static_cast<std::uint64_t>(
      checked_int(source_name_, key, v, "uint64", 0, std::numeric_limits<std::int64_t>::max()));
}

std::int32_t GgufFile::get_i32(std::string_view key) const {
  return static_cast<std::int32_t>(checked_int(source_name_, key, get(key), "int32",
                                               std::numeric_limits<std::int32_t>::min(),
                                               std::numeric_limits<std::int32_t>::max()));
}

std::int64_t GgufFile::get_i64(std::string_view key) const {
  return checked_int(source_name_, key, get(key), "int64", std::numeric_limits<std::int64_t>::min(),
                     std::numeric_limits<std::int64_t>::max());
}

double GgufFile::get_f64(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.is_float(), "gguf ", source_name_, ": key '", key, "' has type ", v.type_name(),
          ", expected a float (float32 or float64)");
  return v.float_value;
}

float GgufFile::get_f32(std::string_view key) const {
  return static_cast<float>(get_f64(key));
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufValueType::kBool, "gguf ", source_name_, ": key '", key, "' has type ",
          v.type_name(), ", expected bool");
  return v.uint_value != 0;
}

std::string_view GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufValueType::kString, "gguf ", source_name_, ": key '", key, "' has type ",
          v.type_name(), ", expected string");
  return v.string_value;
}

std::uint64_t GgufFile::get_array_size(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufValueType::kArray, "gguf ", source_name_, ": key '", key, "' has type ",
          v.type_name(), ", expected an array");
  return v.count;
}

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufValueType::kArray && v.element_type == GgufValueType::kString, "gguf ",
          source_name_, ": key '", key, "' has type ", v.type_name(), ", expected array[string]");
  std::vector<std::string_view> out;
  out.reserve(v.items.size());
  for (const GgufValue& item : v.items) out.push_back(item.string_value);
  return out;
}

std::vector<std::int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = get(key);
  GgufValue probe;
  probe.type = v.element_type;
  require(v.type == GgufValueType::kArray && probe.is_integer(), "gguf ", source_name_, ": key '",
          key, "' has type ", v.type_name(), ", expected an array of integers");
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(v.count));
  for (std::uint64_t i = 0; i < v.count; ++i) {
    const GgufValue element = array_element(v, i);
    if (is_signed_integer(element.type)) {
      out.push_back(element.int_value);
    } else {
      require(element.uint_value <=
                  static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
              "gguf ", source_name_, ": key '", key, "' element ", i, " = ", element.uint_value,
              " does not fit int64");
      out.push_back(static_cast<std::int64_t>(element.uint_value));
    }
  }
  return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufValueType::kArray && (v.element_type == GgufValueType::kFloat32 ||
                                              v.element_type == GgufValueType::kFloat64),
          "gguf ", source_name_, ": key '", key, "' has type ", v.type_name(),
          ", expected an array of floats");
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(v.count));
  for (std::uint64_t i = 0; i < v.count; ++i)
    out.push_back(static_cast<float>(array_element(v, i).float_value));
  return out;
}

// --- tensors -------------------------------------------------------------

std::int64_t GgufTensor::element_count() const noexcept {
  std::int64_t count = 1;
  for (std::int64_t d : dims) count *= d;  // checked against overflow by the parser
  return count;
}

std::int64_t GgufTensor::row_count() const noexcept {
  return dims.empty() ? 0 : element_count() / dims[0];
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const noexcept {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  require(t != nullptr, "gguf ", source_name_, ": missing tensor '", name, "'");
  return *t;
}

std::vector<float> GgufFile::dequantize(const GgufTensor& t) const {
  const GgufTypeInfo& info = gguf_type_info(t.type);
  require<Unsupported>(info.dequantizable, "gguf ", source_name_, ": tensor '", t.name,
                       "' has type ", info.name, ", which pagedattn cannot dequantise");
  std::vector<float> out(static_cast<std::size_t>(t.element_count()));
  const std::int64_t rows = t.row_count();
  const std::int64_t row_bytes = gguf_row_bytes(t.type, t.row_length());
  // Threads only for big tensors (a parallel region costs more than a small
  // one), and on a thread of their own: the loading thread keeps no team.
  const bool parallel = t.element_count() >= (std::int64_t{1} << 20);
  core::run_on_own_thread_if(parallel, [&] {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t r = 0; r < rows; ++r)
      dequantize_row(t.type, t.data + r * row_bytes, out.data() + r * t.row_length(),
                     t.row_length());
  });
  return out;
}

}  // namespace pagedattn
