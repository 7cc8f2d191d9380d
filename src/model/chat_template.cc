// ChatTemplate: recognising a model's Jinja chat template by the literal
// pieces it writes, and rendering that form natively. Each render_* function
// follows the real template's logic for plain-text conversations (the
// comments quote it); python/tests/test_chat_templates.py compares every form
// with transformers' apply_chat_template on the real template texts.
#include "pagedattn/chat_template.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

// The template with its spellings made uniform, so one literal piece matches
// every way templates write it: the escape \n as a newline, double quotes as
// single ones, message.role / message.content as message['role'] / ['content'].
std::string normalize(std::string_view t) {
  std::string s(t);
  replace_all(s, "\\n", "\n");
  for (char& c : s) {
    if (c == '"') c = '\'';
  }
  replace_all(s, "message.role", "message['role']");
  replace_all(s, "message.content", "message['content']");
  return s;
}

// The literal system prompt a ChatML template writes when the first message
// is not a system one: the text between "<|im_start|>system\n" and
// "<|im_end|>" inside one string literal (of the normalized template).
std::string chatml_default_system(std::string_view t) {
  const std::string_view header = "<|im_start|>system\n";
  for (std::size_t at = t.find(header); at != std::string_view::npos; at = t.find(header, at + 1)) {
    const std::size_t begin = at + header.size();
    const std::size_t end = t.find("<|im_end|>", begin);
    if (end == std::string_view::npos) continue;
    std::string_view body = t.substr(begin, end - begin);
    // A template expression or the end of the literal: not a fixed prompt.
    if (body.empty() || contains(body, "{{") || contains(body, "{%") || contains(body, "'")) {
      continue;
    }
    return std::string(body);
  }
  return {};
}

// The text of the string literal after `key` (which ends with its opening
// quote), e.g. set date_string = '26 Jul 2024'; empty when absent.
std::string literal_after(std::string_view t, std::string_view key) {
  const std::size_t at = t.find(key);
  if (at == std::string_view::npos) return {};
  const std::size_t begin = at + key.size();
  const std::size_t end = t.find('\'', begin);
  return end == std::string_view::npos ? std::string() : std::string(t.substr(begin, end - begin));
}

// Length of the Unicode White_Space-like character Python's str.isspace()
// accepts at s[i] (Jinja's trim is Python's strip()), 0 when none.
std::size_t space_at(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b == ' ' || (b >= 0x09 && b <= 0x0D) || (b >= 0x1C && b <= 0x1F)) return 1;
  const auto at = [&](std::size_t k) {
    return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u;
  };
  if (b == 0xC2 && (at(i + 1) == 0x85 || at(i + 1) == 0xA0)) return 2;
  if (b == 0xE1 && at(i + 1) == 0x9A && at(i + 2) == 0x80) return 3;  // U+1680
  if (b == 0xE2 && at(i + 1) == 0x80) {
    const unsigned c = at(i + 2);
    if ((c >= 0x80 && c <= 0x8A) || c == 0xA8 || c == 0xA9 || c == 0xAF) return 3;
  }
  if (b == 0xE2 && at(i + 1) == 0x81 && at(i + 2) == 0x9F) return 3;  // U+205F
  if (b == 0xE3 && at(i + 1) == 0x80 && at(i + 2) == 0x80) return 3;  // U+3000
  return 0;
}

std::string lstrip(std::string_view s) {
  std::size_t b = 0;
  while (b < s.size()) {
    const std::size_t n = space_at(s, b);
    if (n == 0) break;
    b += n;
  }
  return std::string(s.substr(b));
}

// Python's str.strip(): Jinja's `| trim` and `.strip()`.
std::string trim(std::string_view s) {
  std::string out = lstrip(s);
  // From the right: find the end after the last non-space character.
  std::size_t end = 0;
  for (std::size_t i = 0; i < out.size();) {
    const std::size_t n = space_at(out, i);
    if (n == 0) {
      ++i;
      while (i < out.size() && (static_cast<unsigned char>(out[i]) & 0xC0) == 0x80) ++i;
      end = i;
    } else {
      i += n;
    }
  }
  out.resize(end);
  return out;
}

