#include "openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxStopStrings = 16;

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

std::vector<std::int32_t> token_ids(const json& v, const std::string& name, std::int32_t vocab) {
  std::vector<std::int32_t> ids;
  ids.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    ids.push_back(static_cast<std::int32_t>(
        integer(v[i], name + "[" + std::to_string(i) + "]", 0, vocab - 1)));
  return ids;
}

// A string, an array of token ids, or a one-element array of either.
std::vector<std::int32_t> completion_prompt(const json& body, const TextCodec& codec,
                                            const RequestLimits& limits) {
  const json* p = field(body, "prompt");
  if (p == nullptr) bad_field("prompt", "is required");
  if (p->is_string()) return codec.encode(p->get_ref<const std::string&>());
  if (!p->is_array()) bad_field("prompt", "must be a string or an array of token ids");
  if (p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    const json& only = (*p)[0];
    if (only.is_string()) return codec.encode(only.get_ref<const std::string&>());
    return token_ids(only, "prompt[0]", limits.vocab_size);
  }
  if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
    bad_field("prompt", "holds several prompts; send one prompt per request");
  return token_ids(*p, "prompt", limits.vocab_size);
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

std::vector<std::int32_t> chat_prompt(const json& body, const TextCodec& codec) {
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
    return codec.encode_chat(messages);
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

void read_max_tokens(const json& body, Endpoint endpoint, const RequestLimits& limits,
                     GenerationRequest& r) {
  const std::int64_t prompt = std::ssize(r.prompt_ids);
  if (prompt >= limits.max_position)
    throw ApiError(413,
                   "the prompt has " + std::to_string(prompt) + " tokens; the model's context is " +
                       std::to_string(limits.max_position),
                   endpoint == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded");
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
  const json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!doc.is_object()) throw ApiError(400, "the request body must be a JSON object");
  GenerationRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(doc, "model")) {
    if (!m->is_string()) bad_field("model", "must be a string");
    r.model = m->get<std::string>();
  }
  read_sampling(doc, limits, r);
  r.prompt_ids =
      endpoint == Endpoint::kChat ? chat_prompt(doc, codec) : completion_prompt(doc, codec, limits);
  if (r.prompt_ids.empty())
    bad_field(endpoint == Endpoint::kChat ? "messages" : "prompt", "must not be empty");
  read_max_tokens(doc, endpoint, limits, r);
  return r;
}

}  // namespace pagedattn::serve
