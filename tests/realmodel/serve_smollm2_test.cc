// `pagedattn serve` over the real test model: the file's chat template and
// tokenizer, a stop at end-of-turn, and streamed chunks that are whole UTF-8
// characters. Skipped unless PAGEDATTN_TEST_MODEL names the GGUF file.
#include <httplib.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "http_server.h"
#include "pagedattn/gguf.h"
#include "pagedattn/llama.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;

TEST(ServeSmolLM2, ChatStopsAtEndOfTurnAndStreamsWholeCharacters) {
  const char* path = std::getenv("PAGEDATTN_TEST_MODEL");
  if (path == nullptr)
    GTEST_SKIP() << "PAGEDATTN_TEST_MODEL is not set (scripts/get_test_model.sh prints the path)";
  signal(SIGPIPE, SIG_IGN);
  const GgufFile file = GgufFile::open(path);
  EngineConfig ec;
  ec.model = make_gguf_model(file, {.max_position = 1024});
  ec.kv_memory_bytes = 32 << 20;
  ServerOptions options;
  options.port = 0;
  options.model_name = "smollm2";
  HttpServer server(ec, make_gguf_codec(file), options);
  server.bind();
  std::thread listener([&] { server.listen(); });
  httplib::Client client("127.0.0.1", server.bound_port());
  client.set_read_timeout(120, 0);

  const json ask = {
      {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
      {"max_tokens", 40}};
  auto whole = client.Post("/v1/chat/completions", ask.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json r = json::parse(whole->body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");  // <|im_end|>, not max_tokens
  EXPECT_NE(r["choices"][0]["message"]["content"].get<std::string>().find("Paris"),
            std::string::npos);

  json japanese = {{"messages", {{{"role", "user"}, {"content", "Say hello in Japanese."}}}},
                   {"max_tokens", 24},
                   {"stream", true}};
  auto streamed = client.Post("/v1/chat/completions", japanese.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string text;
  std::size_t at = 0;
  while ((at = streamed->body.find("data: {", at)) != std::string::npos) {
    const std::size_t end = streamed->body.find("\n\n", at);
    const json chunk =
        json::parse(streamed->body.substr(at + 6, end - at - 6));  // throws on bad UTF-8
    text += chunk["choices"][0]["delta"].value("content", "");
    at = end;
  }
  EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos)
      << "a character was split across chunks: " << text;
  EXPECT_FALSE(text.empty());
  server.shutdown();
  listener.join();
}

}  // namespace
}  // namespace pagedattn::serve
