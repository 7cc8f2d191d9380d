// ChatTemplate: recognising the template forms and rendering them as the
// Jinja templates do (SmolLM2's real template text below).
#include "pagedattn/chat_template.h"

#include <gtest/gtest.h>

#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

// `tokenizer.chat_template` of SmolLM2-135M-Instruct's GGUF.
constexpr const char* kSmolLm2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// Llama 3's template (8B Instruct), abridged to its rendering parts.
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

TEST(ChatTemplate, ChatMlWithTheDefaultSystemPrompt) {
  const ChatTemplate t(kSmolLm2Template);
  EXPECT_EQ(t.kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(t.default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(t.render({{"user", "Hi!"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n");
}

TEST(ChatTemplate, ChatMlWithoutADefaultSystemPrompt) {
  const ChatTemplate t(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}");
  EXPECT_EQ(t.default_system_prompt(), "");
  EXPECT_EQ(t.render({{"user", "x"}}, true),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  const ChatTemplate t(kLlama3Template, "<|begin_of_text|>");
  EXPECT_EQ(t.kind(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(t.render({{"system", "S "}, {"user", " hi\n"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2) {
  const ChatTemplate t("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}", "<s>", "</s>");
  EXPECT_EQ(t.kind(), ChatTemplateKind::kLlama2);
  EXPECT_EQ(
      t.render({{"system", "Sys"}, {"user", "Q1 "}, {"assistant", "A1"}, {"user", "Q2"}}, true),
      "<s>[INST] <<SYS>>\nSys\n<</SYS>>\n\nQ1 [/INST] A1 </s><s>[INST] Q2 [/INST]");
  EXPECT_THROW(t.render({{"assistant", "x"}}, true), InvalidArgument);
}

TEST(ChatTemplate, RejectsUnknownTemplatesAndBadInput) {
  EXPECT_THROW(ChatTemplate("{{ messages }}"), Unsupported);
  const ChatTemplate t(kSmolLm2Template);
  EXPECT_THROW(t.render({}, true), InvalidArgument);
  EXPECT_THROW(t.render({{"", "x"}}, true), InvalidArgument);
}

}  // namespace
}  // namespace pagedattn
