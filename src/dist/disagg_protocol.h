// The messages of disaggregated prefill/decode (see disagg.h) and their byte
// encoding. Both ranks run the same build on one machine or a homogeneous
// cluster, so fixed-width fields go in native byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {

// MPI tags. Pages of request i travel under kTagPagesBase + i % kPageTagSpan
// (tags stay below 32767, the smallest MPI_TAG_UB the standard allows).
inline constexpr int kTagConfig = 1;
inline constexpr int kTagRequest = 2;
inline constexpr int kTagAck = 3;
inline constexpr int kTagStatus = 4;
inline constexpr int kTagPagesBase = 100;
inline constexpr int kPageTagSpan = 30000;
inline int pages_tag(std::int64_t index) {
  return kTagPagesBase + static_cast<int>(index % kPageTagSpan);
}

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
  void put_string(const std::string& s) {
    put_vector(std::span<const char>(s.data(), s.size()));
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads what MessageWriter wrote; InternalError on a truncated message.
class MessageReader {
 public:
  explicit MessageReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    require<InternalError>(at_ + sizeof(T) <= bytes_.size(),
                           "disaggregated prefill/decode: a truncated message (", bytes_.size(),
                           " bytes)");
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> get_vector() {
    const auto n = get<std::int64_t>();
    require<InternalError>(n >= 0 && static_cast<std::size_t>(n) * sizeof(T) <= bytes_.size() - at_,
                           "disaggregated prefill/decode: a malformed message (", n, " elements)");
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
  std::size_t at_ = 0;
};

// prefill -> decode: a prefilled request, the end of requests, or the
// prefill rank's failure (between two requests: the decode rank then stops
// with its message instead of waiting).
inline constexpr std::int64_t kEndOfRequests = -1;
inline constexpr std::int64_t kPrefillFailed = -2;
struct RequestMessage {
  std::int64_t index = kEndOfRequests;
  std::int32_t first_token = 0;
  std::vector<std::int32_t> prompt;
  SamplingParams params;  // seed always set
  std::string error;      // kPrefillFailed: why

  std::vector<std::byte> encode() const;
  static RequestMessage decode(std::span<const std::byte> bytes);
};

enum class Ack : std::int32_t { kAccepted = 0, kRetry = 1, kRejected = 2 };
enum class TransferStatus : std::int32_t { kPagesFollow = 0, kCancelled = 1 };

struct AckMessage {
  Ack ack = Ack::kAccepted;
  std::string error;  // kRejected: why

  std::vector<std::byte> encode() const;
  static AckMessage decode(std::span<const std::byte> bytes);
};

}  // namespace pagedattn::dist
