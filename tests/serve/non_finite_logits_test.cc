// Non-finite logits over HTTP: the tiny model behind a wrapper that turns a
// logits row into NaN wherever the row's token is '#' (a stand-in for broken
// weights). A whole response is OpenAI's 500 error naming the request; a
// stream ends the choice with finish_reason "error", then an error event and
// [DONE]; a request batched alongside is unaffected and no page is left.
#include <httplib.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include <nlohmann/json.hpp>

#include "http_server.h"
#include "pagedattn/llama.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::int32_t kPoisonToken = '#';  // the byte codec: token id = byte value

class PoisonedModel : public Model {
 public:
  explicit PoisonedModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    inner_->forward(batch, cache, logits);
    const std::size_t vocab = std::size_t(spec().vocab_size);
    for (std::size_t r = 0; r < batch.logit_rows.size(); ++r)
      if (batch.token_ids[std::size_t(batch.logit_rows[r])] == kPoisonToken)
        std::fill_n(logits.begin() + std::ptrdiff_t(r * vocab), vocab,
                    std::numeric_limits<float>::quiet_NaN());
  }

 private:
  std::unique_ptr<Model> inner_;
};

class PoisonedServer {
 public:
  PoisonedServer() {
    signal(SIGPIPE, SIG_IGN);
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    const LlamaConfig c = llama_preset("tiny");
    EngineConfig ec;
    ec.model = std::make_shared<PoisonedModel>(make_llama_model(c));
    ec.kv_memory_bytes = 4 << 20;
    server_ = std::make_unique<HttpServer>(ec, make_byte_codec(c.vocab_size, c.eos_token_id), o);
    server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
  }
  ~PoisonedServer() {
    server_->shutdown();
    thread_.join();
  }
  httplib::Result post(json body) {
    httplib::Client client("127.0.0.1", server_->bound_port());
    client.set_read_timeout(60, 0);
    body["model"] = "tiny";
    return client.Post("/v1/completions", body.dump(), "application/json");
  }
  bool idle_and_empty() {
    for (int i = 0; i < 1000; ++i) {
      if (server_->worker().in_flight() == 0 && server_->worker().stats().pages_in_use == 0)
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST(NonFiniteLogits, WholeResponseIsA500NamingTheRequest) {
  PoisonedServer server;
  auto bad = server.post({{"prompt", "broken #"}, {"max_tokens", 4}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 500) << bad->body;
  const json error = json::parse(bad->body)["error"];
  EXPECT_EQ(error["type"], "server_error");
  EXPECT_NE(error["message"].get<std::string>().find("logits are not finite"), std::string::npos)
      << error;
  // One token only: its row is the prompt's last token, never '#'.
  auto good = server.post({{"prompt", "fine"}, {"max_tokens", 1}});
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  EXPECT_EQ(json::parse(good->body)["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(server.idle_and_empty());
}

TEST(NonFiniteLogits, StreamEndsWithFinishReasonErrorThenAnErrorEvent) {
  PoisonedServer server;
  auto res = server.post({{"prompt", "broken #"}, {"max_tokens", 4}, {"stream", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  std::vector<json> events;
  std::size_t at = 0;
  bool done = false;
  while ((at = res->body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = res->body.find("\n\n", at);
    const std::string data = res->body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]")
      done = true;
    else
      events.push_back(json::parse(data));
  }
  EXPECT_TRUE(done) << res->body;
  ASSERT_GE(events.size(), 2u) << res->body;
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "error") << res->body;
  EXPECT_NE(events.back()["error"]["message"].get<std::string>().find("NaN"), std::string::npos)
      << res->body;
  EXPECT_TRUE(server.idle_and_empty());
}

}  // namespace
}  // namespace pagedattn::serve
