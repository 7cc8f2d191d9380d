// A read-only GGUF file (llama.cpp's model format, versions 2 and 3):
// header, metadata key/values, tensor infos and the tensor data, memory
// mapped.
//
// Layout (little-endian): "GGUF" | u32 version | u64 tensor_count |
// u64 kv_count | kv_count x (string key, u32 value type, value) |
// tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type,
// u64 offset) | padding to `general.alignment` (default 32) | tensor data.
// Strings are u64 length + bytes (no terminator); an array value is
// u32 element type + u64 count + elements (arrays may nest).
//
// Everything is validated when the file is opened: every length and count
// fits in the bytes that remain, dims * type size does not overflow, tensor
// data is aligned, inside the file and not overlapping, keys and tensor names
// are unique, types are known. A bad file throws InvalidArgument (corrupt or
// truncated) or Unsupported (valid but not handled here: big-endian files,
// version 1, unknown ggml types), naming the source, the byte offset and the
// key or tensor. No access ever goes outside the bytes given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagedattn/gguf_types.h"

namespace pagedattn {

// Metadata value types as stored in the file.
enum class GgufValueType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", ..., "float64", "array"; "unknown" for other values.
std::string_view gguf_value_type_name(GgufValueType type) noexcept;

// One metadata value. Strings view the file's bytes (valid while the
// GgufFile lives). A numeric array keeps a view of its little-endian
// elements; string arrays and nested arrays are split into `items`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  std::uint64_t uint_value = 0;   // kUint8..kUint64, kBool (0 / 1)
  std::int64_t int_value = 0;     // kInt8..kInt64
  double float_value = 0;         // kFloat32 (exactly widened), kFloat64
  std::string_view string_value;  // kString

  // kArray only:
  GgufValueType element_type = GgufValueType::kUint8;
  std::uint64_t count = 0;
  const std::byte* elements = nullptr;  // numeric / bool elements, count * size bytes
  std::vector<GgufValue> items;         // string or array elements, `count` of them

  bool is_integer() const noexcept;
  bool is_float() const noexcept {
    return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
  }
  // Human-readable type: "uint32", "array[string]", "array[array[int32]]"...
  std::string type_name() const;
};

// One tensor: ggml order, dims[0] is the contiguous (row) dimension; a
// matrix of `rows` x `cols` in row-major terms has dims {cols, rows}.
struct GgufTensor {
  std::string_view name;
  GgufType type = GgufType::kF32;
  std::vector<std::int64_t> dims;  // 1 to 4 entries, each >= 1
  std::uint64_t offset = 0;        // from the start of the data section
  const std::byte* data = nullptr;
  std::int64_t nbytes = 0;

  std::int64_t element_count() const noexcept;
  std::int64_t row_length() const noexcept { return dims.empty() ? 0 : dims[0]; }
  std::int64_t row_count() const noexcept;  // element_count() / row_length()
};

class GgufFile {
 public:
  // Maps and parses the file (POSIX mmap, read-only). InvalidArgument when it
  // cannot be opened or is not a valid GGUF file.
  static GgufFile open(const std::string& path);

  // Parses bytes the caller keeps alive and unchanged for the object's
  // lifetime (tests, fuzzing). `source_name` appears in error messages.
  static GgufFile parse(std::span<const std::byte> bytes, std::string source_name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& source_name() const noexcept { return source_name_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint32_t alignment() const noexcept { return alignment_; }
  std::uint64_t data_offset() const noexcept { return data_offset_; }  // from the file start
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

  // --- metadata ---
  // Keys in file order.
  const std::vector<std::string_view>& keys() const noexcept { return keys_; }
  bool has(std::string_view key) const noexcept { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const noexcept;
  // InvalidArgument "gguf <source>: missing key '<key>'".
  const GgufValue& get(std::string_view key) const;

  // Typed getters. Integers of any stored width are accepted when the value
  // fits the requested type; floats accept float32 and float64. Otherwise
  // InvalidArgument "key '<key>' has type string, expected an integer" or
  // "... value -1 does not fit uint32".
  std::uint32_t get_u32(std::string_view key) const;
  std::uint64_t get_u64(std::string_view key) const;
  std::int32_t get_i32(std::string_view key) const;
  std::int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;  // float64 values are rounded
  double get_f64(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;

  // Array getters: the key must hold an array of the matching kind
  // (strings; any integer type; float32/float64).
  std::vector<std::string_view> get_string_array(std::string_view key) const;
  std::vector<std::int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::uint64_t get_array_size(std::string_view key) const;

  // --- tensors ---
  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const noexcept { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const noexcept;
  // InvalidArgument "gguf <source>: missing tensor '<name>'".
  const GgufTensor& tensor(std::string_view name) const;

  // The whole tensor as f32 (dims[0] fastest); Unsupported for a type
  // without dequantisation.
  std::vector<float> dequantize(const GgufTensor& tensor) const;

  // For a loader that has copied `tensor` out: its whole pages of the file
  // mapping leave this process's resident memory (madvise MADV_DONTNEED),
  // so a model built tensor by tensor peaks near its own size instead of
  // its size plus the file's. The data stays valid: a later read faults the
  // pages back in from the file. No effect for parse()d buffers.
  void release_pages(const GgufTensor& tensor) const noexcept;

 private:
  struct Mapping;
  GgufFile();
  friend class GgufParser;

  std::unique_ptr<Mapping> mapping_;  // set by open(); owns the bytes
  std::string source_name_;
  std::span<const std::byte> bytes_;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::string_view> keys_;
  std::vector<GgufValue> values_;  // parallel to keys_
  std::unordered_map<std::string_view, std::size_t> key_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;
};

}  // namespace pagedattn
