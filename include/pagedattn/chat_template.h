// Chat prompts for real models. There is no Jinja engine here: the model's
// `tokenizer.chat_template` is recognised as one of the known forms and that
// form is rendered natively, exactly as the template would for the usual
// inputs (roles system/user/assistant, plain-text content, no tools). A
// template of no known form is Unsupported, never rendered as another form.
//
// Message text is never parsed for special tokens: a user message holding
// "<|im_end|>\n<|im_start|>system\n" would otherwise close its own turn and
// forge a system one. ChatTemplate::encode keeps the template's own text
// (turn markers, BOS) apart from the messages' roles and content and turns
// control-token text into control tokens only in the former.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/tokenizer.h"

namespace pagedattn {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (ChatML accepts any role)
  std::string content;
};

enum class ChatTemplateKind {
  kChatMl,   // <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen 2.5)
  kQwen3,    // ChatML with Qwen3's <think> handling and enable_thinking
  kLlama3,   // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
             // (Llama 3; 3.1-3.3 with the dated system block)
  kLlama2,   // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\nuser [/INST] assistant </s>
  kGemma,    // <start_of_turn>user\n...<end_of_turn>\n, role "model" (Gemma 2, 3)
  kPhi3,     // <|user|>\n...<|end|>\n<|assistant|>\n (Phi-3, Phi-3.5)
  kMistral,  // [INST]...[/INST] forms: v1, v3, v3-tekken, v7, v7-tekken
};

struct ChatRenderOptions {
  // End with the header of an assistant turn.
  bool add_generation_prompt = true;
  // Qwen3's `enable_thinking`: false writes the empty "<think>\n\n</think>\n\n"
  // after the generation prompt; unset or true writes nothing (the template's
  // default: the model thinks). Ignored by templates without the switch.
  std::optional<bool> enable_thinking;
  // Llama 3.1+'s `date_string` ("Today Date: ..."). Empty: what the template
  // does without one: its fixed default ("26 Jul 2024" in 3.1), or today's
  // date ("%d %b %Y") where it calls strftime_now (3.2).
  std::string date_string;
};

// One part of a rendered prompt: text the template writes itself (turn
// markers, BOS/EOS, fixed prompts), or text that came from the caller (a
// message's role or content, date_string), which is data and must never
// become control tokens.
struct ChatSegment {
  std::string text;
  bool from_message = false;
};

class ChatTemplate {
 public:
  // Recognises `template_text`; Unsupported naming the template (its first 80
  // characters) for any other. `bos_text`/`eos_text` are the texts of the
  // BOS/EOS tokens the template writes ({{ bos_token }}, {{ eos_token }}).
  explicit ChatTemplate(std::string_view template_text, std::string bos_text = "",
                        std::string eos_text = "");

  ChatTemplateKind kind() const { return kind_; }
  // The short name of the recognised form and variant, e.g. "llama3.1",
  // "mistral-v3-tekken", "gemma2".
  const std::string& variant() const { return variant_; }
  // The system prompt ChatML templates insert when the conversation has none
  // (SmolLM2: "You are a helpful AI assistant named SmolLM, ...", Qwen 2.5:
  // "You are Qwen, created by Alibaba Cloud. ..."); may be empty.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt tokens (no BOS added: the template writes it where it
  // should). Control-token text in the template's own text becomes control
  // tokens; in the messages' roles and content it is plain text, unless
  // `parse_special_in_messages` (only for callers that trust every message).
  // InvalidArgument as render().
  std::vector<std::int32_t> encode(const Tokenizer& tokenizer,
                                   const std::vector<ChatMessage>& messages,
                                   const ChatRenderOptions& options = {},
                                   bool parse_special_in_messages = false) const;

  // The prompt as the template's text and the messages' text, in order;
  // adjacent parts of one kind are joined. InvalidArgument for an empty
  // conversation, or where the template raises (roles not alternating, a
  // system message Gemma 2 does not take) or the form has no rendering for a
  // role (tool messages).
  std::vector<ChatSegment> render_segments(const std::vector<ChatMessage>& messages,
                                           const ChatRenderOptions& options) const;

  // The prompt text (render_segments joined), for display and comparison.
  // Do not encode it with parse_special: message text would be parsed for
  // control tokens too. encode() is the safe way to tokenize a conversation.
  std::string render(const std::vector<ChatMessage>& messages,
                     const ChatRenderOptions& options) const;
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    return render(messages, options);
  }

 private:
  using Segments = std::vector<ChatSegment>;
  Segments render_chatml(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) const;
  Segments render_qwen3(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) const;
  Segments render_llama3(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) const;
  Segments render_llama2(const std::vector<ChatMessage>& m) const;
  Segments render_gemma(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) const;
  Segments render_phi3(const std::vector<ChatMessage>& m, const ChatRenderOptions& o) const;
  Segments render_mistral(const std::vector<ChatMessage>& m) const;

  ChatTemplateKind kind_ = ChatTemplateKind::kChatMl;
  std::string variant_;
  std::string default_system_;
  std::string bos_text_;
  std::string eos_text_;

  // Form details read from the template text.
  bool thinking_switch_ = false;                   // Qwen3: the template reads enable_thinking
  bool dated_system_ = false;                      // Llama 3.1+: the Cutting Knowledge Date block
  bool date_from_clock_ = false;                   // Llama 3.2: strftime_now
  std::string default_date_;                       // Llama 3.1: "26 Jul 2024"
  bool system_allowed_ = true;                     // Gemma 2 raises on a system message
  bool writes_bos_ = false;                        // Phi-3: {{ bos_token }}
  bool eos_without_generation_ = false;            // Phi-3: {% else %}{{ eos_token }}
  bool generation_unless_last_assistant_ = false;  // Phi-3 vision
  bool skip_empty_system_ = false;                 // Phi-3.5: system and message['content']
  enum class Phi3Form { kRoleTags, kNamedRoles, kUserOpensAssistant } phi3_form_{};
  enum class SystemPlacement { kRejected, kFirstUser, kLastUser, kInline } mistral_system_{};
  std::string inst_open_;        // "[INST] ", " [INST] " or "[INST]"
  std::string inst_close_;       // "[/INST]" or " [/INST]"
  std::string assistant_lead_;   // " " or ""
  bool trim_assistant_ = false;  // Mistral v3: message['content']|trim
  std::string system_open_;      // v7: "[SYSTEM_PROMPT] " or "[SYSTEM_PROMPT]"
};

}  // namespace pagedattn
