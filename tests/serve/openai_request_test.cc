#include "openai_request.h"

#include <gtest/gtest.h>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

const RequestLimits kLimits{
    .vocab_size = 300, .max_position = 64, .num_pages = 8, .page_size = 4, .max_n = 4};

GenerationRequest parse(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  static const auto codec = make_byte_codec(300, 2);
  return parse_generation_request(body, e, *codec, kLimits);
}

// The status and the field an ApiError names.
std::pair<int, std::string> error_of(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  try {
    parse(body, e);
  } catch (const ApiError& err) {
    return {err.status(), err.param()};
  }
  return {0, "accepted"};
}

TEST(OpenAiRequest, ReadsTheFields) {
  const GenerationRequest r = parse(
      R"({"model": "m", "prompt": "ab", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
          "n": 2, "seed": 11, "stop": ["x", "yz"], "stop_token_ids": [3], "stream": true,
          "stream_options": {"include_usage": true}})");
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{'a', 'b'}));
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 7);
  EXPECT_EQ(r.params.n, 2);
  EXPECT_EQ(r.params.seed, 11u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<std::int32_t>{3}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, PromptsAsTokenIdsAndChatMessages) {
  EXPECT_EQ(parse(R"({"prompt": [5, 299]})").prompt_ids, (std::vector<std::int32_t>{5, 299}));
  EXPECT_EQ(parse(R"({"prompt": [[7]]})").prompt_ids, (std::vector<std::int32_t>{7}));
  EXPECT_EQ(parse(R"({"prompt": ["hi"]})").prompt_ids, (std::vector<std::int32_t>{'h', 'i'}));
  const GenerationRequest chat = parse(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}], "max_tokens": 2})",
      Endpoint::kChat);
  const std::string text(chat.prompt_ids.begin(), chat.prompt_ids.end());
  EXPECT_EQ(text, "user: q\nassistant: ");
}

TEST(OpenAiRequest, DefaultsFollowOpenAi) {
  EXPECT_EQ(parse(R"({"prompt": "a"})").params.max_tokens, 16);
  // Chat: the rest of what fits (8 pages of 4 tokens = 32 tokens, 1 is the prompt's).
  const auto chat = parse(R"({"messages": [{"role": "user", "content": ""}]})", Endpoint::kChat);
  EXPECT_EQ(std::ssize(chat.prompt_ids) + chat.params.max_tokens, 32);
}

TEST(OpenAiRequest, BadFieldsAre400NamingTheField) {
  using P = std::pair<int, std::string>;
  EXPECT_EQ(error_of("{bad"), P(400, ""));
  EXPECT_EQ(error_of("[1]"), P(400, ""));
  EXPECT_EQ(error_of(R"({})"), P(400, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": 3})"), P(400, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": ""})"), P(400, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"]})"), P(400, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": [1, 300]})"), P(400, "prompt[1]"));
  EXPECT_EQ(error_of(R"({"prompt": [1, -1]})"), P(400, "prompt[1]"));
  EXPECT_EQ(error_of(R"({"prompt": [1.5]})"), P(400, "prompt[0]"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": "4"})"), P(400, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 0})"), P(400, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 1e30})"), P(400, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 18446744073709551615})"),
            P(400, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "temperature": "hot"})"), P(400, "temperature"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "temperature": 3})"), P(400, "temperature"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "top_p": 0})"), P(400, "top_p"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 5})"), P(400, "n"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "stop": 1})"), P(400, "stop"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "stop": ["a", 1]})"), P(400, "stop[1]"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "stop_token_ids": [300]})"), P(400, "stop_token_ids[0]"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "stream": "yes"})"), P(400, "stream"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "model": 1})"), P(400, "model"));
  EXPECT_EQ(error_of(R"({"messages": []})", Endpoint::kChat), P(400, "messages"));
  EXPECT_EQ(error_of(R"({"messages": [{"content": "x"}]})", Endpoint::kChat),
            P(400, "messages[0].role"));
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": 5}]})", Endpoint::kChat),
            P(400, "messages[0].content"));
}

