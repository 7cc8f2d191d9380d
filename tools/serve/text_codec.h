// Text <-> token ids for the server. A GGUF model brings its tokenizer and
// chat template; a synthetic preset has no vocabulary, so it gets a byte
// codec: text encodes to its UTF-8 bytes (token id = byte value) and a
// generated id decodes to that ASCII character when it is printable (or \t,
// \n), else to the text "<id>". Generated text is therefore always valid
// UTF-8 for presets; for GGUF models it is whatever the tokens spell
// (StreamingDecoder holds back split characters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/chat_template.h"

namespace pagedattn {
class GgufFile;
}

namespace pagedattn::serve {

// Decodes one sample's generated tokens incrementally.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(std::int32_t id) = 0;  // text that became complete
  virtual std::string flush() = 0;                // whatever was held back
};

// A text refused by its length alone: every token stands for at most
// `max_token_bytes` bytes of it, so it needs more tokens than were allowed.
class TextTooLong : public std::length_error {
 public:
  TextTooLong(std::size_t text_bytes, std::size_t max_token_bytes);
  std::size_t text_bytes() const { return text_bytes_; }
  std::size_t max_token_bytes() const { return max_token_bytes_; }

 private:
  std::size_t text_bytes_;
  std::size_t max_token_bytes_;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // `max_tokens`: a text whose byte length shows that it needs more tokens
  // than this is refused with TextTooLong before it is tokenized, so the
  // tokenizer's work and memory stay within what a context can hold, however
  // large the text. One that passes is tokenized whole and may still come
  // out longer: the caller checks the count. Control-token text in `text`
  // ("<|im_start|>") becomes control tokens unless the codec's
  // SpecialTokenPolicy says otherwise.
  virtual std::vector<std::int32_t> encode(std::string_view text,
                                           std::int64_t max_tokens) const = 0;
  // The conversation rendered as a prompt that asks for the assistant's turn,
  // its rendered text checked against `max_tokens` as in encode(). Control-
  // token text inside a message's role or content stays plain text unless the
  // codec was made to trust messages. InvalidArgument for a role the model's
  // template cannot express.
  virtual std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                                std::int64_t max_tokens) const = 0;
  virtual std::unique_ptr<TextStream> decoder() const = 0;
  // The bytes one token stands for alone, control tokens as their text
  // ("<|im_end|>"): what logprobs show for a token. A piece of a character
  // split across tokens is its bytes, not valid UTF-8 on its own.
  virtual std::string token_text(std::int32_t id) const = 0;
  // Tokens that end a turn (EOS, end-of-turn controls); never shown as text.
  virtual std::vector<std::int32_t> stop_token_ids() const = 0;
};

// Presets: the byte codec described above; InvalidArgument if vocab_size < 256.
std::unique_ptr<TextCodec> make_byte_codec(std::int32_t vocab_size, std::int32_t eos_token_id);
// Which text may become control tokens (docs/serve.md, "Special tokens").
struct SpecialTokenPolicy {
  // A raw text prompt (completions): control-token text becomes control
  // tokens, as in vLLM, transformers and llama.cpp (--no-parse-special-in-prompts: plain text).
  bool parse_special_in_prompts = true;
  // Chat messages (--parse-special-in-messages): lets clients write raw turn
  // markers, and so forge turns; only for trusted clients.
  bool parse_special_in_messages = false;
};

// GGUF models: the file's tokenizer and chat template (no template: chat
// requests are refused with InvalidArgument when they arrive).
std::unique_ptr<TextCodec> make_gguf_codec(const GgufFile& file, SpecialTokenPolicy policy = {});

}  // namespace pagedattn::serve
