// GgufFile on files the tests write: every metadata type round trips, typed
// getters explain a wrong type, tensors are found with their bytes, open()
// maps a real file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {
namespace gguf_file_test {  // this file's own names in a unity batch

using test::expect_throws;
using test::GgufWriter;

std::span<const std::byte> view(const std::vector<std::byte>& b) {
  return {b.data(), b.size()};
}

GgufWriter every_metadata_type() {
  GgufWriter w;
  w.kv_u8("u8", 200).kv_i8("i8", -100).kv_u16("u16", 60000).kv_i16("i16", -30000);
  w.kv_u32("u32", 4000000000u).kv_i32("i32", -2000000000).kv_u64("u64", 1ull << 63);
  w.kv_i64("i64", std::numeric_limits<std::int64_t>::min()).kv_f32("f32", 0.1f).kv_f64("f64", 0.1);
  w.kv_bool("yes", true).kv_bool("no", false).kv_string("name", "SmolLM2 \xc3\xa9");
  w.kv_string("empty", "");
  w.kv_string_array("tokens", {"<s>", "", "hello world", "\xe2\x96\x81x"});
  w.kv_i32_array("types", {1, -2, 3});
  w.kv_f32_array("scores", {0.5f, -1.25f});
  // array[array[string]]: two inner arrays.
  test::ByteSink inner;
  std::vector<std::byte> a = test::encode_array(GgufValueType::kString, 0, {});
  test::ByteSink strings;
  strings.put_string("a").put_string("bc");
  std::vector<std::byte> b = test::encode_array(GgufValueType::kString, 2, strings.bytes());
  inner.put_bytes(a).put_bytes(b);
  w.kv_raw("nested", GgufValueType::kArray,
           test::encode_array(GgufValueType::kArray, 2, inner.bytes()));
  return w;
}

TEST(GgufFile, EveryMetadataTypeRoundTrips) {
  const std::vector<std::byte> bytes = every_metadata_type().build();
  const GgufFile f = GgufFile::parse(view(bytes), "meta.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 18u);
  EXPECT_EQ(f.keys().front(), "u8");
  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i32("i8"), -100);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i64("i16"), -30000);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("i32"), -2000000000);
  EXPECT_EQ(f.get_u64("u64"), 1ull << 63);
  EXPECT_EQ(f.get_i64("i64"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(f.get_f32("f32"), 0.1f);
  EXPECT_EQ(f.get_f64("f64"), 0.1);
  EXPECT_TRUE(f.get_bool("yes"));
  EXPECT_FALSE(f.get_bool("no"));
  EXPECT_EQ(f.get_string("name"), "SmolLM2 \xc3\xa9");
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_string_array("tokens"),
            (std::vector<std::string_view>{"<s>", "", "hello world", "\xe2\x96\x81x"}));
  EXPECT_EQ(f.get_int_array("types"), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("scores"), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(f.get_array_size("tokens"), 4u);
  const GgufValue& nested = f.get("nested");
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0].count, 0u);
  ASSERT_EQ(nested.items[1].items.size(), 2u);
  EXPECT_EQ(nested.items[1].items[1].string_value, "bc");
  EXPECT_EQ(nested.type_name(), "array[array[string]]");
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufFile, TypedGettersNameTheKeyAndTheTypes) {
  const std::vector<std::byte> bytes = every_metadata_type().build();
  const GgufFile f = GgufFile::parse(view(bytes), "meta.gguf");
  expect_throws<InvalidArgument>([&] { f.get_u32("llama.block_count"); },
                                 {"meta.gguf", "missing key 'llama.block_count'"});
  expect_throws<InvalidArgument>([&] { f.get_u32("name"); },
                                 {"key 'name' has type string, expected an integer"});
  expect_throws<InvalidArgument>([&] { f.get_u32("i8"); },
                                 {"key 'i8' value -100 does not fit uint32"});
  expect_throws<InvalidArgument>([&] { f.get_i32("u32"); }, {"4000000000 does not fit int32"});
  expect_throws<InvalidArgument>([&] { f.get_i64("u64"); }, {"does not fit int64"});
  expect_throws<InvalidArgument>([&] { f.get_f32("u8"); }, {"has type uint8, expected a float"});
  expect_throws<InvalidArgument>([&] { f.get_bool("u8"); }, {"expected bool"});
  expect_throws<InvalidArgument>([&] { f.get_string("yes"); }, {"has type bool, expected string"});
  expect_throws<InvalidArgument>([&] { f.get_string_array("types"); },
                                 {"has type array[int32], expected array[string]"});
  expect_throws<InvalidArgument>([&] { f.get_int_array("scores"); }, {"array[float32]"});
  expect_throws<InvalidArgument>([&] { f.get_float_array("tokens"); }, {"array[string]"});
  expect_throws<InvalidArgument>([&] { f.get_array_size("u8"); }, {"expected an array"});
  expect_throws<InvalidArgument>([&] { f.tensor("output.weight"); },
                                 {"missing tensor 'output.weight'"});
}

