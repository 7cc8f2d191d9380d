// Pre-tokenization of byte-level BPE: splits text into the words BPE merges
// within, following the regular expression of each model family (written as a
// scanner over code points; Unicode classes from ICU).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace pagedattn::tokenizer_detail {

enum class PreTokenizer {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kSmolLm,  // every \p{N} alone first, then kGpt2 within what is left
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
            // \s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // kLlama3 with \p{N} (one digit per word)
  // Tekken (Mistral Nemo, Ministral, Mistral Small 3): words split at case
  // changes. With U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], l = [\p{Ll}\p{Lm}\p{Lo}\p{M}]:
  // [^\r\n\p{L}\p{N}]?U*l+|[^\r\n\p{L}\p{N}]?U+l*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+
  kTekken,
};

// InvalidArgument for a `tokenizer.ggml.pre` value this library does not know.
PreTokenizer pre_tokenizer_from_name(std::string_view name);

struct WordSpan {
  std::size_t begin;  // byte offsets into the text
  std::size_t end;
};

// Appends the words of `text` to `words` (they tile the text exactly).
// Invalid UTF-8 bytes count as punctuation-like single characters.
void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<WordSpan>& words);

}  // namespace pagedattn::tokenizer_detail
