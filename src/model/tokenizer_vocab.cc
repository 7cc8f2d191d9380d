// validate_tokenizer_vocab: every check Tokenizer relies on, each failure
// naming the TokenizerVocab field and index.
#include <unordered_set>

#include "model/pretokenizer.h"
#include "model/tokenizer_models.h"
#include "pagedattn/errors.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn {
namespace {

void check_id(const char* field, std::int32_t id, std::size_t vocab_size) {
  require(id >= -1 && id < static_cast<std::int64_t>(vocab_size), "TokenizerVocab.", field, ": ",
          id, " is outside [-1, ", vocab_size, ")");
}

void check_merges(const TokenizerVocab& vocab, const tokenizer_detail::TokenIndex& index) {
  for (std::size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    const std::size_t space = merge.find(' ', 1);
    require(space != std::string::npos && space + 1 < merge.size(), "TokenizerVocab.merges[", i,
            "]: \"", merge, "\" is not \"left right\"");
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    require(index.count(left) && index.count(right), "TokenizerVocab.merges[", i, "]: \"", merge,
            "\": a half is not a token");
    require(index.count(left + right), "TokenizerVocab.merges[", i, "]: \"", merge,
            "\": the merged text is not a token");
  }
}

}  // namespace

void validate_tokenizer_vocab(const TokenizerVocab& vocab) {
  require(vocab.model == "gpt2" || vocab.model == "llama", "TokenizerVocab.model: \"", vocab.model,
          "\" is not supported (\"gpt2\": byte-level BPE, \"llama\": SentencePiece BPE)");
  const std::size_t n = vocab.tokens.size();
  require(n > 0 && n <= 0x7FFFFFFF, "TokenizerVocab.tokens: ", n, " tokens (need 1 .. 2^31-1)");
  require(vocab.scores.empty() || vocab.scores.size() == n,
          "TokenizerVocab.scores: ", vocab.scores.size(), " entries for ", n, " tokens");
  require(vocab.token_type.empty() || vocab.token_type.size() == n,
          "TokenizerVocab.token_type: ", vocab.token_type.size(), " entries for ", n, " tokens");
  for (std::size_t i = 0; i < vocab.token_type.size(); ++i) {
    require(vocab.token_type[i] >= 1 && vocab.token_type[i] <= 6, "TokenizerVocab.token_type[", i,
            "]: ", vocab.token_type[i], " is not a token type (1..6)");
  }
  check_id("bos_id", vocab.bos_id, n);
  check_id("eos_id", vocab.eos_id, n);
  check_id("unk_id", vocab.unk_id, n);
  check_id("pad_id", vocab.pad_id, n);
  require(!vocab.add_bos || vocab.bos_id >= 0, "TokenizerVocab.add_bos: set but bos_id is -1");
  require(!vocab.add_eos || vocab.eos_id >= 0, "TokenizerVocab.add_eos: set but eos_id is -1");

  tokenizer_detail::TokenIndex index;
  index.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto [it, added] = index.emplace(vocab.tokens[i], static_cast<std::int32_t>(i));
    require(added, "TokenizerVocab.tokens[", i, "]: \"", vocab.tokens[i], "\" repeats tokens[",
            it->second, "]");
  }

  if (vocab.model == "gpt2") {
    tokenizer_detail::pre_tokenizer_from_name(vocab.pre);
    check_merges(vocab, index);
    if (vocab.unk_id < 0) {
      const auto& table = tokenizer_detail::byte_level_table();
      for (int b = 0; b < 256; ++b) {
        require(index.count(table.byte_to_text[b]), "TokenizerVocab.tokens: no token for byte 0x",
                std::hex, b, " (\"", table.byte_to_text[b], "\") and no unk_id");
      }
    }
  } else {
    require(vocab.scores.size() == n,
            "TokenizerVocab.scores: the \"llama\" model merges by "
            "score and needs one per token, got ",
            vocab.scores.size(), " for ", n, " tokens");
    // merges, when present, are not used: SentencePiece merges by score.
  }
}

}  // namespace pagedattn
