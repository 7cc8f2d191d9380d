#include "text_codec.h"

#include <optional>

#include "pagedattn/errors.h"
#include "pagedattn/gguf_tokenizer.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::serve {
namespace {

std::string byte_token_text(std::int32_t id) {
  if ((id >= 0x20 && id < 0x7f) || id == '\n' || id == '\t') return std::string(1, char(id));
  std::string text = "<";  // appended piecewise: GCC 12 misreports "<" + s as overlapping
  text += std::to_string(id);
  text += '>';
  return text;
}

class ByteStream final : public TextStream {
 public:
  std::string push(std::int32_t id) override { return byte_token_text(id); }
  std::string flush() override { return {}; }
};

class ByteCodec final : public TextCodec {
 public:
  ByteCodec(std::int32_t vocab_size, std::int32_t eos) : eos_(eos) {
    require(vocab_size >= 256, "byte codec: vocab_size = ", vocab_size,
            " is below 256 (every byte must be a token)");
  }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  // "role: content\n" per message, then "assistant: ".
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages) const override {
    std::string text;
    for (const ChatMessage& m : messages) text += m.role + ": " + m.content + "\n";
    return encode(text + "assistant: ");
  }
  std::unique_ptr<TextStream> decoder() const override { return std::make_unique<ByteStream>(); }
  std::vector<std::int32_t> stop_token_ids() const override {
    if (eos_ < 0) return {};
    return {eos_};
  }

 private:
  std::int32_t eos_;
};

class TokenizerStream final : public TextStream {
 public:
  explicit TokenizerStream(const Tokenizer& t) : decoder_(t, {.render_special = false}) {}
  std::string push(std::int32_t id) override { return decoder_.push(id); }
  std::string flush() override { return decoder_.flush(); }

 private:
  StreamingDecoder decoder_;
};

class GgufCodec final : public TextCodec {
 public:
  GgufCodec(const GgufFile& file, bool parse_special_in_messages)
      : tokenizer_(read_tokenizer_vocab(file)),
        parse_special_in_messages_(parse_special_in_messages) {
    try {
      chat_.emplace(read_chat_template(file, tokenizer_));
    } catch (const Unsupported&) {
      // No template, or a form we cannot render: completions still work.
    }
  }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    return tokenizer_.encode(text);
  }
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages) const override {
    require(chat_.has_value(), "messages: this model has no chat template");
    return chat_->encode(tokenizer_, messages, {}, parse_special_in_messages_);
  }
  std::unique_ptr<TextStream> decoder() const override {
    return std::make_unique<TokenizerStream>(tokenizer_);
  }
  // EOS and every end-of-turn control token the vocabulary has.
  std::vector<std::int32_t> stop_token_ids() const override {
    std::vector<std::int32_t> ids;
    if (tokenizer_.eos_id() >= 0) ids.push_back(tokenizer_.eos_id());
    for (const char* text :
         {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>"}) {
      const std::int32_t id = tokenizer_.token_id(text);
      if (id >= 0 && tokenizer_.is_control(id) && id != tokenizer_.eos_id()) ids.push_back(id);
    }
    return ids;
  }

 private:
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_;
  bool parse_special_in_messages_;
};

}  // namespace

std::unique_ptr<TextCodec> make_byte_codec(std::int32_t vocab_size, std::int32_t eos_token_id) {
  return std::make_unique<ByteCodec>(vocab_size, eos_token_id);
}

std::unique_ptr<TextCodec> make_gguf_codec(const GgufFile& file, bool parse_special_in_messages) {
  return std::make_unique<GgufCodec>(file, parse_special_in_messages);
}

}  // namespace pagedattn::serve
