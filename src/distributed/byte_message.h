// Flat byte messages for MPI: trivially copyable values and length-prefixed
// vectors of them, read back in the order they were written. Both ends run
// the same build (one machine or a homogeneous cluster), so values travel in
// native byte order and layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pagedattn/errors.h"

namespace pagedattn::dist {

class MessageWriter {
 public:
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_vector(std::span<const T> values) {
    put(static_cast<std::int64_t>(values.size()));
    for (const T& v : values) put(v);
  }
  void put_string(const std::string& s) { put_vector(std::span<const char>(s.data(), s.size())); }
  std::vector<std::byte>& bytes() { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads what MessageWriter wrote; InternalError naming `what` (the protocol)
// on a truncated or malformed message.
class MessageReader {
 public:
  MessageReader(std::span<const std::byte> bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    require<InternalError>(at_ + sizeof(T) <= bytes_.size(), what_, ": a truncated message (",
                           bytes_.size(), " bytes)");
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> get_vector() {
    const auto n = get<std::int64_t>();
    require<InternalError>(n >= 0 && std::uint64_t(n) <= (bytes_.size() - at_) / sizeof(T), what_,
                           ": a vector of ", n, " elements is longer than its message");
    std::vector<T> values(static_cast<std::size_t>(n));
    for (T& v : values) v = get<T>();
    return values;
  }
  std::string get_string() {
    const std::vector<char> chars = get_vector<char>();
    return {chars.begin(), chars.end()};
  }

 private:
  std::span<const std::byte> bytes_;
  const char* what_;
  std::size_t at_ = 0;
};

}  // namespace pagedattn::dist
