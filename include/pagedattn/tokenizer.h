// Text <-> token ids for real models, built from the tokenizer metadata a GGUF
// file carries (TokenizerVocab mirrors the `tokenizer.ggml.*` keys). Two
// models: byte-level BPE ("gpt2": GPT-2, Llama 3, SmolLM2, Qwen 2.5/3,
// Mistral Nemo's tekken) and SentencePiece-style BPE ("llama": Llama 2,
// TinyLlama, Mistral 7B, Gemma 2/3, Phi-3). Text is bytes: any
// byte string, valid UTF-8 or not, encodes and decodes back exactly (byte-level
// BPE maps every byte to a token; SentencePiece falls back to <0xXX> tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

// `tokenizer.ggml.token_type` values.
enum class TokenType : std::int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <s>, <|im_start|>: matched in text only with parse_special
  kUserDefined = 4,  // always matched in text, never split
  kUnused = 5,
  kByte = 6,  // <0xXX> byte-fallback tokens of SentencePiece vocabularies
};

struct TokenizerVocab {
  std::string model;  // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  // Pre-tokenizer of byte-level BPE (`tokenizer.ggml.pre`): "default"/"gpt2",
  // "smollm" (digits split one by one, then GPT-2's rules), "llama-bpe"
  // (Llama 3), "qwen2" (Qwen 2.5, Qwen3), "tekken" (Mistral Nemo, Ministral).
  // Ignored by "llama".
  std::string pre = "default";
  std::vector<std::string> tokens;       // [vocab_size] token text (byte-level or ▁-escaped)
  std::vector<float> scores;             // [vocab_size] or empty; "llama" merges by score
  std::vector<std::int32_t> token_type;  // [vocab_size] TokenType values, or empty (all normal)
  std::vector<std::string> merges;       // "left right", highest priority first ("gpt2" only)
  std::int32_t bos_id = -1;              // -1: none
  std::int32_t eos_id = -1;
  std::int32_t unk_id = -1;
  std::int32_t pad_id = -1;
  bool add_bos = false;  // `tokenizer.ggml.add_bos_token`
  bool add_eos = false;  // `tokenizer.ggml.add_eos_token`
  // "llama": prepend ▁ to text that starts the input or follows a special
  // token (`tokenizer.ggml.add_space_prefix`; Gemma: false).
  bool add_space_prefix = true;
  // "llama" with add_space_prefix: true (llama.cpp, SentencePiece, Hugging
  // Face's Prepend normaliser of Llama 2 and Phi-3): every piece of text after
  // a special token gets the ▁ too. false (Hugging Face's Metaspace with
  // prepend_scheme "first", Mistral v0.3 whose [INST] is a control token):
  // only the start of the input does, and not when it already starts with a
  // space. No GGUF key says this; read_tokenizer_vocab sets false for a
  // vocabulary whose "[INST]" is a control token.
  bool space_prefix_after_special = true;
  std::string chat_template;  // `tokenizer.chat_template`, may be empty
};

// InvalidArgument naming the field (and index) of the first problem: unknown
// model/pre, size mismatches, duplicate tokens, out-of-range ids, merges whose
// halves or result are not tokens, a byte-level vocabulary missing one of the
// 256 byte symbols.
void validate_tokenizer_vocab(const TokenizerVocab& vocab);

struct EncodeOptions {
  bool add_special = true;     // BOS/EOS as the vocabulary's add_bos/add_eos flags say
  bool parse_special = false;  // control-token text ("<|im_start|>") becomes that token
};

// One part of a text put together from trusted and untrusted parts, e.g. a
// chat prompt: the template's turn markers must become control tokens, while
// the same strings inside a user's message must stay plain text, or the user
// could forge turns.
struct TextSegment {
  std::string_view text;
  bool parse_special = false;  // control-token text here becomes that token
};

struct DecodeOptions {
  bool render_special = true;  // control tokens appear as their text; false: dropped
};

class Tokenizer {
 public:
  // Validates `vocab` (validate_tokenizer_vocab) and builds the lookup tables.
  explicit Tokenizer(TokenizerVocab vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<std::int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // The tokens of the segments' concatenation, exactly as encode() gives
  // them (text pieces run on across segment boundaries), except that
  // control-token text becomes that token only where it lies wholly within
  // segments whose parse_special is set; options.parse_special is not read.
  // User-defined tokens match everywhere, as in encode().
  std::vector<std::int32_t> encode_segments(std::span<const TextSegment> segments,
                                            const EncodeOptions& options = {}) const;
  // Bytes, exactly as encoded (invalid UTF-8 included). InvalidArgument for an
  // id outside [0, vocab_size).
  std::string decode(std::span<const std::int32_t> ids, const DecodeOptions& options = {}) const;
  // The bytes one token stands for, alone (no leading-space stripping).
  std::string token_to_piece(std::int32_t id, const DecodeOptions& options = {}) const;

  const TokenizerVocab& vocab() const;
  std::int32_t vocab_size() const;
  std::int32_t bos_id() const;
  std::int32_t eos_id() const;
  bool is_control(std::int32_t id) const;  // control or unknown: never text to a user
  // -1 when `text` is not exactly one token.
  std::int32_t token_id(std::string_view token_text) const;
  // SentencePiece with a dummy prefix: decoding drops one leading space.
  bool strips_leading_space() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decodes a generated stream token by token and hands out only complete UTF-8
// sequences: the bytes of a character split across tokens are held back until
// it is whole. Bytes that can never complete (invalid UTF-8) are released as
// soon as that is certain, so output equals decode() of all the ids.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  // The text that became complete with `id` (may be empty).
  std::string push(std::int32_t id);
  // Whatever is held back (an incomplete sequence at the end); resets.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  bool at_start_ = true;
};

}  // namespace pagedattn
