// pagedattn.Tokenizer, StreamingDecoder, StopMatcher and ChatTemplate over
// include/pagedattn/tokenizer.h, stop_matcher.h and chat_template.h. Text
// goes in as str (UTF-8) or bytes; decoded text comes out as bytes, since
// token sequences may split or hold invalid UTF-8 (use
// .decode("utf-8", "replace") to show).
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/stop_matcher.h"
#include "pagedattn/tokenizer.h"
#include "type_hints.h"

namespace py = pybind11;

namespace pagedattn::python {
namespace {

// Text to encode: str (encoded as UTF-8) or bytes.
struct TextHint {
  static constexpr auto name = py::detail::const_name("str | bytes");
};
using Text = Typed<TextHint>;

std::string text_bytes(const Text& text) {
  if (py::isinstance<py::bytes>(text)) return text.cast<std::string>();
  if (py::isinstance<py::str>(text)) return text.cast<std::string>();
  throw py::type_error("text must be str or bytes");
}

TokenizerVocab make_vocab(std::string model, std::vector<std::string> tokens, std::string pre,
                          std::optional<std::vector<float>> scores,
                          std::optional<std::vector<std::int32_t>> token_type,
                          std::optional<std::vector<std::string>> merges, std::int32_t bos_id,
                          std::int32_t eos_id, std::int32_t unk_id, std::int32_t pad_id,
                          bool add_bos, bool add_eos, bool add_space_prefix,
                          bool space_prefix_after_special, std::string chat_template) {
  TokenizerVocab v;
  v.model = std::move(model);
  v.pre = std::move(pre);
  v.tokens = std::move(tokens);
  if (scores) v.scores = std::move(*scores);
  if (token_type) v.token_type = std::move(*token_type);
  if (merges) v.merges = std::move(*merges);
  v.bos_id = bos_id;
  v.eos_id = eos_id;
  v.unk_id = unk_id;
  v.pad_id = pad_id;
  v.add_bos = add_bos;
  v.add_eos = add_eos;
  v.add_space_prefix = add_space_prefix;
  v.space_prefix_after_special = space_prefix_after_special;
  v.chat_template = std::move(chat_template);
  return v;
}

// [{"role", "content"}...] as ChatMessages; ValueError for a message missing either.
std::vector<ChatMessage> chat_messages(
    const std::vector<std::map<std::string, std::string>>& messages) {
  std::vector<ChatMessage> converted;
  for (const auto& m : messages) {
    auto role = m.find("role");
    auto content = m.find("content");
    if (role == m.end() || content == m.end()) {
      throw py::value_error("each message needs 'role' and 'content'");
    }
    converted.push_back({role->second, content->second});
  }
  return converted;
}

ChatRenderOptions render_options(bool add_generation_prompt, std::optional<bool> enable_thinking,
                                 std::string date_string) {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.enable_thinking = enable_thinking;
  options.date_string = std::move(date_string);
  return options;
}

}  // namespace

void register_tokenizer(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer",
                        "Byte-level BPE (model='gpt2') or SentencePiece BPE (model='llama') built "
                        "from GGUF-style tokenizer metadata (tokenizer.ggml.* keys).")
      .def(py::init([](std::string model, std::vector<std::string> tokens, std::string pre,
                       std::optional<std::vector<float>> scores,
                       std::optional<std::vector<std::int32_t>> token_type,
                       std::optional<std::vector<std::string>> merges, std::int32_t bos_id,
                       std::int32_t eos_id, std::int32_t unk_id, std::int32_t pad_id, bool add_bos,
                       bool add_eos, bool add_space_prefix, bool space_prefix_after_special,
                       std::string chat_template) {
             return Tokenizer(make_vocab(
                 std::move(model), std::move(tokens), std::move(pre), std::move(scores),
                 std::move(token_type), std::move(merges), bos_id, eos_id, unk_id, pad_id, add_bos,
                 add_eos, add_space_prefix, space_prefix_after_special, std::move(chat_template)));
           }),
           py::arg("model"), py::arg("tokens"), py::kw_only(), py::arg("pre") = "default",
           py::arg("scores") = py::none(), py::arg("token_type") = py::none(),
           py::arg("merges") = py::none(), py::arg("bos_id") = -1, py::arg("eos_id") = -1,
           py::arg("unk_id") = -1, py::arg("pad_id") = -1, py::arg("add_bos") = false,
           py::arg("add_eos") = false, py::arg("add_space_prefix") = true,
           py::arg("space_prefix_after_special") = true, py::arg("chat_template") = "")
      .def(
          "encode",
          [](const Tokenizer& t, const Text& text, bool add_special, bool parse_special) {
            const std::string bytes = text_bytes(text);
            py::gil_scoped_release release;
            return t.encode(bytes, {.add_special = add_special, .parse_special = parse_special});
          },
          py::arg("text"), py::kw_only(), py::arg("add_special") = true,
          py::arg("parse_special") = false,
          "The token ids of text (str is encoded as UTF-8). add_special: BOS/EOS as the\n"
          "vocabulary's add_bos/add_eos say; parse_special: control-token text (e.g.\n"
          "\"<|im_start|>\") becomes that token.")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<std::int32_t>& ids, bool render_special) {
            return py::bytes(t.decode(ids, {.render_special = render_special}));
          },
          py::arg("ids"), py::kw_only(), py::arg("render_special") = true,
          "The text of token ids as bytes (tokens may split UTF-8 characters); control\n"
          "tokens appear as their text with render_special, else are dropped.")
      .def(
          "token_to_piece",
          [](const Tokenizer& t, std::int32_t id, bool render_special) {
            return py::bytes(t.token_to_piece(id, {.render_special = render_special}));
          },
          py::arg("id"), py::kw_only(), py::arg("render_special") = true,
          "The bytes of one token (control tokens only with render_special).")
      .def("token_id", &Tokenizer::token_id, py::arg("token_text"),
           "The id of a token given by its exact text, -1 when the vocabulary has none.")
      .def("is_control", &Tokenizer::is_control, py::arg("id"),
           "Whether token `id` is a control token (e.g. <|im_end|>).")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size, "Tokens in the vocabulary.")
      .def_property_readonly("bos_id", &Tokenizer::bos_id, "Beginning-of-text token, -1: none.")
      .def_property_readonly("eos_id", &Tokenizer::eos_id, "End-of-text token, -1: none.")
      .def_property_readonly(
          "chat_template", [](const Tokenizer& t) { return t.vocab().chat_template; },
          "The Jinja chat template text from the metadata (\"\" when none).");

  py::class_<StreamingDecoder>(m, "StreamingDecoder",
                               "Decodes token by token, holding back incomplete UTF-8.")
      .def(py::init([](const Tokenizer& t, bool render_special) {
             return StreamingDecoder(t, {.render_special = render_special});
           }),
           py::arg("tokenizer"), py::kw_only(), py::arg("render_special") = true,
           py::keep_alive<1, 2>())
      .def(
          "push", [](StreamingDecoder& d, std::int32_t id) { return py::bytes(d.push(id)); },
          py::arg("id"), "Adds a token; returns the bytes that are complete UTF-8 so far.")
      .def(
          "flush", [](StreamingDecoder& d) { return py::bytes(d.flush()); },
          "Returns what is held back (an incomplete UTF-8 tail) and empties the decoder.");

  py::class_<StopMatcher::Result>(m, "StopMatcherResult", "What StopMatcher.feed releases.")
      .def_property_readonly(
          "text", [](const StopMatcher::Result& r) { return py::bytes(r.text); },
          "Text safe to send now; with stopped, it ends before the stop string\n"
          "(or with it, for a matcher made with keep_stop).")
      .def_readonly("stopped", &StopMatcher::Result::stopped, "A stop string matched.")
      .def_property_readonly(
          "matched", [](const StopMatcher::Result& r) { return py::bytes(r.matched); },
          "With stopped: the stop string found (b\"\" otherwise).");

  py::class_<StopMatcher>(m, "StopMatcher",
                          "Stop strings over streamed text (SamplingParams.stop), as the server\n"
                          "and LLM apply them: text is fed chunk by chunk, and what may be the\n"
                          "start of a stop string is held back until it is known not to be, so a\n"
                          "stop string split across chunks is still found and never released.\n"
                          "Where several match, the one that starts first wins.")
      .def(py::init<std::vector<std::string>, bool>(), py::arg("stops"),
           py::arg("keep_stop") = false,
           "Matches `stops` (str or bytes; empty ones are ignored). keep_stop\n"
           "(SamplingParams.include_stop_str_in_output): the text released at a stop\n"
           "ends with the stop string.")
      .def(
          "feed",
          [](StopMatcher& matcher, const Text& chunk) { return matcher.feed(text_bytes(chunk)); },
          py::arg("chunk"),
          "Feeds the next chunk (str as UTF-8, or bytes); after a stop, returns nothing.")
      .def(
          "finish", [](StopMatcher& matcher) { return py::bytes(matcher.finish()); },
          "The held-back tail when the stream ended without a stop (b\"\" after one).")
      .def_property_readonly("stopped", &StopMatcher::stopped, "A stop string has matched.");

  py::class_<ChatTemplate>(m, "ChatTemplate",
                           "A model's chat template, recognised and rendered natively (ChatML, "
                           "Qwen3, Llama 3/3.1, Llama 2, Gemma 2/3, Phi-3, Mistral [INST] forms).")
      .def(py::init<std::string_view, std::string, std::string>(), py::arg("template"),
           py::arg("bos_text") = "", py::arg("eos_text") = "")
      .def_property_readonly(
          "kind",
          [](const ChatTemplate& t) {
            switch (t.kind()) {
              case ChatTemplateKind::kChatMl:
                return "chatml";
              case ChatTemplateKind::kQwen3:
                return "qwen3";
              case ChatTemplateKind::kLlama3:
                return "llama3";
              case ChatTemplateKind::kLlama2:
                return "llama2";
              case ChatTemplateKind::kGemma:
                return "gemma";
              case ChatTemplateKind::kPhi3:
                return "phi3";
              case ChatTemplateKind::kMistral:
                return "mistral";
            }
            return "";
          },
          "The template's form: \"chatml\", \"qwen3\", \"llama3\", \"llama2\", \"gemma\", "
          "\"phi3\" or \"mistral\".")
      .def_property_readonly("variant", &ChatTemplate::variant,
                             "The form and variant, e.g. \"llama3.1\", \"gemma2\", "
                             "\"mistral-v3-tekken\".")
      .def_property_readonly("default_system_prompt", &ChatTemplate::default_system_prompt,
                             "The system message the template adds when none is given.")
      .def(
          "render",
          [](const ChatTemplate& t, const std::vector<std::map<std::string, std::string>>& messages,
             bool add_generation_prompt, std::optional<bool> enable_thinking,
             std::string date_string) {
            return t.render(
                chat_messages(messages),
                render_options(add_generation_prompt, enable_thinking, std::move(date_string)));
          },
          py::arg("messages"), py::kw_only(), py::arg("add_generation_prompt") = true,
          py::arg("enable_thinking") = py::none(), py::arg("date_string") = "",
          "The prompt text of messages [{\"role\", \"content\"}...], ending with the\n"
          "assistant's turn header when add_generation_prompt. enable_thinking: Qwen3's\n"
          "switch (False writes the empty think block); date_string: Llama 3.1's \"Today\n"
          "Date\" (\"\": the template's default). For display: to tokenize, use encode(),\n"
          "since encoding this text with parse_special would parse the messages too.")
      .def(
          "encode",
          [](const ChatTemplate& t, const Tokenizer& tokenizer,
             const std::vector<std::map<std::string, std::string>>& messages,
             bool add_generation_prompt, std::optional<bool> enable_thinking,
             std::string date_string, bool parse_special_in_messages) {
            const std::vector<ChatMessage> converted = chat_messages(messages);
            const ChatRenderOptions options =
                render_options(add_generation_prompt, enable_thinking, std::move(date_string));
            py::gil_scoped_release release;
            return t.encode(tokenizer, converted, options, parse_special_in_messages);
          },
          py::arg("tokenizer"), py::arg("messages"), py::kw_only(),
          py::arg("add_generation_prompt") = true, py::arg("enable_thinking") = py::none(),
          py::arg("date_string") = "", py::arg("parse_special_in_messages") = false,
          "The prompt token ids of messages (options as render()). Control-token text\n"
          "the template writes becomes control tokens; in the messages' roles and content\n"
          "it stays plain text, so a message cannot forge a turn, unless\n"
          "parse_special_in_messages (only for trusted messages).");
}

}  // namespace pagedattn::python
