// The tokenizer of a GGUF file: its `tokenizer.ggml.*` keys as a
// TokenizerVocab, and the chat template beside it.
#pragma once

#include <string>

#include "pagedattn/chat_template.h"
#include "pagedattn/gguf.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn {

// InvalidArgument naming the key for a missing or mistyped required key
// (tokenizer.ggml.model, .tokens); optional keys keep TokenizerVocab's defaults.
TokenizerVocab read_tokenizer_vocab(const GgufFile& file);

// The file's chat template (Unsupported when it has none or an unknown form).
ChatTemplate read_chat_template(const GgufFile& file, const Tokenizer& tokenizer);

}  // namespace pagedattn
