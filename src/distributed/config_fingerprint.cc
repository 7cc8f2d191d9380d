#include "distributed/config_fingerprint.h"

#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "distributed/disagg_protocol.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

// Named fields, compared one by one so the error says which differ.
using Fields = std::vector<std::pair<std::string, std::string>>;

Fields fingerprint(const EngineConfig& config) {
  const ModelSpec& m = config.model->spec();
  const KVCacheConfig kv = engine_cache_config(config);
  auto s = [](auto v) { return std::to_string(v); };
  return {{"model name", m.name},
          {"num_layers", s(m.num_layers)},
          {"num_qo_heads", s(m.num_qo_heads)},
          {"num_kv_heads", s(m.num_kv_heads)},
          {"head_dim", s(m.head_dim)},
          {"vocab_size", s(m.vocab_size)},
          {"max_position", s(m.max_position)},
          {"eos_token_id", s(m.eos_token_id)},
          {"rope_mode", s(static_cast<int>(m.rope_mode))},
          {"rope theta", s(m.rope.theta)},
          {"page_size", s(kv.page_size)},
          {"kv_dtype", std::string(dtype_name(kv.kv_dtype))},
          {"kv layout", s(static_cast<int>(kv.layout))},
          {"kv attention kind", s(static_cast<int>(kv.attention_kind))},
          {"kv head dims", s(kv.head_dim) + "/" + s(kv.v_head_dim)},
          {"deterministic", s(config.deterministic)},
          {"seed", s(config.seed)}};
}

std::vector<std::byte> encode(const Fields& fields) {
  MessageWriter w;
  w.put(static_cast<std::int32_t>(fields.size()));
  for (const auto& [name, value] : fields) {
    w.put_string(name);
    w.put_string(value);
  }
  return w.take();
}

Fields decode(std::span<const std::byte> bytes) {
  MessageReader r(bytes, "the configuration check between ranks");
  Fields fields(static_cast<std::size_t>(r.get<std::int32_t>()));
  for (auto& [name, value] : fields) {
    name = r.get_string();
    value = r.get_string();
  }
  return fields;
}

}  // namespace

void require_same_config(const MpiComm& comm, int peer, const EngineConfig& config) {
  const Fields mine = fingerprint(config);
  const std::vector<std::byte> sent = encode(mine);
  MpiRequest send = comm.isend(sent, peer, kTagConfig);
  const Fields theirs = decode(comm.recv_any_size(peer, kTagConfig));
  send.wait();
  std::string differences;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::string other = i < theirs.size() ? theirs[i].second : "(missing)";
    if (other == mine[i].second) continue;
    differences +=
        detail::concat(differences.empty() ? "" : "; ", mine[i].first, " is '", mine[i].second,
                       "' on rank ", comm.rank(), " but '", other, "' on rank ", peer);
  }
  require(differences.empty(), "disaggregated prefill/decode: the ranks' configurations differ (",
          differences, "): both must serve the same model with the same KV cache format");
}

}  // namespace pagedattn::dist