TEST(OpenAiRequest, ReadsPenaltiesAndVllmsSamplingFields) {
  const GenerationRequest r = parse(
      R"({"prompt": "ab", "max_tokens": 6, "presence_penalty": -1.5, "frequency_penalty": 2,
          "repetition_penalty": 1.3, "min_p": 0.05, "min_tokens": 6,
          "logit_bias": {"299": -100, "7": 2.5, "0": 100}, "include_stop_str_in_output": true})");
  EXPECT_FLOAT_EQ(r.params.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.05f);
  EXPECT_EQ(r.params.min_tokens, 6);
  // By token id, whatever the order in the object.
  EXPECT_EQ(r.params.logit_bias,
            (std::vector<std::pair<std::int32_t, float>>{{0, 100.0f}, {7, 2.5f}, {299, -100.0f}}));
  EXPECT_TRUE(r.params.include_stop_str_in_output);
  // Absent: the engine's defaults (off).
  const GenerationRequest plain = parse(R"({"prompt": "ab"})");
  EXPECT_FLOAT_EQ(plain.params.presence_penalty, 0.0f);
  EXPECT_FLOAT_EQ(plain.params.frequency_penalty, 0.0f);
  EXPECT_FLOAT_EQ(plain.params.repetition_penalty, 1.0f);
  EXPECT_FLOAT_EQ(plain.params.min_p, 0.0f);
  EXPECT_EQ(plain.params.min_tokens, 0);
  EXPECT_TRUE(plain.params.logit_bias.empty());
  EXPECT_FALSE(plain.params.include_stop_str_in_output);
  EXPECT_FALSE(plain.params.logprobs.has_value());
  EXPECT_FALSE(plain.params.prompt_logprobs.has_value());
  EXPECT_FALSE(plain.echo);
}

TEST(OpenAiRequest, LogprobsInEachEndpointsShape) {
  // Completions: an integer, the alternatives per token.
  EXPECT_EQ(parse(R"({"prompt": "a", "logprobs": 3})").params.logprobs, 3);
  EXPECT_EQ(parse(R"({"prompt": "a", "logprobs": 0})").params.logprobs, 0);
  // Chat: a boolean, with top_logprobs the alternatives.
  const auto chat = [](const std::string& fields) {
    return parse(
               R"({"messages": [{"role": "user", "content": "q"}], "max_tokens": 2)" + fields + "}",
               Endpoint::kChat)
        .params.logprobs;
  };
  EXPECT_EQ(chat(R"(, "logprobs": true, "top_logprobs": 5)"), 5);
  EXPECT_EQ(chat(R"(, "logprobs": true)"), 0);
  EXPECT_FALSE(chat(R"(, "logprobs": false)").has_value());
  EXPECT_FALSE(chat("").has_value());
}

TEST(OpenAiRequest, EchoStartsTheTextWithThePrompt) {
  const GenerationRequest text = parse(R"({"prompt": "hi!", "echo": true, "logprobs": 2})");
  EXPECT_TRUE(text.echo);
  EXPECT_EQ(text.prompt_text, "hi!");
  EXPECT_EQ(text.params.prompt_logprobs, 2);  // the prompt's logprobs lead the choice's
  // Token ids: decoded as the codec decodes output.
  const GenerationRequest ids = parse(R"({"prompt": [104, 105, 299], "echo": true})");
  EXPECT_EQ(ids.prompt_text, "hi<299>");
  EXPECT_FALSE(ids.params.prompt_logprobs.has_value());  // no logprobs asked for
}

