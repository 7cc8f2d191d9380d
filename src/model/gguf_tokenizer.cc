#include "pagedattn/gguf_tokenizer.h"

#include <limits>

#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

std::int32_t optional_id(const GgufFile& file, std::string_view key) {
  if (!file.has(key)) return -1;
  const std::int64_t id = file.get_i64(key);
  require(id >= -1 && id <= std::numeric_limits<std::int32_t>::max(), "gguf ", file.source_name(),
          ": key '", key, "' = ", id, " is not a token id");
  return static_cast<std::int32_t>(id);
}

bool optional_bool(const GgufFile& file, std::string_view key, bool fallback) {
  return file.has(key) ? file.get_bool(key) : fallback;
}

}  // namespace

TokenizerVocab read_tokenizer_vocab(const GgufFile& file) {
  TokenizerVocab v;
  v.model = std::string(file.get_string("tokenizer.ggml.model"));
  if (file.has("tokenizer.ggml.pre")) v.pre = std::string(file.get_string("tokenizer.ggml.pre"));
  for (std::string_view t : file.get_string_array("tokenizer.ggml.tokens"))
    v.tokens.emplace_back(t);
  if (file.has("tokenizer.ggml.scores")) v.scores = file.get_float_array("tokenizer.ggml.scores");
  if (file.has("tokenizer.ggml.token_type"))
    for (std::int64_t t : file.get_int_array("tokenizer.ggml.token_type"))
      v.token_type.push_back(static_cast<std::int32_t>(t));
  if (file.has("tokenizer.ggml.merges"))
    for (std::string_view m : file.get_string_array("tokenizer.ggml.merges"))
      v.merges.emplace_back(m);
  v.bos_id = optional_id(file, "tokenizer.ggml.bos_token_id");
  v.eos_id = optional_id(file, "tokenizer.ggml.eos_token_id");
  v.unk_id = optional_id(file, "tokenizer.ggml.unknown_token_id");
  v.pad_id = optional_id(file, "tokenizer.ggml.padding_token_id");
  // llama.cpp's defaults when the keys are absent: SentencePiece vocabularies
  // add BOS and a space prefix; Llama 3 and tekken byte-level ones add BOS.
  const bool spm = v.model == "llama";
  const bool bos_by_default =
      spm || v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3" || v.pre == "tekken";
  v.add_bos = optional_bool(file, "tokenizer.ggml.add_bos_token", bos_by_default);
  v.add_eos = optional_bool(file, "tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = optional_bool(file, "tokenizer.ggml.add_space_prefix", spm);
  // Mistral v0.3's SentencePiece vocabulary ([INST] a control token): its
  // Hugging Face tokenizer (Metaspace, prepend_scheme "first") and
  // mistral_common put no ▁ after [INST]; its templates write "[INST] text".
  if (spm) {
    for (std::size_t i = 0; i < v.tokens.size() && i < v.token_type.size(); ++i) {
      if (v.tokens[i] == "[INST]" &&
          v.token_type[i] == static_cast<std::int32_t>(TokenType::kControl)) {
        v.space_prefix_after_special = false;
      }
    }
  }
  if (file.has("tokenizer.chat_template"))
    v.chat_template = std::string(file.get_string("tokenizer.chat_template"));
  return v;
}

ChatTemplate read_chat_template(const GgufFile& file, const Tokenizer& tokenizer) {
  const std::string& text = tokenizer.vocab().chat_template;
  require<Unsupported>(!text.empty(), "gguf ", file.source_name(), ": no tokenizer.chat_template");
  auto token_text = [&](std::int32_t id) {
    return id >= 0 ? tokenizer.token_to_piece(id) : std::string();
  };
  return ChatTemplate(text, token_text(tokenizer.bos_id()), token_text(tokenizer.eos_id()));
}

}  // namespace pagedattn
