// The server's sampling options over real sockets (127.0.0.1, a free port)
// with the synthetic tiny model: OpenAI's logprobs shapes, whole and
// streamed; logit_bias and the penalties checked against their definitions
// applied to an unbiased run's logprobs; min_tokens, stop strings kept in
// the output, echo; and which prompt text becomes control tokens.
#include <httplib.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "chatml_codec.h"
#include "http_server.h"
#include "pagedattn/llama.h"
#include "serve_cli.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;

// A server with the tiny model on its own thread for the life of the object;
// the byte codec unless another is given.
class TinyServer {
 public:
  explicit TinyServer(std::unique_ptr<TextCodec> codec = nullptr) {
    signal(SIGPIPE, SIG_IGN);
    const LlamaConfig c = llama_preset("tiny");
    EngineConfig ec;
    ec.model = make_llama_model(c);
    ec.kv_memory_bytes = 8 << 20;
    // Results that do not depend on the thread count, which the engine
    // lowers while other processes load the machine (StepThreads): the
    // tests compare one request's numbers across requests.
    ec.deterministic = true;
    if (codec == nullptr) codec = make_byte_codec(c.vocab_size, c.eos_token_id);
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    server_ = std::make_unique<HttpServer>(ec, std::move(codec), o);
    server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
  }
  ~TinyServer() {
    server_->shutdown();
    thread_.join();
  }
  TinyServer(const TinyServer&) = delete;
  TinyServer& operator=(const TinyServer&) = delete;

  httplib::Result send(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", server_->bound_port());
    c.set_read_timeout(60, 0);
    return c.Post(path, body.dump(), "application/json");
  }
  json post(const std::string& path, const json& body) const {
    auto res = send(path, body);
    EXPECT_TRUE(res) << "no response";
    if (!res) return json::object();
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body, nullptr, false);
  }
  // The stream's events, "[DONE]" left out.
  std::vector<json> post_stream(const std::string& path, json body) const {
    body["stream"] = true;
    auto res = send(path, body);
    EXPECT_TRUE(res) << "no response";
    if (!res) return {};
    EXPECT_EQ(res->status, 200) << res->body;
    std::vector<json> events;
    std::size_t at = 0;
    while ((at = res->body.find("data: ", at)) != std::string::npos) {
      const std::size_t end = res->body.find("\n\n", at);
      const std::string data = res->body.substr(at + 6, end - at - 6);
      if (data != "[DONE]") events.push_back(json::parse(data, nullptr, false));
      at = end;
    }
    return events;
  }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

class ServerSamplingOptions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TinyServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TinyServer* server_;
};
TinyServer* ServerSamplingOptions::server_ = nullptr;

// The tiny model's EOS: with ignore_eos it may come, listed in logprobs but never text.
const std::string kEos = "<2>";

// Greedy, exactly `max_tokens` new tokens.
json greedy(json prompt, int max_tokens) {
  return {{"prompt", std::move(prompt)},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

// The byte codec's token of a token text: a printable byte, or "<id>".
std::int32_t byte_token_id(const std::string& text) {
  if (text.size() == 1) return static_cast<unsigned char>(text[0]);
  return std::stoi(text.substr(1, text.size() - 2));
}

std::vector<std::int32_t> token_ids(const json& completion_logprobs) {
  std::vector<std::int32_t> ids;
  for (const json& t : completion_logprobs.value("tokens", json::array()))
    ids.push_back(byte_token_id(t));
  return ids;
}

// A completions top_logprobs entry as (token, logprob), most likely first.
std::vector<std::pair<std::int32_t, double>> ranked(const json& top) {
  std::vector<std::pair<std::int32_t, double>> r;
  for (auto it = top.begin(); it != top.end(); ++it)
    r.emplace_back(byte_token_id(it.key()), it.value().get<double>());
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return r;
}

// A streamed completion's logprobs, its chunks' arrays joined.
json joined_completion_logprobs(const std::vector<json>& events) {
  json all = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const json& e : events)
    for (const json& c : e.value("choices", json::array())) {
      if (c["logprobs"].is_null()) continue;
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const json& v : c["logprobs"][key]) all[key].push_back(v);
    }
  return all;
}