TEST(OpenAiRequest, BadSamplingFieldsAre400NamingTheField) {
  using P = std::pair<int, std::string>;
  const auto completion = [](const std::string& fields) {
    return error_of(R"({"prompt": "a", "max_tokens": 4, )" + fields + "}");
  };
  EXPECT_EQ(completion(R"("presence_penalty": 2.5)"), P(400, "presence_penalty"));
  EXPECT_EQ(completion(R"("presence_penalty": "x")"), P(400, "presence_penalty"));
  EXPECT_EQ(completion(R"("frequency_penalty": -2.01)"), P(400, "frequency_penalty"));
  EXPECT_EQ(completion(R"("repetition_penalty": 0)"), P(400, "repetition_penalty"));
  EXPECT_EQ(completion(R"("repetition_penalty": 1e-300)"), P(400, "repetition_penalty"));
  EXPECT_EQ(completion(R"("repetition_penalty": 101)"), P(400, "repetition_penalty"));
  EXPECT_EQ(completion(R"("min_p": 1.5)"), P(400, "min_p"));
  EXPECT_EQ(completion(R"("min_p": -0.1)"), P(400, "min_p"));
  EXPECT_EQ(completion(R"("min_tokens": -1)"), P(400, "min_tokens"));
  EXPECT_EQ(completion(R"("min_tokens": 5)"), P(400, "min_tokens"));  // over max_tokens = 4
  EXPECT_EQ(completion(R"("min_tokens": 4)"), P(0, "accepted"));
  EXPECT_EQ(completion(R"("logit_bias": [1])"), P(400, "logit_bias"));
  EXPECT_EQ(completion(R"("logit_bias": {"x": 1})"), P(400, "logit_bias"));
  EXPECT_EQ(completion(R"("logit_bias": {"300": 1})"), P(400, "logit_bias"));
  EXPECT_EQ(completion(R"("logit_bias": {"-1": 1})"), P(400, "logit_bias"));
  EXPECT_EQ(completion(R"("logit_bias": {"7": 1, "007": 2})"), P(400, "logit_bias"));
  EXPECT_EQ(completion(R"("logit_bias": {"7": 101})"), P(400, "logit_bias.7"));
  EXPECT_EQ(completion(R"("logit_bias": {"7": "up"})"), P(400, "logit_bias.7"));
  EXPECT_EQ(completion(R"("include_stop_str_in_output": 1)"), P(400, "include_stop_str_in_output"));
  EXPECT_EQ(completion(R"("logprobs": 21)"), P(400, "logprobs"));
  EXPECT_EQ(completion(R"("logprobs": -1)"), P(400, "logprobs"));
  EXPECT_EQ(completion(R"("logprobs": true)"), P(400, "logprobs"));  // chat's form
  EXPECT_EQ(completion(R"("echo": "yes")"), P(400, "echo"));
  const auto chat = [](const std::string& fields) {
    return error_of(
        R"({"messages": [{"role": "user", "content": "q"}], "max_tokens": 2, )" + fields + "}",
        Endpoint::kChat);
  };
  EXPECT_EQ(chat(R"("logprobs": 3)"), P(400, "logprobs"));  // completions' form
  EXPECT_EQ(chat(R"("logprobs": true, "top_logprobs": 21)"), P(400, "top_logprobs"));
  EXPECT_EQ(chat(R"("logprobs": true, "top_logprobs": 1.5)"), P(400, "top_logprobs"));
  EXPECT_EQ(chat(R"("top_logprobs": 2)"), P(400, "top_logprobs"));  // without logprobs
  EXPECT_EQ(chat(R"("logprobs": false, "top_logprobs": 2)"), P(400, "top_logprobs"));
  EXPECT_EQ(chat(R"("echo": true)"), P(400, "echo"));
  EXPECT_EQ(chat(R"("echo": false)"), P(0, "accepted"));
}

// The message an ApiError carries.
std::string message_of(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  try {
    parse(body, e);
  } catch (const ApiError& err) {
    return err.what();
  }
  return "accepted";
}