// str.strip(chars) / lstrip / rstrip for one ASCII character.
std::string_view strip_char(std::string_view s, char c, bool left, bool right) {
  while (left && !s.empty() && s.front() == c) s.remove_prefix(1);
  while (right && !s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

std::string today_string() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  static const char* const kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char day[4];
  std::snprintf(day, sizeof day, "%02d", local.tm_mday);
  return detail::concat(day, " ", kMonths[local.tm_mon], " ", 1900 + local.tm_year);
}

[[noreturn]] void unsupported(std::string_view t, std::string_view why) {
  std::string start(t.substr(0, 80));
  for (char& c : start) {
    if (c == '\n') c = ' ';
  }
  throw Unsupported(detail::concat(
      "ChatTemplate: the model's chat template is not one of the known forms (", why,
      "); no Jinja engine is built in. Known: ChatML (SmolLM2, Qwen 2.5, Qwen3), Llama 3/3.1, "
      "Llama 2, Gemma 2/3, Phi-3, Mistral [INST] v1/v3/v3-tekken/v7. Template starts: \"",
      start, "\""));
}

// The prompt being rendered, kept as ChatSegments: what the template writes
// (template_text()) apart from what a message or the caller supplied (message()).
class PromptBuilder {
 public:
  PromptBuilder& template_text(std::string_view text) { return add(text, false); }
  PromptBuilder& message(std::string_view text) { return add(text, true); }
  PromptBuilder& append(const std::vector<ChatSegment>& segments) {
    for (const ChatSegment& s : segments) add(s.text, s.from_message);
    return *this;
  }
  std::vector<ChatSegment> take() { return std::move(segments_); }

 private:
  PromptBuilder& add(std::string_view text, bool from_message) {
    if (text.empty()) return *this;
    if (!segments_.empty() && segments_.back().from_message == from_message) {
      segments_.back().text += text;
    } else {
      segments_.push_back({std::string(text), from_message});
    }
    return *this;
  }

  std::vector<ChatSegment> segments_;
};

std::string joined(const std::vector<ChatSegment>& segments) {
  std::string text;
  for (const ChatSegment& s : segments) text += s.text;
  return text;
}

// trim() of the segments' joined text, each kept byte staying in its
// segment: a template that strips template and message text as one string
// (Llama 2's system block and first user message).
std::vector<ChatSegment> trimmed(const std::vector<ChatSegment>& segments) {
  const std::string text = joined(segments);
  const std::size_t keep_begin = text.size() - lstrip(text).size();
  const std::size_t keep_end = keep_begin + trim(text).size();
  PromptBuilder out;
  std::size_t begin = 0;
  for (const ChatSegment& s : segments) {
    const std::size_t end = begin + s.text.size();
    const std::size_t from = std::max(begin, keep_begin);
    const std::size_t to = std::min(end, keep_end);
    if (from < to) {
      const std::string_view kept = std::string_view(s.text).substr(from - begin, to - from);
      if (s.from_message) {
        out.message(kept);
      } else {
        out.template_text(kept);
      }
    }
    begin = end;
  }
  return out.take();
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view template_text, std::string bos_text,
                           std::string eos_text)
    : bos_text_(std::move(bos_text)), eos_text_(std::move(eos_text)) {
  const std::string n = normalize(template_text);
  const std::string_view t = template_text;
  if (contains(n, "<|start_header_id|>")) {
    if (!contains(n, "<|end_header_id|>\n\n") || !contains(n, "<|eot_id|>")) {
      unsupported(t, "<|start_header_id|> without Llama 3's turn layout");
    }
    kind_ = ChatTemplateKind::kLlama3;
    dated_system_ = contains(n, "Cutting Knowledge Date: December 2023");
    date_from_clock_ = contains(n, "strftime_now");
    default_date_ = literal_after(n, "set date_string = '");
    if (dated_system_ && default_date_.empty() && !date_from_clock_) {
      unsupported(t, "a Llama 3.1 system block without a date_string default");
    }
    variant_ = dated_system_ ? (date_from_clock_ ? "llama3.2" : "llama3.1") : "llama3";
  } else if (contains(n, "<|im_start|>")) {
    if (contains(n, "<|im_sep|>") || !(contains(n, "'<|im_start|>' + message['role'] + '\n'") ||
                                       contains(n, "<|im_start|>{{ message['role'] }}\n"))) {
      unsupported(t, "<|im_start|> without ChatML's <|im_start|>{role}\\n turns");
    }
    default_system_ = chatml_default_system(n);
    if (contains(n, "<think>")) {
      kind_ = ChatTemplateKind::kQwen3;
      thinking_switch_ = contains(n, "enable_thinking");
      variant_ = "qwen3";
      if (!default_system_.empty())
        unsupported(t, "a thinking ChatML template with a default system prompt");
    } else {
      kind_ = ChatTemplateKind::kChatMl;
      variant_ = "chatml";
    }
  } else if (contains(n, "<start_of_turn>")) {
    if (!contains(n, "'<start_of_turn>' + role + '\n'") || !contains(n, "<start_of_turn>model\n")) {
      unsupported(t, "<start_of_turn> without Gemma's turn layout");
    }
    kind_ = ChatTemplateKind::kGemma;
    system_allowed_ = !contains(n, "System role not supported");
    if (system_allowed_ && !contains(n, "first_user_prefix")) {
      unsupported(t, "a Gemma template that neither rejects nor prefixes a system message");
    }
    variant_ = system_allowed_ ? "gemma3" : "gemma2";
  } else if (contains(n, "<|end|>") &&
             (contains(n, "<|user|>") || contains(n, "'<|' + message['role'] + '|>'"))) {
    kind_ = ChatTemplateKind::kPhi3;
    writes_bos_ = contains(n, "bos_token");
    eos_without_generation_ = contains(n, "{% else %}{{ eos_token }}");
    generation_unless_last_assistant_ = contains(n, "messages[-1]['role'] != 'assistant'");
    skip_empty_system_ = contains(n, "message['role'] == 'system' and message['content']");
    if (contains(n, "'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n'")) {
      phi3_form_ = Phi3Form::kRoleTags;
    } else if (contains(n, "'<|user|>\n' + message['content'] + '<|end|>\n'") &&
               contains(n, "'<|assistant|>\n' + message['content'] + '<|end|>\n'")) {
      phi3_form_ = Phi3Form::kNamedRoles;
    } else if (contains(n,
                        "'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + "
                        "'<|assistant|>' + '\n'") &&
               contains(n, "message['content'] + '<|end|>' + '\n'")) {
      phi3_form_ = Phi3Form::kUserOpensAssistant;
    } else {
      unsupported(t, "<|user|>/<|end|> in a layout other than Phi-3's");
    }
    variant_ = "phi3";
  } else if (contains(n, "[INST]")) {
    if (contains(n, "<<SYS>>")) {
      kind_ = ChatTemplateKind::kLlama2;
      variant_ = "llama2";
      return;
    }
    kind_ = ChatTemplateKind::kMistral;
    if (contains(n, "default_system_message") || contains(n, "strftime_now")) {
      unsupported(t, "a Mistral template with a generated default system prompt");
    }
    if (contains(n, "'[INST] '"))
      inst_open_ = "[INST] ";
    else if (contains(n, "' [INST] '"))
      inst_open_ = " [INST] ";
    else if (contains(n, "'[INST]'"))
      inst_open_ = "[INST]";
    else
      unsupported(t, "[INST] written in an unknown way");
    inst_close_ = contains(n, "' [/INST]'") ? " [/INST]" : "[/INST]";
    if (!contains(n, "[/INST]'")) unsupported(t, "[/INST] written in an unknown way");
    if (contains(n, "' ' + message['content']|trim + eos_token") ||
        contains(n, "' ' + message['content'] | trim + eos_token")) {
      assistant_lead_ = " ";
      trim_assistant_ = true;
    } else if (contains(n, "' ' + message['content'] + eos_token")) {
      assistant_lead_ = " ";
    } else if (contains(n, "message['content'] + eos_token")) {
      assistant_lead_ = "";
    } else {
      unsupported(t, "a Mistral assistant turn written in an unknown way");
    }
    if (contains(n, "[SYSTEM_PROMPT]")) {
      mistral_system_ = SystemPlacement::kInline;
      system_open_ = contains(n, "'[SYSTEM_PROMPT] '") ? "[SYSTEM_PROMPT] " : "[SYSTEM_PROMPT]";
      variant_ = inst_open_ == "[INST]" ? "mistral-v7-tekken" : "mistral-v7";
    } else if (contains(n, "loop.last and system_message is defined")) {
      mistral_system_ = SystemPlacement::kLastUser;
      variant_ = inst_open_ == "[INST]" ? "mistral-v3-tekken" : "mistral-v3";
    } else if (contains(n, "loop.first and system_message is defined")) {
      mistral_system_ = SystemPlacement::kFirstUser;
      variant_ = "mistral-v1";
    } else if (!contains(n, "system") ||
               contains(n, "Only user and assistant roles are supported")) {
      mistral_system_ = SystemPlacement::kRejected;
      variant_ = "mistral";
    } else {
      unsupported(t, "a Mistral template placing the system message in an unknown way");
    }
  } else {
    unsupported(t, "none of <|im_start|>, <|start_header_id|>, <start_of_turn>, <|user|>, [INST]");
  }
}

std::vector<ChatSegment> ChatTemplate::render_segments(const std::vector<ChatMessage>& messages,
                                                       const ChatRenderOptions& options) const {
  require(!messages.empty(), "ChatTemplate::render: messages is empty");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    require(!messages[i].role.empty(), "ChatTemplate::render: messages[", i, "].role is empty");
  }
  switch (kind_) {
    case ChatTemplateKind::kChatMl:
      return render_chatml(messages, options);
    case ChatTemplateKind::kQwen3:
      return render_qwen3(messages, options);
    case ChatTemplateKind::kLlama3:
      return render_llama3(messages, options);
    case ChatTemplateKind::kLlama2:
      return render_llama2(messages);
    case ChatTemplateKind::kGemma:
      return render_gemma(messages, options);
    case ChatTemplateKind::kPhi3:
      return render_phi3(messages, options);
    case ChatTemplateKind::kMistral:
      return render_mistral(messages);
  }
  return {};
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 const ChatRenderOptions& options) const {
  return joined(render_segments(messages, options));
}