TEST_F(ServerSamplingOptions, CompletionLogprobsInOpenAisShapeWholeAndStreamed) {
  json body = greedy("Hello", 8);
  body["logprobs"] = 3;
  json r = server_->post("/v1/completions", body);
  json& choice = r["choices"][0];
  json& lp = choice["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r;
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    ASSERT_EQ(lp[key].size(), 8u) << key;
  std::string text;
  for (std::size_t i = 0; i < 8; ++i) {
    const std::string token = lp["tokens"][i];
    EXPECT_EQ(lp["text_offset"][i], text.size());  // the byte codec's text is ASCII
    if (token != kEos) text += token;
    const double logprob = lp["token_logprobs"][i];
    EXPECT_LE(logprob, 0.0);
    // The 3 most likely tokens; greedy took the most likely of all.
    const auto top = ranked(lp["top_logprobs"][i]);
    ASSERT_EQ(top.size(), 3u) << lp["top_logprobs"][i];
    EXPECT_EQ(top[0].first, byte_token_id(token));
    EXPECT_EQ(top[0].second, logprob);
    double mass = 0;
    for (const auto& [id, p] : top) mass += std::exp(p);
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  EXPECT_EQ(text, choice["text"]);

  json streamed = joined_completion_logprobs(server_->post_stream("/v1/completions", body));
  EXPECT_EQ(streamed["tokens"], lp["tokens"]);
  EXPECT_EQ(streamed["text_offset"], lp["text_offset"]);
  for (std::size_t i = 0; i < 8; ++i)
    EXPECT_EQ(streamed["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>());
}

// A decoded token's logprobs equal those of the same token read as part of a
// prompt (echo): the decode and prefill paths agree.
TEST_F(ServerSamplingOptions, EchoedPromptLogprobsMatchTheGeneratedTokens) {
  json body = greedy("Hello", 6);
  body["logprobs"] = 2;
  json generated = server_->post("/v1/completions", body)["choices"][0];
  const std::vector<std::int32_t> ids = token_ids(generated["logprobs"]);
  std::vector<std::int32_t> prompt = {'H', 'e', 'l', 'l', 'o'};
  prompt.insert(prompt.end(), ids.begin(), ids.end());
  json echo = greedy(prompt, 1);
  echo["echo"] = true;
  echo["logprobs"] = 2;
  json r = server_->post("/v1/completions", echo)["choices"][0];
  EXPECT_TRUE(
      r["text"].get<std::string>().starts_with("Hello" + generated["text"].get<std::string>()));
  json& lp = r["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 1) << lp;
  EXPECT_EQ(lp["tokens"][0], "H");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // the first token has no context
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::size_t at = 5 + i;
    EXPECT_EQ(lp["tokens"][at], generated["logprobs"]["tokens"][i]);
    EXPECT_NEAR(lp["token_logprobs"][at].get<double>(),
                generated["logprobs"]["token_logprobs"][i].get<double>(), 1e-3)
        << "token " << i;
    const auto prefilled = ranked(lp["top_logprobs"][at]);
    const auto decoded = ranked(generated["logprobs"]["top_logprobs"][i]);
    ASSERT_EQ(prefilled.size(), decoded.size());
    for (std::size_t k = 0; k < decoded.size(); ++k) {
      EXPECT_EQ(prefilled[k].first, decoded[k].first);
      EXPECT_NEAR(prefilled[k].second, decoded[k].second, 1e-3);
    }
  }
}

TEST_F(ServerSamplingOptions, ChatLogprobsInOpenAisShapeWholeAndStreamed) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true},
               {"logprobs", true},
               {"top_logprobs", 2}};
  json r = server_->post("/v1/chat/completions", body);
  json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << r;
  std::string text;
  for (json& e : content) {
    const std::string token = e["token"];
    if (token != kEos) text += token;
    json bytes = json::array();
    for (const char c : token) bytes.push_back(static_cast<unsigned char>(c));
    EXPECT_EQ(e["bytes"], bytes);
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    // Greedy: the token is the most likely; the list is in order.
    EXPECT_EQ(e["top_logprobs"][0]["token"], token);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
    EXPECT_GE(e["top_logprobs"][0]["logprob"], e["top_logprobs"][1]["logprob"]);
    EXPECT_NE(e["top_logprobs"][1]["token"], token);
    EXPECT_TRUE(e["top_logprobs"][1]["bytes"].is_array());
  }
  EXPECT_EQ(text, r["choices"][0]["message"]["content"]);

  json streamed = json::array();
  for (json e : server_->post_stream("/v1/chat/completions", body))
    for (json& c : e["choices"])
      if (!c["logprobs"].is_null())
        for (const json& item : c["logprobs"]["content"]) streamed.push_back(item);
  ASSERT_EQ(streamed.size(), content.size());
  for (std::size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(streamed[i]["token"], content[i]["token"]);
    EXPECT_EQ(streamed[i]["logprob"].get<double>(), content[i]["logprob"].get<double>());
  }

  json no_top = body;
  no_top["top_logprobs"] = 0;
  json bare = server_->post("/v1/chat/completions", no_top);
  EXPECT_EQ(bare["choices"][0]["logprobs"]["content"].size(), 6u);
  for (json& e : bare["choices"][0]["logprobs"]["content"])
    EXPECT_EQ(e["top_logprobs"], json::array());
}

TEST_F(ServerSamplingOptions, LogprobsAreNullWhenNotAskedFor) {
  json completion = greedy("Hello", 3);
  json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}};
  EXPECT_TRUE(server_->post("/v1/completions", completion)["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(server_->post("/v1/chat/completions", chat)["choices"][0]["logprobs"].is_null());
  for (json e : server_->post_stream("/v1/completions", completion))
    EXPECT_TRUE(e["choices"][0]["logprobs"].is_null()) << e;
  json chat_false = chat;
  chat_false["logprobs"] = false;
  for (json e : server_->post_stream("/v1/chat/completions", chat_false))
    EXPECT_TRUE(e["choices"][0]["logprobs"].is_null()) << e;
}

// OpenAI's logit_bias is added to the logits before sampling: +100 makes a
// token certain; -100 on greedy's first choice makes it the runner-up.
TEST_F(ServerSamplingOptions, LogitBiasForcesAndBansTokens) {
  json forced = greedy("Hello", 4);
  forced["logit_bias"] = {{"65", 100}};
  EXPECT_EQ(server_->post("/v1/completions", forced)["choices"][0]["text"], "AAAA");

  json plain = greedy("Hello", 1);
  plain["logprobs"] = 2;
  json lp = server_->post("/v1/completions", plain)["choices"][0]["logprobs"];
  const auto top = ranked(lp["top_logprobs"][0]);
  ASSERT_EQ(top.size(), 2u);
  json banned = greedy("Hello", 1);
  banned["logit_bias"] = {{std::to_string(top[0].first), -100}};
  banned["logprobs"] = 0;
  json b = server_->post("/v1/completions", banned)["choices"][0]["logprobs"];
  EXPECT_EQ(token_ids(b), std::vector<std::int32_t>{top[1].first});
  // Logprobs are the model's, before the bias.
  EXPECT_NEAR(b["token_logprobs"][0].get<double>(), top[1].second, 1e-5);
}

// Every token of a penalized greedy run is the argmax of its step's raw
// logprobs (the model's, reported before penalties; top 20) less the penalty
// by its definition over the run's earlier tokens: `per_occurrence`,
// frequency (the penalty times the count so far), else presence (once for
// any count). The plain greedy run repeats a token, and somewhere the penalty
// must change the choice.
void expect_penalty_follows_its_definition(const TinyServer& server, const char* field,
                                           double penalty, bool per_occurrence) {
  SCOPED_TRACE(field);
  constexpr int kTokens = 40;
  json plain = greedy("Hello", kTokens);
  plain["logprobs"] = 0;
  const std::vector<std::int32_t> plain_ids =
      token_ids(server.post("/v1/completions", plain)["choices"][0]["logprobs"]);
  ASSERT_EQ(plain_ids.size(), std::size_t(kTokens));
  ASSERT_LT(std::set<std::int32_t>(plain_ids.begin(), plain_ids.end()).size(), plain_ids.size())
      << "the plain greedy output never repeats a token";

  json penalized = greedy("Hello", kTokens);
  penalized[field] = penalty;
  penalized["logprobs"] = 20;
  json lp = server.post("/v1/completions", penalized)["choices"][0]["logprobs"];
  const std::vector<std::int32_t> ids = token_ids(lp);
  ASSERT_EQ(ids.size(), std::size_t(kTokens));
  std::map<std::int32_t, int> counts;
  int steps_decided_by_the_penalty = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto top = ranked(lp["top_logprobs"][i]);
    double best_score = -std::numeric_limits<double>::infinity();
    std::int32_t best = -1;
    for (const auto& [id, logprob] : top) {  // most likely first: ties keep the lower id
      const int count = counts.contains(id) ? counts[id] : 0;
      const double score = logprob - penalty * (per_occurrence ? count : (count > 0 ? 1 : 0));
      if (score > best_score) {
        best_score = score;
        best = id;
      }
    }
    // No token outside the top 20 can beat it: none is more likely than the 20th.
    ASSERT_GT(best_score, top.back().second) << "step " << i;
    EXPECT_EQ(ids[i], best) << "step " << i;
    steps_decided_by_the_penalty += best != top[0].first ? 1 : 0;
    ++counts[ids[i]];
  }
  EXPECT_GT(steps_decided_by_the_penalty, 0);
  EXPECT_NE(ids, plain_ids);
}

