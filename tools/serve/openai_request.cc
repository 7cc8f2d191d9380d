#include "openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxStopStrings = 16;
// Containers nested in one another, at most. An OpenAI request needs a
// handful; a body of brackets would build a DOM many times its size.
constexpr int kMaxJsonDepth = 64;

[[noreturn]] void bad_field(const std::string& field, const std::string& why) {
  throw ApiError(400, "'" + field + "' " + why, field);
}

// The field, or nullptr when absent or null (OpenAI treats null as absent).
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The value as the client wrote it (JSON; numbers in their shortest form),
// cut short: it is the client's and may be long.
std::string shown(const json& v) {
  constexpr std::size_t kShown = 40;
  const std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > kShown ? text.substr(0, kShown) + "..." : text;
}

// The field and the value it was given: "'temperature' = 3.5 must be ...".
[[noreturn]] void bad_value(const std::string& field, const json& v, const std::string& why) {
  bad_field(field, "= " + shown(v) + " " + why);
}

// The shortest text that reads back as x (2, 0.5, 1e+30), where std::to_string
// would write 2.000000.
std::string shortest(double x) {
  char buf[32];
  const auto [end, error] = std::to_chars(buf, buf + sizeof buf, x);
  return error == std::errc() ? std::string(buf, end) : "?";
}

std::string integer_range(std::int64_t min, std::int64_t max) {
  return "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

std::int64_t integer(const json& v, const std::string& name, std::int64_t min, std::int64_t max) {
  if (!v.is_number_integer()) bad_value(name, v, integer_range(min, max));
  // Unsigned values above int64 max come back as large uint64.
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(max))
    bad_value(name, v, integer_range(min, max));
  const std::int64_t x = v.get<std::int64_t>();
  if (x < min || x > max) bad_value(name, v, integer_range(min, max));
  return x;
}

// A number in [min, max], or in (min, max] when `min_excluded`.
double number(const json& v, const std::string& name, double min, double max,
              bool min_excluded = false) {
  const std::string range = "must be a number in " + std::string(min_excluded ? "(" : "[") +
                            shortest(min) + ", " + shortest(max) + "]";
  if (!v.is_number()) bad_value(name, v, range);
  const double x = v.get<double>();
  const bool above_min = min_excluded ? x > min : x >= min;
  if (!std::isfinite(x) || !above_min || x > max) bad_value(name, v, range);
  return x;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad_value(name, v, "must be a boolean");
  return v.get<bool>();
}

