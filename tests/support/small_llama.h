// The engine tests' model: the synthetic tiny Llama narrowed to 2 layers,
// 4 query / 2 KV heads of 24 dims (no kernel fast path: the generic one) and
// a 300-token vocabulary, so that every step is cheap. Built once.
#pragma once

#include <cstdint>
#include <memory>

#include "pagedattn/llama.h"

namespace pagedattn::test {

inline constexpr std::int32_t kSmallLlamaVocab = 300;

inline std::shared_ptr<Model> small_llama() {
  static const std::shared_ptr<Model> model = [] {
    LlamaConfig c = llama_preset("tiny");
    c.hidden_size = 96;
    c.intermediate_size = 160;
    c.num_layers = 2;
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 24;
    c.vocab_size = kSmallLlamaVocab;
    return std::shared_ptr<Model>(make_llama_model(c));
  }();
  return model;
}

}  // namespace pagedattn::test
