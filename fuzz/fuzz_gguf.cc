// libFuzzer harness: the bytes are a GGUF file. Parsing must either succeed
// or throw a pagedattn::Error; a parsed file's metadata, tensors (small ones
// dequantised), Llama config and tokenizer (built, then used on a short text)
// must all be readable without any other failure or out-of-bounds access.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"
#include "pagedattn/gguf_tokenizer.h"

namespace pagedattn::fuzz {
namespace {

// Runs `call`; a pagedattn::Error (bad or unsupported input) is fine.
template <typename Call>
void tolerate_errors(Call&& call) {
  try {
    call();
  } catch (const Error&) {
  }
}

void exercise(const GgufFile& file) {
  for (std::string_view key : file.keys()) (void)file.get(key).type_name();
  for (const GgufTensor& t : file.tensors())
    if (t.element_count() <= 4096) tolerate_errors([&] { (void)file.dequantize(t); });
  tolerate_errors([&] { (void)read_model_config(file); });
  tolerate_errors([&] {
    const Tokenizer tokenizer(read_tokenizer_vocab(file));
    const auto ids =
        tokenizer.encode("Hello, world! 123 \xe2\x96\x81\xff", {.parse_special = true});
    (void)tokenizer.decode(ids);
    tolerate_errors([&] {
      (void)read_chat_template(file, tokenizer).render({{"user", "hi"}}, true);
    });
  });
}

}  // namespace
}  // namespace pagedattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    pagedattn::fuzz::exercise(pagedattn::GgufFile::parse(bytes, "fuzz.gguf"));
  } catch (const pagedattn::Error&) {
  }
  return 0;
}