// The body as a DOM; 400 for one that is not JSON or nests deeper than
// kMaxJsonDepth, found as the parser opens the container (before the
// rest is built).
json parse_body(std::string_view body) {
  const json::parser_callback_t refuse_deep_nesting = [](int depth, json::parse_event_t event,
                                                         json&) {
    const bool opens =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    // `depth` counts the containers around the one that opens.
    if (opens && depth >= kMaxJsonDepth)
      throw ApiError(400, "the request body nests JSON deeper than " +
                              std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  json doc = json::parse(body, refuse_deep_nesting, false);
  if (doc.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  return doc;
}

// Prompt tokens a request may have: the context less the first new token.
std::int64_t max_prompt_tokens(const RequestLimits& limits) {
  return limits.max_position - 1;
}

[[noreturn]] void prompt_exceeds_context(std::int64_t tokens, const std::string& field,
                                         const RequestLimits& limits) {
  throw ApiError(413,
                 "the prompt has " + std::to_string(tokens) + " tokens; the model's context is " +
                     std::to_string(limits.max_position),
                 field, "context_length_exceeded");
}

// The prompt's text tokenized, or 413 when its length alone shows it cannot
// fit the context (the codec refuses it before tokenizing).
template <typename Encode>
std::vector<std::int32_t> encode_prompt(const Encode& encode, const std::string& field,
                                        const RequestLimits& limits) {
  try {
    return encode(max_prompt_tokens(limits));
  } catch (const TextTooLong& e) {
    const std::uint64_t most =
        std::uint64_t(std::max<std::int64_t>(0, max_prompt_tokens(limits))) * e.max_token_bytes();
    throw ApiError(413,
                   "the prompt's text has " + std::to_string(e.text_bytes()) +
                       " bytes; the model's context of " + std::to_string(limits.max_position) +
                       " tokens holds at most " + std::to_string(most) + " bytes (" +
                       std::to_string(e.max_token_bytes()) + " per token)",
                   field, "context_length_exceeded");
  }
}

std::vector<std::int32_t> encode_text(const json& text, const TextCodec& codec,
                                      const RequestLimits& limits) {
  return encode_prompt(
      [&](std::int64_t max_tokens) {
        return codec.encode(text.get_ref<const std::string&>(), max_tokens);
      },
      "prompt", limits);
}

std::vector<std::int32_t> token_ids(const json& v, const std::string& name, std::int32_t vocab) {
  std::vector<std::int32_t> ids;
  ids.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    ids.push_back(static_cast<std::int32_t>(
        integer(v[i], name + "[" + std::to_string(i) + "]", 0, vocab - 1)));
  return ids;
}

// Counted before they are checked and copied.
std::vector<std::int32_t> prompt_token_ids(const json& v, const std::string& name,
                                           const RequestLimits& limits) {
  if (std::int64_t(v.size()) > max_prompt_tokens(limits))
    prompt_exceeds_context(std::int64_t(v.size()), "prompt", limits);
  return token_ids(v, name, limits.vocab_size);
}

// A string, an array of token ids, or a one-element array of either.
std::vector<std::int32_t> completion_prompt(const json& body, const TextCodec& codec,
                                            const RequestLimits& limits) {
  const json* p = field(body, "prompt");
  if (p == nullptr) bad_field("prompt", "is required");
  if (p->is_string()) return encode_text(*p, codec, limits);
  if (!p->is_array()) bad_field("prompt", "must be a string or an array of token ids");
  if (p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    const json& only = (*p)[0];
    if (only.is_string()) return encode_text(only, codec, limits);
    return prompt_token_ids(only, "prompt[0]", limits);
  }
  if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
    bad_field("prompt", "holds several prompts; send one prompt per request");
  return prompt_token_ids(*p, "prompt", limits);
}

// Content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& m, const std::string& name) {
  const json* c = field(m, "content");
  if (c == nullptr) return {};
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad_field(name + ".content", "must be a string or an array of text parts");
  std::string text;
  for (std::size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string part_name = name + ".content[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad_field(part_name, "must be {\"type\": \"text\", \"text\": STRING}");
    text += part["text"].get<std::string>();
  }
  return text;
}

// The codec's or chat template's error as the client's: without the internal
// function that raised it ("ChatTemplate::render: "), and naming the messages
// once: the text may name them already ("messages[1].role ..."), else they
// are named here.
std::string chat_error_message(std::string_view what) {
  constexpr std::string_view kMessages = "messages";
  const std::size_t qualifier = what.find(": ");
  if (qualifier != std::string_view::npos &&
      what.substr(0, qualifier).find("::") != std::string_view::npos)
    what.remove_prefix(qualifier + 2);
  if (what.starts_with(kMessages)) return std::string(what);
  return "messages: " + std::string(what);
}

std::vector<std::int32_t> chat_prompt(const json& body, const TextCodec& codec,
                                      const RequestLimits& limits) {
  const json* ms = field(body, "messages");
  if (ms == nullptr) bad_field("messages", "is required");
  if (!ms->is_array() || ms->empty()) bad_field("messages", "must be a non-empty array");
  std::vector<ChatMessage> messages;
  for (std::size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_field(name, "must be an object");
    const json* role = field(m, "role");
    if (role == nullptr || !role->is_string()) bad_field(name + ".role", "must be a string");
    messages.push_back({role->get<std::string>(), message_content(m, name)});
  }
  try {
    return encode_prompt(
        [&](std::int64_t max_tokens) { return codec.encode_chat(messages, max_tokens); },
        "messages", limits);
  } catch (const InvalidArgument& e) {
    throw ApiError(400, chat_error_message(e.what()), "messages");
  }
}

std::vector<std::string> stop_strings(const json& body) {
  const json* s = field(body, "stop");
  if (s == nullptr) return {};
  if (s->is_string()) return {s->get<std::string>()};
  if (!s->is_array() || s->size() > kMaxStopStrings)
    bad_field("stop", "must be a string or an array of at most " + std::to_string(kMaxStopStrings) +
                          " strings");
  std::vector<std::string> stops;
  for (std::size_t i = 0; i < s->size(); ++i) {
    if (!(*s)[i].is_string()) bad_field("stop[" + std::to_string(i) + "]", "must be a string");
    stops.push_back((*s)[i].get<std::string>());
  }
  return stops;
}

std::int64_t pages_for(std::int64_t tokens, std::int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

// KV pages a request needs alone: the prompt once, each sample's own tail
// (the engine's admission rule).
std::int64_t pages_needed(std::int64_t prompt, std::int64_t max_tokens, std::int64_t n,
                          std::int64_t ps) {
  const std::int64_t total = pages_for(prompt + max_tokens, ps);
  return total + (n - 1) * (total - prompt / ps);
}

// A request's cache_salt as the engine's 64-bit salt: FNV-1a, with 0 (the
// engine's unsalted default) kept for requests that give none.
std::uint64_t cache_salt_hash(const std::string& salt) {
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : salt) h = (h ^ c) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

// The most new tokens that fit the context and the pool (0: none fit).
std::int64_t max_tokens_that_fit(std::int64_t prompt, std::int64_t n, const RequestLimits& l) {
  std::int64_t lo = 0, hi = l.max_position - prompt;
  while (lo < hi) {  // pages_needed grows with max_tokens
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (pages_needed(prompt, mid, n, l.page_size) <= l.num_pages)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void read_sampling(const json& body, const RequestLimits& limits, GenerationRequest& r) {
  SamplingParams& p = r.params;
  if (const json* v = field(body, "temperature"))
    p.temperature = float(number(*v, "temperature", 0, 2));
  if (const json* v = field(body, "top_p")) {
    p.top_p = float(number(*v, "top_p", 0, 1, true));
    // A positive double below float's range rounds to 0, which the engine refuses.
    if (p.top_p <= 0.0f) bad_value("top_p", *v, "must be a number in (0, 1]");
  }
  if (const json* v = field(body, "top_k")) {
    const std::int64_t k = integer(*v, "top_k", -1, limits.vocab_size);
    p.top_k = k < 0 ? 0 : std::int32_t(k);  // -1: off, as in vLLM
  }
  if (const json* v = field(body, "n")) p.n = std::int32_t(integer(*v, "n", 1, limits.max_n));
  if (const json* v = field(body, "seed"))
    p.seed =
        static_cast<std::uint64_t>(integer(*v, "seed", std::numeric_limits<std::int64_t>::min(),
                                           std::numeric_limits<std::int64_t>::max()));
  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) bad_field("stop_token_ids", "must be an array of token ids");
    p.stop_token_ids = token_ids(*v, "stop_token_ids", limits.vocab_size);
  }
  if (const json* v = field(body, "ignore_eos")) p.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = field(body, "cache_salt")) {
    if (!v->is_string() || v->get_ref<const std::string&>().empty())
      bad_field("cache_salt", "must be a non-empty string");
    p.cache_salt = cache_salt_hash(v->get_ref<const std::string&>());
  }
  if (const json* v = field(body, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) bad_field("stream_options", "must be an object");
    if (const json* u = field(*v, "include_usage"))
      r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  r.stop = stop_strings(body);
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, sorted by token.
std::vector<std::pair<std::int32_t, float>> logit_bias(const json& v, std::int32_t vocab) {
  const std::string ids = "a token id in [0, " + std::to_string(vocab - 1) + "]";
  if (!v.is_object()) bad_value("logit_bias", v, "must be an object mapping token ids to biases");
  std::vector<std::pair<std::int32_t, float>> biases;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    std::int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || id < 0 || id >= vocab)
      bad_field("logit_bias", "key " + shown(json(key)) + " must be " + ids);
    const std::string name = "logit_bias." + std::to_string(id);
    biases.emplace_back(std::int32_t(id), float(number(it.value(), name, -100, 100)));
  }
  std::sort(biases.begin(), biases.end());
  // "7" and "007" are one token.
  for (std::size_t i = 1; i < biases.size(); ++i)
    if (biases[i].first == biases[i - 1].first)
      bad_field("logit_bias", "gives token " + std::to_string(biases[i].first) + " more than once");
  return biases;
}

// Penalties and vLLM's extra sampling fields; min_tokens is checked against
// max_tokens once that is known.
void read_penalties(const json& body, const RequestLimits& limits, SamplingParams& p) {
  if (const json* v = field(body, "presence_penalty"))
    p.presence_penalty = float(number(*v, "presence_penalty", -2, 2));
  if (const json* v = field(body, "frequency_penalty"))
    p.frequency_penalty = float(number(*v, "frequency_penalty", -2, 2));
  if (const json* v = field(body, "repetition_penalty")) {
    p.repetition_penalty = float(number(*v, "repetition_penalty", 0, 100, true));
    if (p.repetition_penalty <= 0.0f)  // below float's range
      bad_value("repetition_penalty", *v, "must be a number in (0, 100]");
  }
  if (const json* v = field(body, "min_p")) p.min_p = float(number(*v, "min_p", 0, 1));
  if (const json* v = field(body, "min_tokens"))
    p.min_tokens =
        std::int32_t(integer(*v, "min_tokens", 0, std::numeric_limits<std::int32_t>::max()));
  if (const json* v = field(body, "logit_bias")) p.logit_bias = logit_bias(*v, limits.vocab_size);
  if (const json* v = field(body, "include_stop_str_in_output"))
    p.include_stop_str_in_output = boolean(*v, "include_stop_str_in_output");
}

// Completions: `logprobs` is the number of alternatives (and `echo` adds the
// prompt's). Chat: `logprobs` is a boolean and `top_logprobs` the number.
void read_logprobs(const json& body, Endpoint endpoint, GenerationRequest& r) {
  SamplingParams& p = r.params;
  if (endpoint == Endpoint::kCompletions) {
    if (const json* v = field(body, "logprobs"))
      p.logprobs = std::int32_t(integer(*v, "logprobs", 0, kMaxLogprobs));
    if (const json* v = field(body, "echo")) r.echo = boolean(*v, "echo");
    if (r.echo) p.prompt_logprobs = p.logprobs;
    return;
  }
  const json* wanted = field(body, "logprobs");
  const bool logprobs = wanted != nullptr && boolean(*wanted, "logprobs");
  if (logprobs) p.logprobs = 0;
  if (const json* v = field(body, "top_logprobs")) {
    const std::int64_t top = integer(*v, "top_logprobs", 0, kMaxLogprobs);
    if (!logprobs) bad_field("top_logprobs", "needs 'logprobs' = true");
    p.logprobs = std::int32_t(top);
  }
  if (const json* v = field(body, "echo"); v != nullptr && boolean(*v, "echo"))
    bad_field("echo", "is supported for completions only");
}

// With echo: the prompt as sent, or its token ids as text.
std::string echoed_prompt(const json& body, const std::vector<std::int32_t>& ids,
                          const TextCodec& codec) {
  const json& p = body.at("prompt");
  if (p.is_string()) return p.get<std::string>();
  if (p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  const std::unique_ptr<TextStream> decoder = codec.decoder();
  std::string text;
  for (const std::int32_t id : ids) text += decoder->push(id);
  return text + decoder->flush();
}

void read_max_tokens(const json& body, Endpoint endpoint, const RequestLimits& limits,
                     GenerationRequest& r) {
  const std::int64_t prompt = std::ssize(r.prompt_ids);
  if (prompt > max_prompt_tokens(limits))
    prompt_exceeds_context(prompt, endpoint == Endpoint::kChat ? "messages" : "prompt", limits);
  const char* name = "max_tokens";
  const json* v = field(body, name);
  if (v == nullptr && endpoint == Endpoint::kChat) {
    name = "max_completion_tokens";
    v = field(body, name);
  }
  const std::int64_t fit = max_tokens_that_fit(prompt, r.params.n, limits);
  if (v == nullptr) {  // OpenAI's defaults: 16 for completions, the rest of the context for chat
    const std::int64_t wanted = endpoint == Endpoint::kChat ? limits.max_position - prompt : 16;
    r.params.max_tokens = std::int32_t(std::max<std::int64_t>(1, std::min(wanted, fit)));
  } else {
    r.params.max_tokens =
        std::int32_t(integer(*v, name, 1, std::numeric_limits<std::int32_t>::max()));
  }
  if (prompt + r.params.max_tokens > limits.max_position)
    throw ApiError(413,
                   "prompt (" + std::to_string(prompt) + " tokens) + " + name + " (" +
                       std::to_string(r.params.max_tokens) + ") exceeds the model's context of " +
                       std::to_string(limits.max_position) + " tokens",
                   name, "context_length_exceeded");
  const std::int64_t need = pages_needed(prompt, r.params.max_tokens, r.params.n, limits.page_size);
  if (need > limits.num_pages)
    throw ApiError(413,
                   "the request needs up to " + std::to_string(need) + " KV pages (prompt " +
                       std::to_string(prompt) + ", " + name + " " +
                       std::to_string(r.params.max_tokens) + ", n " + std::to_string(r.params.n) +
                       "); the KV pool has " + std::to_string(limits.num_pages),
                   name, "kv_pool_exceeded");
}

}  // namespace

GenerationRequest parse_generation_request(std::string_view body, Endpoint endpoint,
                                           const TextCodec& codec, const RequestLimits& limits) {
  const json doc = parse_body(body);
  if (!doc.is_object()) throw ApiError(400, "the request body must be a JSON object");
  GenerationRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(doc, "model")) {
    if (!m->is_string()) bad_field("model", "must be a string");
    r.model = m->get<std::string>();
  }
  read_sampling(doc, limits, r);
  read_penalties(doc, limits, r.params);
  read_logprobs(doc, endpoint, r);
  r.prompt_ids = endpoint == Endpoint::kChat ? chat_prompt(doc, codec, limits)
                                             : completion_prompt(doc, codec, limits);
  if (r.prompt_ids.empty())
    bad_field(endpoint == Endpoint::kChat ? "messages" : "prompt", "must not be empty");
  read_max_tokens(doc, endpoint, limits, r);
  if (r.params.min_tokens > r.params.max_tokens)
    bad_value(
        "min_tokens", doc.at("min_tokens"),
        "must be an integer in [0, max_tokens = " + std::to_string(r.params.max_tokens) + "]");
  if (r.echo) r.prompt_text = echoed_prompt(doc, r.prompt_ids, codec);
  return r;
}

}  // namespace pagedattn::serve