TEST(OpenAiRequest, MessagesNameTheFieldOnceAndTheValueAsSent) {
  EXPECT_EQ(message_of(R"({"prompt": "a", "temperature": 3.5})"),
            "'temperature' = 3.5 must be a number in [0, 2]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "temperature": "hot"})"),
            "'temperature' = \"hot\" must be a number in [0, 2]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "top_p": 0})"), "'top_p' = 0 must be a number in (0, 1]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "max_tokens": 0})"),
            "'max_tokens' = 0 must be an integer in [1, 2147483647]");
  EXPECT_EQ(message_of(R"({"prompt": [1, 300]})"),
            "'prompt[1]' = 300 must be an integer in [0, 299]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "stream_options": {"include_usage": "yes"}})"),
            "'stream_options.include_usage' = \"yes\" must be a boolean");
  EXPECT_EQ(message_of(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})",
                       Endpoint::kChat),
            "'messages[0].content[0]' must be {\"type\": \"text\", \"text\": STRING}");
  EXPECT_EQ(message_of(R"({"prompt": "a", "presence_penalty": 3})"),
            "'presence_penalty' = 3 must be a number in [-2, 2]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "logit_bias": {"x": 1}})"),
            "'logit_bias' key \"x\" must be a token id in [0, 299]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "logit_bias": {"5": -200}})"),
            "'logit_bias.5' = -200 must be a number in [-100, 100]");
  EXPECT_EQ(message_of(R"({"prompt": "a", "logit_bias": {"5": 1, "05": 1}})"),
            "'logit_bias' gives token 5 more than once");
  EXPECT_EQ(message_of(R"({"prompt": "a", "max_tokens": 3, "min_tokens": 4})"),
            "'min_tokens' = 4 must be an integer in [0, max_tokens = 3]");
  EXPECT_EQ(message_of(R"({"messages": [{"role": "user", "content": "q"}], "top_logprobs": 2})",
                       Endpoint::kChat),
            "'top_logprobs' needs 'logprobs' = true");
  // A long value is cut short: it is the client's.
  EXPECT_EQ(message_of(R"({"prompt": "a", "n": ")" + std::string(100, 'x') + R"("})"),
            "'n' = \"" + std::string(39, 'x') + "... must be an integer in [1, 4]");
}

// A codec whose chat template refuses every conversation with `error`.
class RefusingChatCodec final : public TextCodec {
 public:
  explicit RefusingChatCodec(std::string error) : error_(std::move(error)) {}
  std::vector<std::int32_t> encode(std::string_view text, std::int64_t max_tokens) const override {
    return bytes_->encode(text, max_tokens);
  }
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>&,
                                        std::int64_t) const override {
    throw InvalidArgument(error_);
  }
  std::unique_ptr<TextStream> decoder() const override { return bytes_->decoder(); }
  std::string token_text(std::int32_t id) const override { return bytes_->token_text(id); }
  std::vector<std::int32_t> stop_token_ids() const override { return {}; }

 private:
  std::string error_;
  std::unique_ptr<TextCodec> bytes_ = make_byte_codec(300, 2);
};

std::string chat_message_of(const std::string& codec_error) {
  const RefusingChatCodec codec(codec_error);
  try {
    parse_generation_request(R"({"messages": [{"role": "bot", "content": "x"}]})", Endpoint::kChat,
                             codec, kLimits);
  } catch (const ApiError& err) {
    EXPECT_EQ(err.param(), "messages");
    return err.what();
  }
  return "accepted";
}

TEST(OpenAiRequest, ChatTemplateErrorsNameTheMessagesOnce) {
  // The GGUF codec's text names the messages already.
  EXPECT_EQ(chat_message_of("messages: this model has no chat template"),
            "messages: this model has no chat template");
  // The template's names the message; its internal function name is dropped.
  EXPECT_EQ(chat_message_of("ChatTemplate::render: messages[0].role is \"bot\"; the form renders "
                            "system, user and assistant messages"),
            "messages[0].role is \"bot\"; the form renders system, user and assistant messages");
  // A text that names no messages gets them named.
  EXPECT_EQ(chat_message_of("roles must alternate"), "messages: roles must alternate");
}

