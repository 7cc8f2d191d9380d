#include "distributed/disagg_protocol.h"

namespace pagedattn::dist {

std::vector<std::byte> RequestMessage::encode() const {
  MessageWriter w;
  w.put(index);
  w.put(first_token);
  w.put_vector(std::span<const std::int32_t>(prompt));
  w.put(params.max_tokens);
  w.put(params.temperature);
  w.put(params.top_k);
  w.put(params.top_p);
  w.put(params.n);
  w.put(params.seed.value_or(0));
  w.put_vector(std::span<const std::int32_t>(params.stop_token_ids));
  w.put(static_cast<std::int8_t>(params.ignore_eos));
  w.put_string(error);
  return w.take();
}

RequestMessage RequestMessage::decode(std::span<const std::byte> bytes) {
  MessageReader r(bytes, "disaggregated prefill/decode");
  RequestMessage m;
  m.index = r.get<std::int64_t>();
  m.first_token = r.get<std::int32_t>();
  m.prompt = r.get_vector<std::int32_t>();
  m.params.max_tokens = r.get<std::int32_t>();
  m.params.temperature = r.get<float>();
  m.params.top_k = r.get<std::int32_t>();
  m.params.top_p = r.get<float>();
  m.params.n = r.get<std::int32_t>();
  m.params.seed = r.get<std::uint64_t>();
  m.params.stop_token_ids = r.get_vector<std::int32_t>();
  m.params.ignore_eos = r.get<std::int8_t>() != 0;
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

}  // namespace pagedattn::dist
