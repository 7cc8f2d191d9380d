// A small GGUF writer for tests: builds files in memory with any metadata
// and tensors, and lets a test write fields the reader must reject
// (bad offsets, raw type ids, odd versions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/gguf.h"

namespace pagedattn::test {

// Little-endian byte sink.
class ByteSink {
 public:
  template <typename T>
  ByteSink& put(T value) {
    return append(&value, sizeof(T));
  }
  ByteSink& put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    return append(s.data(), s.size());
  }
  ByteSink& put_bytes(const std::vector<std::byte>& b) { return append(b.data(), b.size()); }
  // resize + memcpy rather than insert: g++ 12 warns (stringop-overflow) on
  // inserting a few bytes into an empty vector.
  ByteSink& append(const void* data, std::size_t n) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + n);
    if (n != 0) std::memcpy(bytes_.data() + at, data, n);
    return *this;
  }
  void pad_to(std::size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(std::byte{0});
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

struct GgufTestTensor {
  std::string name;
  std::uint32_t type_id;
  std::vector<std::uint64_t> dims;
  std::vector<std::byte> data;
  std::optional<std::uint64_t> offset;  // default: packed, aligned
};

class GgufWriter {
 public:
  std::uint32_t version = 3;
  std::uint32_t alignment = 32;  // used for padding; write general.alignment to change the reader's

  // A value of `type` whose encoding `value` already is (no key, no type).
  GgufWriter& kv_raw(std::string_view key, GgufValueType type, std::vector<std::byte> value);
  GgufWriter& kv_u8(std::string_view key, std::uint8_t v);
  GgufWriter& kv_i8(std::string_view key, std::int8_t v);
  GgufWriter& kv_u16(std::string_view key, std::uint16_t v);
  GgufWriter& kv_i16(std::string_view key, std::int16_t v);
  GgufWriter& kv_u32(std::string_view key, std::uint32_t v);
  GgufWriter& kv_i32(std::string_view key, std::int32_t v);
  GgufWriter& kv_u64(std::string_view key, std::uint64_t v);
  GgufWriter& kv_i64(std::string_view key, std::int64_t v);
  GgufWriter& kv_f32(std::string_view key, float v);
  GgufWriter& kv_f64(std::string_view key, double v);
  GgufWriter& kv_bool(std::string_view key, bool v);
  GgufWriter& kv_string(std::string_view key, std::string_view v);
  GgufWriter& kv_string_array(std::string_view key, const std::vector<std::string>& v);
  GgufWriter& kv_i32_array(std::string_view key, const std::vector<std::int32_t>& v);
  GgufWriter& kv_f32_array(std::string_view key, const std::vector<float>& v);

  GgufWriter& tensor(GgufTestTensor t);
  void clear_tensors() { tensors_.clear(); }
  // A tensor of `type` with dims and deterministic bytes (valid scales;
  // F32 / F16 / BF16 hold finite values in [-1, 1]).
  GgufWriter& tensor(std::string name, GgufType type, std::vector<std::uint64_t> dims,
                     std::uint64_t seed = 1);

  std::vector<std::byte> build() const;

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<std::byte> value;
  };
  std::vector<Entry> entries_;
  std::vector<GgufTestTensor> tensors_;
};

// Encodes an array value (element type, count, elements).
std::vector<std::byte> encode_array(GgufValueType element_type, std::uint64_t count,
                                    const std::vector<std::byte>& elements);

// `blocks` blocks of `type` with random bytes whose f16 scales are finite
// (any bit pattern is otherwise a valid block).
std::vector<std::byte> random_blocks(GgufType type, std::int64_t blocks, std::uint64_t seed);

// A small decoder file (arch llama, qwen2, qwen3, gemma2, gemma3, phi3):
// every hyper-parameter and tensor read_model_config needs, with the weight
// types below (phi3's fused attn_qkv takes `q`, its fused ffn_up `up`).
struct TinyShape {
  std::uint32_t layers = 2, hidden = 64, heads = 4, kv_heads = 2, ff = 96, vocab = 10;
};
struct TinyTypes {
  GgufType embedding = GgufType::kQ8_0, output = GgufType::kQ4_0;
  GgufType q = GgufType::kQ4_1, k = GgufType::kQ4_1, v = GgufType::kQ8_0, o = GgufType::kF16;
  GgufType gate = GgufType::kBF16, up = GgufType::kQ4_0, down = GgufType::kQ8_0;
};
GgufWriter tiny_model(const std::string& arch, bool tied, bool biases, TinyShape s = {},
                      TinyTypes types = {});

}  // namespace pagedattn::test
