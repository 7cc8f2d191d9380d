// The two tokenizer models behind pagedattn::Tokenizer: byte-level BPE
// ("gpt2") and SentencePiece-style BPE ("llama"). Both see text that holds no
// special tokens (Tokenizer::encode splits those off first).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/pretokenizer.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer_detail {

using TokenIndex = std::unordered_map<std::string, std::int32_t>;

// GPT-2's byte <-> printable code point table: bytes that are printable
// Latin-1 stand for themselves, the other 68 map to U+0100 upwards in order.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_text;  // UTF-8 of each byte's code point
  std::unordered_map<char32_t, std::uint8_t> code_point_to_byte;
};
const ByteLevelTable& byte_level_table();

class ByteLevelBpe {
 public:
  // `vocab` is valid (validate_tokenizer_vocab passed).
  ByteLevelBpe(const TokenizerVocab& vocab, const TokenIndex& index);
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
  // Raw bytes of a normal token (byte-level text mapped back).
  std::string piece(const std::string& token_text) const;

 private:
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  PreTokenizer pre_;
  bool ignore_merges_;  // Llama 3, tekken: a word that is a token is that token
  const TokenIndex* index_;
  std::array<std::int32_t, 256> byte_token_{};  // token of each single byte
  struct Merge {
    std::int32_t rank;
    std::int32_t result;
  };
  std::unordered_map<std::uint64_t, Merge> merges_;  // (left << 32 | right) -> merge

  // Tokens of recently seen short words (natural text repeats its words).
  // Bounded: emptied when full. Guarded by cache_mutex_ (encode is const and
  // may run on several threads).
  static constexpr std::size_t kCacheCapacity = 1 << 16;
  static constexpr std::size_t kCachedWordMaxBytes = 64;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

class SentencePieceBpe {
 public:
  SentencePieceBpe(const TokenizerVocab& vocab, const TokenIndex& index);
  // `text` is a whole input or the text between two special tokens;
  // `space_prefix`: put the dummy-prefix ▁ in front (the caller decides, see
  // TokenizerVocab::space_prefix_after_special).
  void encode(std::string_view text, bool space_prefix, std::vector<std::int32_t>& out) const;
  std::string piece(std::int32_t id) const;

 private:
  // Text can become normal and user-defined tokens only: never a control,
  // byte or unused one (SentencePiece's rule), even if the text is the same.
  bool is_piece(std::int32_t id) const;

  const TokenizerVocab* vocab_;
  const TokenIndex* index_;
  std::array<std::int32_t, 256> byte_token_{};  // <0xXX>, or -1
};

}  // namespace pagedattn::tokenizer_detail
