#include "distributed/disagg_protocol.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace pagedattn::dist {
namespace {

constexpr std::int32_t kUnset = -1;  // an optional count that is not set

void put_logit_bias(MessageWriter& w, const std::vector<std::pair<std::int32_t, float>>& bias) {
  std::vector<std::int32_t> tokens;
  std::vector<float> values;
  for (const auto& [token, value] : bias) {
    tokens.push_back(token);
    values.push_back(value);
  }
  w.put_vector(std::span<const std::int32_t>(tokens));
  w.put_vector(std::span<const float>(values));
}

std::vector<std::pair<std::int32_t, float>> get_logit_bias(MessageReader& r) {
  const std::vector<std::int32_t> tokens = r.get_vector<std::int32_t>();
  const std::vector<float> values = r.get_vector<float>();
  require<InternalError>(tokens.size() == values.size(),
                         "disaggregated prefill/decode: logit_bias has ", tokens.size(),
                         " tokens and ", values.size(), " values");
  std::vector<std::pair<std::int32_t, float>> bias;
  for (std::size_t i = 0; i < tokens.size(); ++i) bias.emplace_back(tokens[i], values[i]);
  return bias;
}

std::optional<std::int32_t> get_optional_count(MessageReader& r) {
  const auto count = r.get<std::int32_t>();
  return count == kUnset ? std::nullopt : std::optional<std::int32_t>(count);
}

}  // namespace

std::vector<std::byte> RequestMessage::encode() const {
  MessageWriter w;
  w.put(index);
  w.put_vector(std::span<const std::int32_t>(first_tokens));
  w.put_vector(std::span<const std::int32_t>(prompt));
  w.put(params.max_tokens);
  w.put(params.temperature);
  w.put(params.top_k);
  w.put(params.top_p);
  w.put(params.n);
  w.put(params.seed.value_or(0));
  w.put_vector(std::span<const std::int32_t>(params.stop_token_ids));
  w.put(static_cast<std::int8_t>(params.ignore_eos));
  // Every field the engine reads (stop strings are applied to text elsewhere).
  w.put(params.cache_salt);
  w.put(params.repetition_penalty);
  w.put(params.presence_penalty);
  w.put(params.frequency_penalty);
  w.put(params.min_p);
  w.put(params.min_tokens);
  put_logit_bias(w, params.logit_bias);
  w.put(params.logprobs.value_or(kUnset));
  w.put(params.prompt_logprobs.value_or(kUnset));
  w.put_string(error);
  return w.take();
}

RequestMessage RequestMessage::decode(std::span<const std::byte> bytes) {
  MessageReader r(bytes, "disaggregated prefill/decode");
  RequestMessage m;
  m.index = r.get<std::int64_t>();
  m.first_tokens = r.get_vector<std::int32_t>();
  m.prompt = r.get_vector<std::int32_t>();
  m.params.max_tokens = r.get<std::int32_t>();
  m.params.temperature = r.get<float>();
  m.params.top_k = r.get<std::int32_t>();
  m.params.top_p = r.get<float>();
  m.params.n = r.get<std::int32_t>();
  m.params.seed = r.get<std::uint64_t>();
  m.params.stop_token_ids = r.get_vector<std::int32_t>();
  m.params.ignore_eos = r.get<std::int8_t>() != 0;
  m.params.cache_salt = r.get<std::uint64_t>();
  m.params.repetition_penalty = r.get<float>();
  m.params.presence_penalty = r.get<float>();
  m.params.frequency_penalty = r.get<float>();
  m.params.min_p = r.get<float>();
  m.params.min_tokens = r.get<std::int32_t>();
  m.params.logit_bias = get_logit_bias(r);
  m.params.logprobs = get_optional_count(r);
  m.params.prompt_logprobs = get_optional_count(r);
  m.error = r.get_string();
  return m;
}

std::vector<std::byte> AckMessage::encode() const {
  MessageWriter w;
  w.put(ack);
  w.put_string(error);
  return w.take();
}

AckMessage AckMessage::decode(std::span<const std::byte> bytes) {
  MessageReader r(bytes, "disaggregated prefill/decode");
  AckMessage m;
  m.ack = r.get<Ack>();
  m.error = r.get_string();
  return m;
}

void wait_for_message(const MpiComm& comm, int source, int tag) {
  constexpr int kBusyPolls = 200;
  constexpr auto kLongestSleep = std::chrono::microseconds(1000);
  auto sleep = std::chrono::microseconds(20);
  for (int polls = 0; !comm.has_message(source, tag); ++polls) {
    if (polls < kBusyPolls) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
}

}  // namespace pagedattn::dist
