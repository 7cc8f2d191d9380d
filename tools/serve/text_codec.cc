#include "text_codec.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "pagedattn/errors.h"
#include "pagedattn/gguf_tokenizer.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::serve {

TextTooLong::TextTooLong(std::size_t text_bytes, std::size_t max_token_bytes)
    : std::length_error("the text has " + std::to_string(text_bytes) +
                        " bytes, more than the tokens allowed can hold"),
      text_bytes_(text_bytes),
      max_token_bytes_(max_token_bytes) {}

namespace {

// TextTooLong for a text of `bytes` that needs more than `max_tokens` tokens
// when none stands for more than `max_token_bytes` bytes (0: no such bound).
void require_can_fit(std::size_t bytes, std::int64_t max_tokens, std::size_t max_token_bytes) {
  if (max_token_bytes == 0) return;
  const std::uint64_t most = std::uint64_t(std::max<std::int64_t>(0, max_tokens)) * max_token_bytes;
  if (bytes > most) throw TextTooLong(bytes, max_token_bytes);
}

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
  // A token per byte.
  std::vector<std::int32_t> encode(std::string_view text, std::int64_t max_tokens) const override {
    require_can_fit(text.size(), max_tokens, 1);
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  // "role: content\n" per message, then "assistant: ": measured before it is
  // put together, as its text is as large as the messages.
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                        std::int64_t max_tokens) const override {
    constexpr std::string_view kSeparator = ": ", kEnd = "\n", kPrompt = "assistant: ";
    std::size_t bytes = kPrompt.size();
    for (const ChatMessage& m : messages)
      bytes += m.role.size() + kSeparator.size() + m.content.size() + kEnd.size();
    require_can_fit(bytes, max_tokens, 1);
    std::string text;
    text.reserve(bytes);
    for (const ChatMessage& m : messages) {
      text.append(m.role).append(kSeparator).append(m.content).append(kEnd);
    }
    text += kPrompt;
    return encode(text, max_tokens);
  }
  std::unique_ptr<TextStream> decoder() const override { return std::make_unique<ByteStream>(); }
  std::string token_text(std::int32_t id) const override { return byte_token_text(id); }
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

// SentencePiece's fallback tokens of each byte: "<0x00>" ... "<0xFF>".
bool has_every_byte_token(const Tokenizer& tokenizer) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (tokenizer.token_id(name) < 0) return false;
  }
  return true;
}

// The most bytes of text one token stands for: the longest token text, as no
// token's text is shorter than the input bytes it covers (byte-level BPE
// writes a byte as one or two bytes, SentencePiece a space as three and a
// fallback byte as "<0xXX>"; special tokens are their text). 0 (no bound)
// when a SentencePiece vocabulary has neither every byte's token nor an
// unknown token: it drops bytes it has no token for, so a text of any
// length may come to few tokens.
std::size_t longest_token_bytes(const Tokenizer& tokenizer) {
  const TokenizerVocab& vocab = tokenizer.vocab();
  if (vocab.model != "gpt2" && vocab.unk_id < 0 && !has_every_byte_token(tokenizer)) return 0;
  std::size_t longest = 1;
  for (const std::string& text : vocab.tokens) longest = std::max(longest, text.size());
  return longest;
}

class GgufCodec final : public TextCodec {
 public:
  GgufCodec(const GgufFile& file, SpecialTokenPolicy policy)
      : tokenizer_(read_tokenizer_vocab(file)),
        max_token_bytes_(longest_token_bytes(tokenizer_)),
        policy_(policy) {
    try {
      chat_.emplace(read_chat_template(file, tokenizer_));
    } catch (const Unsupported&) {
      // No template, or a form we cannot render: completions still work.
    }
  }
  std::vector<std::int32_t> encode(std::string_view text, std::int64_t max_tokens) const override {
    require_can_fit(text.size(), max_tokens, max_token_bytes_);
    return tokenizer_.encode(text, {.parse_special = policy_.parse_special_in_prompts});
  }
  // Measured on the rendered text, which may be shorter than the messages
  // (templates trim content, Qwen3 drops past reasoning). Rendered twice:
  // ChatTemplate::encode keeps the rule on which text may become control
  // tokens, and a render costs no more than reading the body did.
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                        std::int64_t max_tokens) const override {
    require(chat_.has_value(), "messages: this model has no chat template");
    std::size_t bytes = 0;
    for (const ChatSegment& part : chat_->render_segments(messages, {})) bytes += part.text.size();
    require_can_fit(bytes, max_tokens, max_token_bytes_);
    return chat_->encode(tokenizer_, messages, {}, policy_.parse_special_in_messages);
  }
  std::unique_ptr<TextStream> decoder() const override {
    return std::make_unique<TokenizerStream>(tokenizer_);
  }
  // InvalidArgument for an id outside the vocabulary (the engine makes none).
  std::string token_text(std::int32_t id) const override {
    return tokenizer_.token_to_piece(id, {.render_special = true});
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
  std::size_t max_token_bytes_;  // 0: no bound
  std::optional<ChatTemplate> chat_;
  SpecialTokenPolicy policy_;
};

}  // namespace

std::unique_ptr<TextCodec> make_byte_codec(std::int32_t vocab_size, std::int32_t eos_token_id) {
  return std::make_unique<ByteCodec>(vocab_size, eos_token_id);
}

std::unique_ptr<TextCodec> make_gguf_codec(const GgufFile& file, SpecialTokenPolicy policy) {
  return std::make_unique<GgufCodec>(file, policy);
}

}  // namespace pagedattn::serve