TEST_F(ServerSamplingOptions, FrequencyAndPresencePenaltiesBreakARepeatingGreedyOutput) {
  expect_penalty_follows_its_definition(*server_, "frequency_penalty", 2.0, true);
  expect_penalty_follows_its_definition(*server_, "presence_penalty", 2.0, false);
}

// vLLM's min_tokens: stop tokens cannot come before that many tokens.
TEST_F(ServerSamplingOptions, MinTokensHoldsBackStopTokens) {
  json plain = greedy("Hello", 6);
  plain["logprobs"] = 0;
  const std::int32_t first =
      token_ids(server_->post("/v1/completions", plain)["choices"][0]["logprobs"])[0];
  json stopped = greedy("Hello", 6);
  stopped["stop_token_ids"] = {first};
  json s = server_->post("/v1/completions", stopped);
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s["usage"]["completion_tokens"], 1);
  stopped["min_tokens"] = 3;
  stopped["logprobs"] = 0;
  json m = server_->post("/v1/completions", stopped);
  EXPECT_GE(m["usage"]["completion_tokens"], 3) << m;
  const std::vector<std::int32_t> ids = token_ids(m["choices"][0]["logprobs"]);
  ASSERT_GE(ids.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NE(ids[i], first) << "token " << i;
}

TEST_F(ServerSamplingOptions, IncludeStopStrInOutputKeepsTheStopString) {
  const std::string text =
      server_->post("/v1/completions", greedy("Hello", 12))["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  const std::string expected = text.substr(0, text.find(stop)) + stop;
  json body = greedy("Hello", 12);
  body["stop"] = {stop};
  body["include_stop_str_in_output"] = true;
  json whole = server_->post("/v1/completions", body)["choices"][0];
  EXPECT_EQ(whole["text"], expected);
  EXPECT_EQ(whole["finish_reason"], "stop");
  std::string streamed;
  for (json e : server_->post_stream("/v1/completions", body))
    streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, expected);
}

