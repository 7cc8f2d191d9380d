// GGUF parsing and validation (see include/pagedattn/gguf.h for the layout).
// Every read goes through ByteReader, which checks the bytes are there before
// touching them; counts are checked against the bytes that remain before
// anything is reserved, so a corrupt header cannot cause a huge allocation.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "model/gguf_bytes.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"

namespace pagedattn {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;             // nested arrays deeper than this are rejected
constexpr std::uint32_t kMaxDims = 4;

std::size_t scalar_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;  // string, array: variable size
  }
}

bool is_known_value_type(std::uint32_t raw) {
  return raw <= 12;
}

using gguf_detail::load;

}  // namespace

// Parses one file; holds the cursor and the context for error messages.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file) : file_(file), bytes_(file.bytes_) {}

  void parse() {
    parse_header();
    parse_metadata();
    read_alignment();
    parse_tensor_infos();
    place_tensor_data();
  }

 private:
  GgufFile& file_;
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
  std::string context_;  // "key 'x'" or "tensor 'y'", for messages

  template <typename... Parts>
  [[noreturn]] void fail(std::size_t offset, const Parts&... parts) const {
    throw InvalidArgument(detail::concat("gguf ", file_.source_name_, ": byte offset ", offset,
                                         context_.empty() ? "" : ": ", context_, ": ", parts...));
  }
  template <typename... Parts>
  [[noreturn]] void unsupported(std::size_t offset, const Parts&... parts) const {
    throw Unsupported(detail::concat("gguf ", file_.source_name_, ": byte offset ", offset,
                                     context_.empty() ? "" : ": ", context_, ": ", parts...));
  }

  std::size_t remaining() const { return bytes_.size() - pos_; }

  void need(std::uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail(pos_, "truncated: ", what, " needs ", n, " bytes but the file has ", remaining(),
           " left (file size ", bytes_.size(), ")");
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    const T value = load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return value;
  }

  std::string_view read_string(std::string_view what) {
    const std::size_t start = pos_;
    const auto length = read<std::uint64_t>(what);
    if (length > remaining())
      fail(start, what, " length ", length, " exceeds the ", remaining(),
           " bytes left (truncated or corrupt)");
    const auto* chars = reinterpret_cast<const char*>(bytes_.data() + pos_);
    pos_ += static_cast<std::size_t>(length);
    return {chars, static_cast<std::size_t>(length)};
  }

  void parse_header() {
    const auto magic = read<std::uint32_t>("magic");
    if (magic != kMagic) {
      std::string shown;
      for (int i = 0; i < 4; ++i) {
        const auto c = static_cast<unsigned char>(bytes_[static_cast<std::size_t>(i)]);
        shown += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
      }
      fail(0, "not a GGUF file: magic is '", shown, "', expected 'GGUF'");
    }
    const auto version = read<std::uint32_t>("version");
    if ((version & 0xffffu) == 0 && version != 0)
      unsupported(4, "big-endian GGUF files are not supported (version field ", version, ")");
    if (version == 1) unsupported(4, "GGUF version 1 is not supported (only 2 and 3)");
    if (version != 2 && version != 3)
      fail(4, "unknown GGUF version ", version, " (supported: 2 and 3)");
    file_.version_ = version;
    tensor_count_ = read<std::uint64_t>("tensor count");
    kv_count_ = read<std::uint64_t>("metadata key/value count");
    // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes, each
    // tensor info at least 8 + 4 + 8 + 4 + 8.
    if (kv_count_ > remaining() / 13)
      fail(16, "metadata key/value count ", kv_count_, " cannot fit in the ", remaining(),
           " bytes left");
    if (tensor_count_ > remaining() / 32)
      fail(8, "tensor count ", tensor_count_, " cannot fit in the ", remaining(), " bytes left");
  }

  GgufValueType read_value_type(std::string_view what) {
    const std::size_t at = pos_;
    const auto raw = read<std::uint32_t>(what);
    if (!is_known_value_type(raw)) fail(at, "unknown metadata value type ", raw);
    return static_cast<GgufValueType>(raw);
  }

  GgufValue read_value(GgufValueType type, int depth) {
    GgufValue value;
    value.type = type;
    const std::byte* p = bytes_.data() + pos_;
    switch (type) {
      case GgufValueType::kString:
        value.string_value = read_string("string value");
        return value;
      case GgufValueType::kArray:
        read_array(value, depth);
        return value;
      case GgufValueType::kBool: {
        const std::size_t at = pos_;
        const auto raw = read<std::uint8_t>("bool value");
        if (raw > 1) fail(at, "bool value is ", static_cast<int>(raw), ", expected 0 or 1");
        value.uint_value = raw;
        return value;
      }
      default:
        break;
    }
    need(scalar_size(type), "value");
    pos_ += scalar_size(type);
    switch (type) {
      case GgufValueType::kUint8:
        value.uint_value = load<std::uint8_t>(p);
        break;
      case GgufValueType::kUint16:
        value.uint_value = load<std::uint16_t>(p);
        break;
      case GgufValueType::kUint32:
        value.uint_value = load<std::uint32_t>(p);
        break;
      case GgufValueType::kUint64:
        value.uint_value = load<std::uint64_t>(p);
        break;
      case GgufValueType::kInt8:
        value.int_value = load<std::int8_t>(p);
        break;
      case GgufValueType::kInt16:
        value.int_value = load<std::int16_t>(p);
        break;
      case GgufValueType::kInt32:
        value.int_value = load<std::int32_t>(p);
        break;
      case GgufValueType::kInt64:
        value.int_value = load<std::int64_t>(p);
        break;
      case GgufValueType::kFloat32:
        value.float_value = load<float>(p);
        break;
      case GgufValueType::kFloat64:
        value.float_value = load<double>(p);
        break;
      default:
        break;
    }
    return value;
  }

  void read_array(GgufValue& value, int depth) {
    const std::size_t at = pos_;
    if (depth >= kMaxArrayDepth) fail(at, "arrays nested deeper than ", kMaxArrayDepth);
    value.element_type = read_value_type("array element type");
    value.count = read<std::uint64_t>("array length");
    const std::size_t element_size = scalar_size(value.element_type);
    if (element_size != 0) {
      if (value.count > remaining() / element_size)
        fail(at, "array of ", value.count, " ", gguf_value_type_name(value.element_type),
             " needs more than the ", remaining(), " bytes left (truncated or corrupt)");
      value.elements = bytes_.data() + pos_;
      if (value.element_type == GgufValueType::kBool) {
        for (std::uint64_t i = 0; i < value.count; ++i)
          if (static_cast<std::uint8_t>(value.elements[i]) > 1)
            fail(pos_ + i, "bool array element ", i, " is not 0 or 1");
      }
      pos_ += static_cast<std::size_t>(value.count * element_size);
      return;
    }
    // Strings take >= 8 bytes each, nested arrays >= 12.
    const std::size_t min_size = value.element_type == GgufValueType::kString ? 8 : 12;
    if (value.count > remaining() / min_size)
      fail(at, "array of ", value.count, " ", gguf_value_type_name(value.element_type),
           " cannot fit in the ", remaining(), " bytes left (truncated or corrupt)");
    value.items.reserve(static_cast<std::size_t>(value.count));
    for (std::uint64_t i = 0; i < value.count; ++i)
      value.items.push_back(read_value(value.element_type, depth + 1));
  }

  void parse_metadata() {
    file_.keys_.reserve(static_cast<std::size_t>(kv_count_));
    file_.values_.reserve(static_cast<std::size_t>(kv_count_));
    for (std::uint64_t i = 0; i < kv_count_; ++i) {
      const std::size_t at = pos_;
      context_ = detail::concat("metadata entry ", i);
      const std::string_view key = read_string("key");
      context_ = detail::concat("key '", key, "'");
      if (file_.key_index_.count(key) != 0) fail(at, "duplicate key");
      const GgufValueType type = read_value_type("value type");
      file_.values_.push_back(read_value(type, 0));
      file_.keys_.push_back(key);
      file_.key_index_.emplace(key, file_.values_.size() - 1);
    }
    context_.clear();
  }

  void read_alignment() {
    const GgufValue* value = file_.find("general.alignment");
    if (value == nullptr) return;
    context_ = "key 'general.alignment'";
    if (value->type != GgufValueType::kUint32)
      fail(0, "has type ", value->type_name(), ", expected uint32");
    const std::uint64_t alignment = value->uint_value;
    if (alignment == 0 || !std::has_single_bit(alignment))
      fail(0, "alignment ", alignment, " is not a power of two");
    file_.alignment_ = static_cast<std::uint32_t>(alignment);
    context_.clear();
  }

  void parse_tensor_infos() {
    file_.tensors_.reserve(static_cast<std::size_t>(tensor_count_));
    for (std::uint64_t i = 0; i < tensor_count_; ++i) {
      const std::size_t at = pos_;
      context_ = detail::concat("tensor info ", i);
      GgufTensor tensor;
      tensor.name = read_string("tensor name");
      context_ = detail::concat("tensor '", tensor.name, "'");
      if (file_.tensor_index_.count(tensor.name) != 0) fail(at, "duplicate tensor name");
      const std::size_t dims_at = pos_;
      const auto n_dims = read<std::uint32_t>("dimension count");
      if (n_dims == 0 || n_dims > kMaxDims)
        fail(dims_at, "dimension count ", n_dims, " is not in [1, ", kMaxDims, "]");
      std::uint64_t elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const std::size_t dim_at = pos_;
        const auto dim = read<std::uint64_t>("dimension");
        if (dim == 0) fail(dim_at, "dimension ", d, " is 0");
        if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / elements)
          fail(dim_at, "dimension ", d, " = ", dim, " makes the element count overflow");
        elements *= dim;
        tensor.dims.push_back(static_cast<std::int64_t>(dim));
      }
      const std::size_t type_at = pos_;
      const auto type_id = read<std::uint32_t>("tensor type");
      const GgufTypeInfo* info = find_gguf_type(type_id);
      if (info == nullptr) unsupported(type_at, "unknown ggml type id ", type_id);
      tensor.type = info->type;
      if (tensor.dims[0] % info->block_size != 0)
        fail(dims_at, "row length ", tensor.dims[0], " is not a multiple of the ", info->name,
             " block size ", info->block_size);
      const std::uint64_t blocks = elements / static_cast<std::uint64_t>(info->block_size);
      const auto block_bytes = static_cast<std::uint64_t>(info->block_bytes);
      if (blocks >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / block_bytes)
        fail(dims_at, "size in bytes overflows (", elements, " ", info->name, " elements)");
      tensor.nbytes = static_cast<std::int64_t>(blocks * block_bytes);
      const std::size_t offset_at = pos_;
      tensor.offset = read<std::uint64_t>("tensor data offset");
      if (tensor.offset % file_.alignment_ != 0)
        fail(offset_at, "data offset ", tensor.offset, " is not a multiple of the alignment ",
             file_.alignment_);
      file_.tensors_.push_back(std::move(tensor));
      file_.tensor_index_.emplace(file_.tensors_.back().name, file_.tensors_.size() - 1);
      offset_positions_.push_back(offset_at);
    }
    context_.clear();
  }

  void place_tensor_data() {
    const std::uint64_t alignment = file_.alignment_;
    const std::uint64_t data_offset = (pos_ + alignment - 1) / alignment * alignment;
    file_.data_offset_ = data_offset;
    if (file_.tensors_.empty()) return;
    if (data_offset > bytes_.size())
      fail(pos_, "truncated: the tensor data section (aligned to ", alignment, ") would start at ",
           data_offset, ", past the end of the file (size ", bytes_.size(), ")");
    const std::uint64_t data_size = bytes_.size() - data_offset;
    for (std::size_t i = 0; i < file_.tensors_.size(); ++i) {
      GgufTensor& tensor = file_.tensors_[i];
      context_ = detail::concat("tensor '", tensor.name, "'");
      const auto nbytes = static_cast<std::uint64_t>(tensor.nbytes);
      if (tensor.offset > data_size || nbytes > data_size - tensor.offset)
        fail(offset_positions_[i], "data [", tensor.offset, ", +", nbytes,
             ") runs past the end of the data section (", data_size,
             " bytes; truncated or corrupt)");
      tensor.data = bytes_.data() + data_offset + tensor.offset;
    }
    check_no_overlap();
    context_.clear();
  }

  void check_no_overlap() {
    std::vector<std::size_t> order(file_.tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    const auto& tensors = file_.tensors_;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return tensors[a].offset != tensors[b].offset ? tensors[a].offset < tensors[b].offset : a < b;
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const GgufTensor& previous = tensors[order[k - 1]];
      const GgufTensor& current = tensors[order[k]];
      if (previous.offset + static_cast<std::uint64_t>(previous.nbytes) > current.offset) {
        context_ = detail::concat("tensor '", current.name, "'");
        fail(offset_positions_[order[k]], "data at offset ", current.offset, " overlaps tensor '",
             previous.name, "' [", previous.offset, ", +", previous.nbytes, ")");
      }
    }
  }

  std::uint64_t tensor_count_ = 0;
  std::uint64_t kv_count_ = 0;
  std::vector<std::size_t> offset_positions_;  // file offset of each tensor's offset field
};

GgufFile GgufFile::parse(std::span<const std::byte> bytes, std::string source_name) {
  GgufFile file;
  file.source_name_ = std::move(source_name);
  file.bytes_ = bytes;
  GgufParser(file).parse();
  return file;
}

}  // namespace pagedattn
