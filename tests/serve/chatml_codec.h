// A GGUF tokenizer for the serve tests: SmolLM2's layout (byte-level BPE,
// the ChatML control tokens, no merges) and a ChatML template, built in
// memory and turned into the server's codec.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text_codec.h"

namespace pagedattn::serve::testing {

// Ids 0, 1, 2: "<|endoftext|>", "<|im_start|>" (the file's BOS), "<|im_end|>" (EOS);
// then the 256 byte symbols (a token per byte: there are no merges).
inline const std::vector<std::string> kChatmlControls = {"<|endoftext|>", "<|im_start|>",
                                                         "<|im_end|>"};
constexpr std::int32_t kImStart = 1;
constexpr std::int32_t kImEnd = 2;

struct ChatmlVocab {
  std::string user_defined{};   // one more token after the bytes when not empty
  std::int32_t vocab_size = 0;  // > 259: plain tokens "pad259", ... up to this size
};

std::unique_ptr<TextCodec> make_chatml_codec(SpecialTokenPolicy policy, ChatmlVocab vocab = {});

}  // namespace pagedattn::serve::testing
