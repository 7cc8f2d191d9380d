#include "pagedattn/chat_template.h"

#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The literal system prompt a ChatML template writes when the first message
// is not a system one: the text between "<|im_start|>system\n" (the newline
// may be written as the escape \n) and "<|im_end|>" inside one string literal.
std::string chatml_default_system(std::string_view t) {
  for (std::string_view header : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (std::size_t at = t.find(header); at != std::string_view::npos;
         at = t.find(header, at + 1)) {
      const std::size_t begin = at + header.size();
      const std::size_t end = t.find("<|im_end|>", begin);
      if (end == std::string_view::npos) continue;
      std::string_view body = t.substr(begin, end - begin);
      // A template expression or the end of the literal: not a fixed prompt.
      if (contains(body, "{{") || contains(body, "{%") || contains(body, "'") ||
          contains(body, "\"") || body.empty()) {
        continue;
      }
      std::string prompt;
      for (std::size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
          prompt += '\n';
          ++i;
        } else {
          prompt += body[i];
        }
      }
      return prompt;
    }
  }
  return {};
}

std::string trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  std::size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view t, std::string bos_text, std::string eos_text)
    : bos_text_(std::move(bos_text)), eos_text_(std::move(eos_text)) {
  if (contains(t, "<|im_start|>")) {
    kind_ = ChatTemplateKind::kChatMl;
    default_system_ = chatml_default_system(t);
  } else if (contains(t, "<|start_header_id|>")) {
    kind_ = ChatTemplateKind::kLlama3;
  } else if (contains(t, "[INST]")) {
    kind_ = ChatTemplateKind::kLlama2;
  } else {
    throw Unsupported(detail::concat(
        "ChatTemplate: the model's chat template is not one of the known forms (ChatML "
        "<|im_start|>, Llama-3 <|start_header_id|>, Llama-2 [INST]); no Jinja engine is built in. "
        "Template starts: \"",
        t.substr(0, 80), "\""));
  }
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  require(!messages.empty(), "ChatTemplate::render: messages is empty");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    require(!messages[i].role.empty(), "ChatTemplate::render: messages[", i, "].role is empty");
  }
  switch (kind_) {
    case ChatTemplateKind::kChatMl:
      return render_chatml(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama3:
      return render_llama3(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama2:
      return render_llama2(messages);
  }
  return {};
}

std::string ChatTemplate::render_chatml(const std::vector<ChatMessage>& messages,
                                        bool add_generation) const {
  std::string out;
  const auto turn = [&](std::string_view role, std::string_view content) {
    out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  };
  if (!default_system_.empty() && messages[0].role != "system") turn("system", default_system_);
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation) out += "<|im_start|>assistant\n";
  return out;
}

std::string ChatTemplate::render_llama3(const std::vector<ChatMessage>& messages,
                                        bool add_generation) const {
  // Llama 3: {{ bos_token }}, then each turn with its content trimmed.
  std::string out = bos_text_;
  for (const ChatMessage& m : messages) {
    out.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n");
    out.append(trim(m.content)).append("<|eot_id|>");
  }
  if (add_generation) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string ChatTemplate::render_llama2(const std::vector<ChatMessage>& messages) const {
  // Llama 2: an optional leading system message folds into the first user
  // turn; user and assistant turns must alternate from a user one.
  std::size_t first = 0;
  std::string system;
  if (messages[0].role == "system") {
    system = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
    first = 1;
  }
  std::string out;
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    require(m.role == (user_turn ? "user" : "assistant"), "ChatTemplate::render: messages[", i,
            "].role is \"", m.role, "\"; the Llama-2 form needs user/assistant turns alternating");
    if (user_turn) {
      // The template strips the system block and the first user message as one string.
      const std::string content = i == first ? system + m.content : m.content;
      out.append(bos_text_).append("[INST] ").append(trim(content)).append(" [/INST]");
    } else {
      out.append(" ").append(trim(m.content)).append(" ").append(eos_text_);
    }
  }
  return out;
}

}  // namespace pagedattn