TEST(GgufFile, TensorsOfEveryTypeAreFoundWithTheirBytes) {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  const std::pair<GgufType, std::uint64_t> cases[] = {
      {GgufType::kF32, 3},    {GgufType::kF16, 5},   {GgufType::kBF16, 7},   {GgufType::kQ8_0, 32},
      {GgufType::kQ4_0, 64},  {GgufType::kQ4_1, 32}, {GgufType::kQ4_K, 256}, {GgufType::kQ5_K, 512},
      {GgufType::kQ6_K, 256}, {GgufType::kQ2_K, 256}};  // Q2_K: parsed, not dequantised
  std::vector<std::vector<std::byte>> data;
  int i = 0;
  for (auto [type, row] : cases) {
    const GgufTypeInfo& info = gguf_type_info(type);
    const std::uint64_t rows = 2 + static_cast<std::uint64_t>(i % 3);
    data.push_back(
        test::random_blocks(type, static_cast<std::int64_t>(row * rows) / info.block_size, 99 + i));
    w.tensor({"t." + std::string(info.name),
              static_cast<std::uint32_t>(type),
              {row, rows},
              data.back(),
              std::nullopt});
    ++i;
  }
  const std::vector<std::byte> bytes = w.build();
  const GgufFile f = GgufFile::parse(view(bytes));
  ASSERT_EQ(f.tensors().size(), std::size(cases));
  EXPECT_EQ(f.data_offset() % 32, 0u);
  i = 0;
  for (auto [type, row] : cases) {
    const GgufTensor& t = f.tensor("t." + std::string(gguf_type_info(type).name));
    EXPECT_EQ(t.type, type);
    EXPECT_EQ(t.dims, (std::vector<std::int64_t>{static_cast<std::int64_t>(row), 2 + i % 3}));
    ASSERT_EQ(static_cast<std::size_t>(t.nbytes), data[i].size());
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), data[i].size()), 0);
    EXPECT_EQ(
        reinterpret_cast<std::uintptr_t>(t.data) - reinterpret_cast<std::uintptr_t>(bytes.data()),
        f.data_offset() + t.offset);
    if (gguf_type_info(type).dequantizable) {
      const std::vector<float> all = f.dequantize(t);
      ASSERT_EQ(all.size(), static_cast<std::size_t>(t.element_count()));
      std::vector<float> row1(static_cast<std::size_t>(row));
      dequantize_row(type, t.data + gguf_row_bytes(type, t.row_length()), row1.data(),
                     t.row_length());
      EXPECT_EQ(std::memcmp(row1.data(), all.data() + row, row1.size() * 4), 0);
    } else {
      expect_throws<Unsupported>([&] { f.dequantize(t); }, {"t.Q2_K", "Q2_K"});
    }
    ++i;
  }
}

TEST(GgufFile, CustomAlignmentAndVersion2) {
  GgufWriter w;
  w.version = 2;
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  w.tensor("a", GgufType::kF32, {3});
  w.tensor("b", GgufType::kF32, {5});
  const std::vector<std::byte> bytes = w.build();
  const GgufFile f = GgufFile::parse(view(bytes));
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
}

TEST(GgufFile, OpenMapsAFileAndMoves) {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.tensor("x", GgufType::kQ8_0, {64, 2});
  w.tensor("big", GgufType::kF32, {4096, 8});  // spans whole pages
  const std::vector<std::byte> bytes = w.build();
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("pagedattn_gguf_test_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  GgufFile f = GgufFile::open(path.string());
  EXPECT_EQ(f.source_name(), path.string());
  GgufFile moved = std::move(f);
  const GgufTensor& t = moved.tensor("x");
  EXPECT_EQ(
      std::memcmp(t.data, bytes.data() + moved.data_offset(), static_cast<std::size_t>(t.nbytes)),
      0);
  EXPECT_EQ(moved.get_string("general.architecture"), "llama");
  // Released pages leave the resident set but the tensor still reads the
  // same (faulted back in from the file).
  const GgufTensor& big = moved.tensor("big");
  const std::vector<float> before = moved.dequantize(big);
  moved.release_pages(big);
  moved.release_pages(t);
  EXPECT_EQ(moved.dequantize(big), before);
  EXPECT_EQ(
      std::memcmp(t.data, bytes.data() + moved.data_offset(), static_cast<std::size_t>(t.nbytes)),
      0);
  std::filesystem::resize_file(path, 0);
  expect_throws<InvalidArgument>([&] { GgufFile::open(path.string()); }, {"file is empty"});
  std::filesystem::remove(path);
  expect_throws<InvalidArgument>([&] { GgufFile::open(path.string()); }, {"cannot open"});
  expect_throws<InvalidArgument>(
      [&] { GgufFile::open(std::filesystem::temp_directory_path().string()); },
      {"not a regular file (a directory)"});
}

// A FIFO is refused at once: opening it must not wait for a writer (which
// would hang generate and serve forever). ctest's timeout catches a hang.
TEST(GgufFile, OpenRefusesAFifoWithoutWaitingForAWriter) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pagedattn_fifo_" + std::to_string(::getpid()) + ".gguf");
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  expect_throws<InvalidArgument>([&] { GgufFile::open(path.string()); },
                                 {"not a regular file (a FIFO)"});
  std::filesystem::remove(path);
}

}  // namespace gguf_file_test
}  // namespace
}  // namespace pagedattn
