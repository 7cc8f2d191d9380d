// Chat prompts for real models. There is no Jinja engine here: the model's
// `tokenizer.chat_template` is recognised as one of the known forms and that
// form is rendered natively, exactly as the template would for the usual
// inputs (roles system/user/assistant, plain-text content).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (ChatML accepts any role)
  std::string content;
};

enum class ChatTemplateKind {
  kChatMl,  // <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen)
  kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kLlama2,  // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\nuser [/INST] assistant </s>
};

class ChatTemplate {
 public:
  // Recognises `template_text`; Unsupported for a template of another form
  // (the message says which forms are known). `bos_text`/`eos_text` are the
  // texts of the BOS/EOS tokens the template writes ({{ bos_token }}).
  explicit ChatTemplate(std::string_view template_text, std::string bos_text = "",
                        std::string eos_text = "");

  ChatTemplateKind kind() const { return kind_; }
  // The system prompt ChatML templates insert when the conversation has none
  // (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."); may be empty.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text; with add_generation_prompt it ends with the header of an
  // assistant turn. Encode it with parse_special = true and add_special =
  // false (the text already holds BOS where the template writes it).
  // InvalidArgument for an empty conversation or a role the form cannot express.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation) const;
  std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation) const;
  std::string render_llama2(const std::vector<ChatMessage>& messages) const;

  ChatTemplateKind kind_;
  std::string default_system_;
  std::string bos_text_;
  std::string eos_text_;
};

}  // namespace pagedattn