TEST(OpenAiRequest, CacheSaltNamesATenant) {
  const std::uint64_t a = parse(R"({"prompt": "x", "cache_salt": "a"})").params.cache_salt;
  EXPECT_NE(a, 0u);  // 0 is the unsalted default
  EXPECT_EQ(parse(R"({"prompt": "x", "cache_salt": "a"})").params.cache_salt, a);
  EXPECT_NE(parse(R"({"prompt": "x", "cache_salt": "b"})").params.cache_salt, a);
  EXPECT_EQ(parse(R"({"prompt": "x"})").params.cache_salt, 0u);
  EXPECT_EQ(error_of(R"({"prompt": "x", "cache_salt": ""})"),
            (std::pair<int, std::string>{400, "cache_salt"}));
  EXPECT_EQ(error_of(R"({"prompt": "x", "cache_salt": 5})"),
            (std::pair<int, std::string>{400, "cache_salt"}));
}

TEST(OpenAiRequest, TooLongIs413) {
  using P = std::pair<int, std::string>;
  const std::string long_prompt(64, 'a');
  EXPECT_EQ(error_of(R"({"prompt": ")" + long_prompt + R"("})"), P(413, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 64})"), P(413, "max_tokens"));
  // Fits the context (64) but not the pool (8 pages of 4 tokens).
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 40})"), P(413, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 12, "n": 4})"), P(413, "max_tokens"));
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 31})"), P(0, "accepted"));
}

// `levels` arrays nested in one another inside {"prompt": "a", "x": ...}.
std::string nested_body(int levels) {
  return R"({"prompt": "a", "x": )" + std::string(std::size_t(levels), '[') +
         std::string(std::size_t(levels), ']') + "}";
}

TEST(OpenAiRequest, NestingDeeperThanTheLimitIs400NamingIt) {
  // The body's object and 63 arrays: 64 levels.
  EXPECT_EQ(error_of(nested_body(63)), (std::pair<int, std::string>{0, "accepted"}));
  EXPECT_EQ(message_of(nested_body(64)), "the request body nests JSON deeper than 64 levels");
  // Refused at the 65th opening, before the rest is read: not a DOM of a
  // million levels, nor "not valid JSON" for the missing closings.
  EXPECT_EQ(message_of(R"({"prompt": "a", "x": )" + std::string(1 << 20, '[')),
            "the request body nests JSON deeper than 64 levels");
}

TEST(OpenAiRequest, APromptTooLongForTheContextIsRefusedByItsLength) {
  using P = std::pair<int, std::string>;
  // The byte codec's tokens are one byte each: a prompt of 63 fits the context
  // of 64 (its request then needs more KV pages than the pool has), one of 64
  // is refused by its length.
  EXPECT_EQ(error_of(R"({"prompt": ")" + std::string(63, 'a') + R"(", "max_tokens": 1})"),
            P(413, "max_tokens"));
  EXPECT_EQ(message_of(R"({"prompt": ")" + std::string(64, 'a') + R"("})"),
            "the prompt's text has 64 bytes; the model's context of 64 tokens holds at most 63 "
            "bytes (1 per token)");
  const std::string long_text(1 << 20, 'a');
  EXPECT_EQ(error_of(R"({"prompt": ")" + long_text + R"("})"), P(413, "prompt"));
  EXPECT_EQ(error_of(R"({"prompt": [")" + long_text + R"("]})"), P(413, "prompt"));
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": ")" + long_text + R"("}]})",
                     Endpoint::kChat),
            P(413, "messages"));
}

TEST(OpenAiRequest, TokenIdPromptsAreCountedBeforeTheyAreRead) {
  // 100 ids of which none is in the vocabulary: too many is the first problem.
  std::string ids = "[299";
  for (int i = 1; i < 100; ++i) ids += ", 300";
  ids += "]";
  EXPECT_EQ(message_of(R"({"prompt": )" + ids + "}"),
            "the prompt has 100 tokens; the model's context is 64");
  EXPECT_EQ(message_of(R"({"prompt": [)" + ids + "]}"),
            "the prompt has 100 tokens; the model's context is 64");
}

}  // namespace
}  // namespace pagedattn::serve