TEST_F(ServerSamplingOptions, EchoPutsThePromptBeforeTheCompletion) {
  const std::string plain = server_->post("/v1/completions", greedy("Hi", 3))["choices"][0]["text"];
  json body = greedy("Hi", 3);
  body["echo"] = true;
  EXPECT_EQ(server_->post("/v1/completions", body)["choices"][0]["text"], "Hi" + plain);
  std::string streamed;
  for (json e : server_->post_stream("/v1/completions", body))
    streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, "Hi" + plain);
}

// A completions prompt's control-token text becomes the control token (one
// prompt token) unless the server was told otherwise; chat content never
// does by default.
TEST(ServerSpecialTokens, ParsedInCompletionPromptsNotInChatMessages) {
  const TinyServer parsing(testing::make_chatml_codec({}, {.vocab_size = 1024}));
  const TinyServer plain(
      testing::make_chatml_codec({.parse_special_in_prompts = false}, {.vocab_size = 1024}));
  json prompt = {{"prompt", "<|im_start|>user"}, {"max_tokens", 1}};
  EXPECT_EQ(parsing.post("/v1/completions", prompt)["usage"]["prompt_tokens"], 1 + 4);
  EXPECT_EQ(plain.post("/v1/completions", prompt)["usage"]["prompt_tokens"], 12 + 4);
  const auto chat_prompt_tokens = [&](const std::string& content) {
    json body = {{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 1}};
    return parsing.post("/v1/chat/completions", body)["usage"]["prompt_tokens"].get<int>();
  };
  // "<|im_end|>" in a message is its 10 bytes, not one control token.
  EXPECT_EQ(chat_prompt_tokens("<|im_end|>") - chat_prompt_tokens("x"), 10 - 1);
}

// A GGUF model's token that is part of a UTF-8 character: `bytes` holds its
// byte, `token` (JSON text) shows U+FFFD. The test vocabulary's byte tokens
// are ids 3..258 in byte order, so byte 0xC3 (a two-byte character's lead)
// is token 198.
TEST(ServerLogprobs, APieceOfACharacterShowsItsBytes) {
  const TinyServer server(testing::make_chatml_codec({}, {.vocab_size = 1024}));
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 2},
                     {"logit_bias", {{"198", 100}}},
                     {"logprobs", true},
                     {"top_logprobs", 1}};
  json r = server.post("/v1/chat/completions", body);
  json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << r;
  for (json& e : content) {
    EXPECT_EQ(e["bytes"], json::array({0xC3}));
    EXPECT_EQ(e["token"], "\xEF\xBF\xBD");  // U+FFFD
  }
}

TEST(ServeCli, SpecialTokenFlags) {
  const auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), {"pagedattn", "serve", "--model", "tiny"});
    return parse_serve_options(int(args.size()), const_cast<char**>(args.data()), 2).special_tokens;
  };
  EXPECT_TRUE(parse({}).parse_special_in_prompts);
  EXPECT_FALSE(parse({}).parse_special_in_messages);
  EXPECT_FALSE(parse({"--no-parse-special-in-prompts"}).parse_special_in_prompts);
  EXPECT_TRUE(parse({"--parse-special-in-messages"}).parse_special_in_messages);
  const std::string help = serve_help();
  EXPECT_NE(help.find("--no-parse-special-in-prompts"), std::string::npos) << help;
  EXPECT_NE(help.find("--parse-special-in-messages"), std::string::npos) << help;
}

}  // namespace
}  // namespace pagedattn::serve
