#include "chatml_codec.h"

#include <cstddef>

#include "model/gguf_writer.h"
#include "pagedattn/gguf.h"

namespace pagedattn::serve::testing {
namespace {

// GPT-2's byte symbols: printable Latin-1 bytes stand for themselves, the
// others map to U+0100 upwards in order.
std::vector<std::string> byte_level_symbols() {
  std::vector<std::string> symbols;
  int next_unprintable = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int code_point = printable ? b : next_unprintable++;
    std::string utf8;
    if (code_point < 0x80) {
      utf8 += static_cast<char>(code_point);
    } else {
      utf8 += static_cast<char>(0xC0 | (code_point >> 6));
      utf8 += static_cast<char>(0x80 | (code_point & 0x3F));
    }
    symbols.push_back(utf8);
  }
  return symbols;
}

}  // namespace

std::unique_ptr<TextCodec> make_chatml_codec(SpecialTokenPolicy policy, ChatmlVocab vocab) {
  std::vector<std::string> tokens = kChatmlControls;
  std::vector<std::int32_t> types(tokens.size(), 3);  // control
  for (const std::string& symbol : byte_level_symbols()) {
    tokens.push_back(symbol);
    types.push_back(1);  // normal
  }
  if (!vocab.user_defined.empty()) {
    tokens.push_back(vocab.user_defined);
    types.push_back(4);  // user-defined: matched wherever it appears
  }
  // Never produced by encoding (no merge makes them); a model may generate them.
  while (std::ssize(tokens) < vocab.vocab_size) {
    tokens.push_back("pad" + std::to_string(tokens.size()));
    types.push_back(1);
  }
  test::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", "smollm");
  w.kv_string_array("tokenizer.ggml.tokens", tokens);
  w.kv_i32_array("tokenizer.ggml.token_type", types);
  w.kv_string_array("tokenizer.ggml.merges", {});
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_string("tokenizer.chat_template",
              "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
              "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
              "%}{{ '<|im_start|>assistant\n' }}{% endif %}");
  const std::vector<std::byte> bytes = w.build();
  return make_gguf_codec(GgufFile::parse(bytes, "chatml-tokenizer.gguf"), policy);
}

}  // namespace pagedattn::serve::testing
