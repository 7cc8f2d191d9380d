// Every way a GGUF file can be truncated, corrupt or unsupported is
// rejected with a typed error naming the key / tensor and the byte offset;
// nothing ever reads outside the bytes given (these tests also run under
// ASan + UBSan).
#include <gtest/gtest.h>

#include <random>

#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {

using test::expect_throws;
using test::GgufTestTensor;
using test::GgufWriter;

std::span<const std::byte> view(const std::vector<std::byte>& b) {
  return {b.data(), b.size()};
}

GgufWriter small_model() {
  GgufWriter w;
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 1);
  w.kv_f32("llama.rope.freq_base", 10000.0f).kv_bool("flag", true);
  w.kv_string_array("tokenizer.ggml.tokens", {"a", "bc"}).kv_i32_array("ids", {1, 2});
  w.tensor("token_embd.weight", GgufType::kQ4_0, {32, 2});
  w.tensor("norm", GgufType::kF32, {3});
  return w;
}

template <typename E = InvalidArgument>
std::string rejects(const std::vector<std::byte>& bytes,
                    std::initializer_list<std::string_view> parts) {
  return expect_throws<E>([&] { GgufFile::parse(view(bytes), "bad.gguf"); }, parts);
}

template <typename T>
void poke(std::vector<std::byte>& bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

TEST(GgufErrors, TruncationAtEveryByteIsRejected) {
  const std::vector<std::byte> full = small_model().build();
  ASSERT_NO_THROW(GgufFile::parse(view(full)));
  for (std::size_t size = 0; size < full.size(); ++size) {
    const std::vector<std::byte> prefix(full.begin(),
                                        full.begin() + static_cast<std::ptrdiff_t>(size));
    try {
      GgufFile::parse(view(prefix), "cut.gguf");
      ADD_FAILURE() << "a prefix of " << size << " bytes parsed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf: byte offset"), std::string::npos) << e.what();
    }
  }
}

TEST(GgufErrors, HeaderFields) {
  std::vector<std::byte> bytes = small_model().build();
  std::vector<std::byte> b = bytes;
  std::memcpy(b.data(), "GGML", 4);
  rejects(b, {"byte offset 0", "not a GGUF file: magic is 'GGML'"});
  b = bytes;
  poke<std::uint32_t>(b, 4, 1);
  rejects<Unsupported>(b, {"byte offset 4", "version 1 is not supported"});
  poke<std::uint32_t>(b, 4, 4);
  rejects(b, {"unknown GGUF version 4"});
  poke<std::uint32_t>(b, 4, 0x03000000);
  rejects<Unsupported>(b, {"big-endian"});
  b = bytes;
  poke<std::uint64_t>(b, 8, 1ull << 60);
  rejects(b, {"tensor count 1152921504606846976 cannot fit"});
  b = bytes;
  poke<std::uint64_t>(b, 16, ~0ull);
  rejects(b, {"metadata key/value count", "cannot fit"});
}

TEST(GgufErrors, HugeLengthsAndCounts) {
  std::vector<std::byte> b = small_model().build();
  poke<std::uint64_t>(b, 24, 1ull << 63);  // the first key's length
  rejects(b, {"metadata entry 0", "key length 9223372036854775808 exceeds"});

  GgufWriter w;
  w.kv_raw("bytes", GgufValueType::kArray,
           test::encode_array(GgufValueType::kUint8, 1ull << 60, {}));
  rejects(w.build(), {"key 'bytes'", "array of 1152921504606846976 uint8 needs more than"});
  GgufWriter s;
  s.kv_raw("strings", GgufValueType::kArray, test::encode_array(GgufValueType::kString, ~0ull, {}));
  rejects(s.build(), {"key 'strings'", "cannot fit"});
  GgufWriter n;
  test::ByteSink one;
  one.put<std::uint64_t>(1ull << 62);
  n.kv_raw("str", GgufValueType::kString, one.bytes());
  rejects(n.build(), {"key 'str'", "string value length 4611686018427387904 exceeds"});
}