std::vector<std::int32_t> ChatTemplate::encode(const Tokenizer& tokenizer,
                                               const std::vector<ChatMessage>& messages,
                                               const ChatRenderOptions& options,
                                               bool parse_special_in_messages) const {
  const std::vector<ChatSegment> parts = render_segments(messages, options);
  std::vector<TextSegment> segments;
  segments.reserve(parts.size());
  for (const ChatSegment& part : parts) {
    segments.push_back({part.text, !part.from_message || parse_special_in_messages});
  }
  // No BOS from the vocabulary's add_bos: the template writes it.
  return tokenizer.encode_segments(segments, {.add_special = false});
}

ChatTemplate::Segments ChatTemplate::render_chatml(const std::vector<ChatMessage>& messages,
                                                   const ChatRenderOptions& options) const {
  PromptBuilder out;
  if (!default_system_.empty() && messages[0].role != "system") {
    out.template_text("<|im_start|>system\n").template_text(default_system_);
    out.template_text("<|im_end|>\n");
  }
  for (const ChatMessage& m : messages) {
    out.template_text("<|im_start|>").message(m.role).template_text("\n");
    out.message(m.content).template_text("<|im_end|>\n");
  }
  if (options.add_generation_prompt) out.template_text("<|im_start|>assistant\n");
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_qwen3(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const {
  // The last user message that is not a tool response: assistant turns after
  // it keep their reasoning in a <think> block, earlier ones lose it.
  std::size_t last_query = messages.size() - 1;
  for (std::size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" &&
        !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  PromptBuilder out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || m.role == "system") {
      out.template_text("<|im_start|>").message(m.role).template_text("\n");
      out.message(m.content).template_text("<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (const std::size_t close = content.find("</think>"); close != std::string_view::npos) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string_view before = strip_char(content.substr(0, close), '\n', false, true);
        if (const std::size_t open = before.rfind("<think>"); open != std::string_view::npos) {
          before = before.substr(open + 7);
        }
        reasoning = strip_char(before, '\n', true, false);
        // content.split('</think>')[-1].lstrip('\n')
        content = strip_char(content.substr(content.rfind("</think>") + 8), '\n', true, false);
      }
      out.template_text("<|im_start|>assistant\n");
      if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
        out.template_text("<think>\n").message(strip_char(reasoning, '\n', true, true));
        out.template_text("\n</think>\n\n").message(strip_char(content, '\n', true, false));
      } else {
        out.message(content);
      }
      out.template_text("<|im_end|>\n");
    } else {
      require(false, "ChatTemplate::render: messages[", i, "].role is \"", m.role,
              "\"; the Qwen3 form renders system, user and assistant messages (no tools)");
    }
  }
  if (options.add_generation_prompt) {
    out.template_text("<|im_start|>assistant\n");
    if (thinking_switch_ && options.enable_thinking == false) {
      out.template_text("<think>\n\n</think>\n\n");
    }
  }
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_llama3(const std::vector<ChatMessage>& messages,
                                                   const ChatRenderOptions& options) const {
  PromptBuilder out;
  out.template_text(bos_text_);
  std::size_t first = 0;
  if (dated_system_) {
    // Llama 3.1+: the system block always comes first, dated, with the
    // system message (trimmed) or nothing after the date.
    std::string system;
    if (messages[0].role == "system") {
      system = trim(messages[0].content);
      first = 1;
    }
    out.template_text("<|start_header_id|>system<|end_header_id|>\n\n");
    out.template_text("Cutting Knowledge Date: December 2023\nToday Date: ");
    // The caller's date is data like a message; the defaults are the template's.
    if (!options.date_string.empty()) {
      out.message(options.date_string);
    } else {
      out.template_text(date_from_clock_ ? today_string() : default_date_);
    }
    out.template_text("\n\n").message(system).template_text("<|eot_id|>");
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    require(!dated_system_ || (m.role != "ipython" && m.role != "tool"),
            "ChatTemplate::render: messages[", i, "].role is \"", m.role,
            "\"; tool messages are not rendered here");
    out.template_text("<|start_header_id|>").message(m.role);
    out.template_text("<|end_header_id|>\n\n").message(trim(m.content));
    out.template_text("<|eot_id|>");
  }
  if (options.add_generation_prompt) {
    out.template_text("<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_llama2(const std::vector<ChatMessage>& messages) const {
  // Llama 2: an optional leading system message folds into the first user
  // turn; user and assistant turns must alternate from a user one.
  std::size_t first = 0;
  std::vector<ChatSegment> system;
  if (messages[0].role == "system") {
    system = PromptBuilder()
                 .template_text("<<SYS>>\n")
                 .message(messages[0].content)
                 .template_text("\n<</SYS>>\n\n")
                 .take();
    first = 1;
  }
  PromptBuilder out;
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    require(m.role == (user_turn ? "user" : "assistant"), "ChatTemplate::render: messages[", i,
            "].role is \"", m.role, "\"; the Llama-2 form needs user/assistant turns alternating");
    if (user_turn) {
      // The template strips the system block and the first user message as one string.
      PromptBuilder content;
      if (i == first) content.append(system);
      content.message(m.content);
      out.template_text(bos_text_).template_text("[INST] ");
      out.append(trimmed(content.take())).template_text(" [/INST]");
    } else {
      out.template_text(" ").message(trim(m.content)).template_text(" ").template_text(eos_text_);
    }
  }
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_gemma(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const {
  // {{ bos_token }}, then '<start_of_turn>' + role + '\n' + content | trim +
  // '<end_of_turn>\n' with assistant named "model", turns alternating from a
  // user one. Gemma 3 puts a leading system message + '\n\n' in front of the
  // first turn's text; Gemma 2 raises "System role not supported".
  std::size_t first = 0;
  if (messages[0].role == "system") {
    require(system_allowed_,
            "ChatTemplate::render: messages[0].role is \"system\"; the Gemma 2 "
            "template raises 'System role not supported'");
    first = 1;
  }
  PromptBuilder out;
  out.template_text(bos_text_);
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    require((m.role == "user") == user_turn, "ChatTemplate::render: messages[", i, "].role is \"",
            m.role, "\"; the Gemma template needs user/assistant turns alternating");
    out.template_text("<start_of_turn>");
    if (m.role == "assistant") {
      out.template_text("model");
    } else {
      out.message(m.role);
    }
    out.template_text("\n");
    if (i == first && first == 1) out.message(messages[0].content).template_text("\n\n");
    out.message(trim(m.content)).template_text("<end_of_turn>\n");
  }
  if (options.add_generation_prompt) out.template_text("<start_of_turn>model\n");
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_phi3(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& options) const {
  PromptBuilder out;
  if (writes_bos_) out.template_text(bos_text_);
  // '<|' + role + '|>\n': the template's own turn marker for the roles the
  // vocabulary has one for; any other role is data and must not name a
  // control token ("end" would forge <|end|>).
  const auto role_tag = [&](const std::string& role) {
    if (role == "system" || role == "user" || role == "assistant") {
      out.template_text("<|").template_text(role).template_text("|>\n");
    } else {
      out.template_text("<|").message(role).template_text("|>\n");
    }
  };
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (phi3_form_) {
      case Phi3Form::kRoleTags:  // '<|' + role + '|>\n' + content + '<|end|>\n' for any role
        role_tag(m.role);
        out.message(m.content).template_text("<|end|>\n");
        break;
      case Phi3Form::kNamedRoles:  // system, user and assistant branches
        require(m.role == "system" || m.role == "user" || m.role == "assistant",
                "ChatTemplate::render: messages[", i, "].role is \"", m.role,
                "\"; the Phi-3 template renders system, user and assistant messages");
        if (skip_empty_system_ && m.role == "system" && m.content.empty()) break;  // Phi-3.5
        role_tag(m.role);
        out.message(m.content).template_text("<|end|>\n");
        break;
      case Phi3Form::kUserOpensAssistant:
        // A user turn opens the assistant's; the template drops system messages.
        if (m.role == "user") {
          out.template_text("<|user|>\n").message(m.content);
          out.template_text("<|end|>\n<|assistant|>\n");
        } else if (m.role == "assistant") {
          out.message(m.content).template_text("<|end|>\n");
        } else {
          require(m.role == "system", "ChatTemplate::render: messages[", i, "].role is \"", m.role,
                  "\"; this Phi-3 template renders user and assistant messages");
        }
        break;
    }
  }
  if (phi3_form_ == Phi3Form::kUserOpensAssistant) return out.take();
  const bool generation = options.add_generation_prompt && !(generation_unless_last_assistant_ &&
                                                             messages.back().role == "assistant");
  if (generation)
    out.template_text("<|assistant|>\n");
  else if (eos_without_generation_)
    out.template_text(eos_text_);
  return out.take();
}

ChatTemplate::Segments ChatTemplate::render_mistral(
    const std::vector<ChatMessage>& messages) const {
  PromptBuilder out;
  out.template_text(bos_text_);
  if (mistral_system_ == SystemPlacement::kInline) {
    // v7: [SYSTEM_PROMPT] system [/SYSTEM_PROMPT] wherever it occurs; no alternation check.
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") {
        out.template_text(inst_open_).message(m.content).template_text("[/INST]");
      } else if (m.role == "system") {
        out.template_text(system_open_).message(m.content).template_text("[/SYSTEM_PROMPT]");
      } else if (m.role == "assistant") {
        out.template_text(assistant_lead_).message(m.content).template_text(eos_text_);
      } else {
        require(false, "ChatTemplate::render: messages[", i, "].role is \"", m.role,
                "\"; the Mistral template takes user, system and assistant messages");
      }
    }
    return out.take();
  }
  // v1/v3/tekken: an optional leading system message, then user/assistant
  // turns alternating from a user one.
  std::size_t first = 0;
  if (messages[0].role == "system") {
    require(mistral_system_ != SystemPlacement::kRejected,
            "ChatTemplate::render: messages[0].role is \"system\"; this Mistral template takes "
            "user and assistant messages only");
    first = 1;
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    require(m.role == (user_turn ? "user" : "assistant"), "ChatTemplate::render: messages[", i,
            "].role is \"", m.role,
            "\"; the Mistral template needs user/assistant turns alternating");
    if (user_turn) {
      // v3 puts the system message in the last message when that is a user
      // one (so not at all when the conversation ends with the assistant).
      const bool with_system =
          first == 1 &&
          ((mistral_system_ == SystemPlacement::kFirstUser && i == first) ||
           (mistral_system_ == SystemPlacement::kLastUser && i + 1 == messages.size()));
      out.template_text(inst_open_);
      if (with_system) out.message(messages[0].content).template_text("\n\n");
      out.message(m.content).template_text(inst_close_);
    } else {
      out.template_text(assistant_lead_);
      out.message(trim_assistant_ ? trim(m.content) : m.content).template_text(eos_text_);
    }
  }
  return out.take();
}

}  // namespace pagedattn