TEST(GgufErrors, BadMetadataValues) {
  GgufWriter w;
  w.kv_raw("weird", static_cast<GgufValueType>(13), {std::byte{0}});
  rejects(w.build(), {"key 'weird'", "unknown metadata value type 13"});
  GgufWriter e;
  e.kv_raw("arr", GgufValueType::kArray, test::encode_array(static_cast<GgufValueType>(99), 0, {}));
  rejects(e.build(), {"key 'arr'", "unknown metadata value type 99"});
  GgufWriter b;
  b.kv_raw("flag", GgufValueType::kBool, {std::byte{2}});
  rejects(b.build(), {"key 'flag'", "bool value is 2"});
  GgufWriter d;
  d.kv_u32("k", 1).kv_string("k", "again");
  rejects(d.build(), {"key 'k'", "duplicate key"});
  GgufWriter a;
  a.kv_u32("general.alignment", 48);
  a.tensor("t", GgufType::kF32, {4});
  rejects(a.build(), {"general.alignment", "alignment 48 is not a power of two"});
  GgufWriter a0;
  a0.kv_u64("general.alignment", 32);
  rejects(a0.build(), {"general.alignment", "has type uint64, expected uint32"});
  // Arrays nested 9 deep.
  std::vector<std::byte> value = test::encode_array(GgufValueType::kUint8, 0, {});
  for (int depth = 0; depth < 8; ++depth)
    value = test::encode_array(GgufValueType::kArray, 1, value);
  GgufWriter deep;
  deep.kv_raw("deep", GgufValueType::kArray, value);
  rejects(deep.build(), {"key 'deep'", "nested deeper than 8"});
}

TEST(GgufErrors, BadTensorInfos) {
  const auto with = [](GgufTestTensor t) {
    GgufWriter w;
    w.tensor("ok", GgufType::kF32, {8});
    w.tensor(std::move(t));
    return w.build();
  };
  const std::vector<std::byte> f32x4(16);
  rejects(with({"dup", 0, {}, f32x4, std::nullopt}),
          {"tensor 'dup'", "dimension count 0 is not in [1, 4]"});
  rejects(with({"t5", 0, {1, 1, 1, 1, 4}, f32x4, std::nullopt}),
          {"tensor 't5'", "dimension count 5"});
  rejects(with({"z", 0, {4, 0}, f32x4, std::nullopt}), {"tensor 'z'", "dimension 1 is 0"});
  rejects(with({"big", 0, {1ull << 32, 1ull << 32}, f32x4, std::nullopt}),
          {"tensor 'big'", "dimension 1 = 4294967296 makes the element count overflow"});
  rejects(with({"bytes", 0, {1ull << 62}, f32x4, std::nullopt}),
          {"tensor 'bytes'", "size in bytes overflows"});
  rejects(with({"q", 2, {31}, f32x4, std::nullopt}),
          {"tensor 'q'", "row length 31 is not a multiple of the Q4_0 block size 32"});
  rejects<Unsupported>(with({"u", 77, {4}, f32x4, std::nullopt}),
                       {"tensor 'u'", "unknown ggml type id 77"});
  rejects(with({"mis", 0, {4}, f32x4, 36}),
          {"tensor 'mis'", "data offset 36 is not a multiple of the alignment 32"});
  rejects(with({"far", 0, {4}, f32x4, 1ull << 40}),
          {"tensor 'far'", "runs past the end of the data section"});
  rejects(with({"over", 0, {4}, f32x4, 0}), {"tensor 'over'", "overlaps tensor 'ok'"});
  rejects(with({"ok", 0, {4}, f32x4, std::nullopt}), {"tensor 'ok'", "duplicate tensor name"});
  const std::string message = rejects(with({"mis", 0, {4}, f32x4, 36}), {"byte offset"});
  EXPECT_NE(message.find("bad.gguf: byte offset "), std::string::npos) << message;
}

TEST(GgufErrors, RandomCorruptionThrowsOrParsesNeverCrashes) {
  const std::vector<std::byte> full = small_model().build();
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) b[rng() % b.size()] = static_cast<std::byte>(rng() & 0xff);
    if (trial % 3 == 0) b.resize(rng() % (b.size() + 1));
    try {
      const GgufFile f = GgufFile::parse(view(b));
      for (const GgufTensor& t : f.tensors())
        if (gguf_type_info(t.type).dequantizable) (void)f.dequantize(t);
      for (std::string_view key : f.keys()) (void)f.get(key).type_name();
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace pagedattn
