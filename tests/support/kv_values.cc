#include "support/kv_values.h"

#include <sstream>

namespace pagedattn::test {

KVShape KVShape::of(const KVCacheConfig& c) {
  return KVShape{c.num_layers, c.num_kv_heads, c.head_dim,
                 c.v_head_dim == 0 ? c.head_dim : c.v_head_dim,
                 c.attention_kind == AttentionKind::kMLA};
}

std::size_t KVShape::k_floats(std::int64_t tokens) const {
  return static_cast<std::size_t>(std::int64_t{num_layers} * tokens * num_kv_heads * head_dim);
}

std::size_t KVShape::v_floats(std::int64_t tokens) const {
  return static_cast<std::size_t>(std::int64_t{num_layers} * tokens * num_kv_heads * v_head_dim);
}

namespace {

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Index of element `dim` of (layer, token, head) in a debug buffer.
std::size_t buffer_index(const KVShape& s, std::int64_t tokens, std::int32_t layer,
                         std::int64_t token, std::int32_t head, std::int32_t dim,
                         std::int32_t head_dim) {
  return static_cast<std::size_t>(((layer * tokens + token) * s.num_kv_heads + head) * head_dim +
                                  dim);
}

}  // namespace

float token_value(std::uint64_t uid, std::int32_t layer, std::int32_t head, std::int32_t dim,
                  bool is_v) {
  const std::uint64_t key = mix64(uid * 0x9e3779b97f4a7c15ull + 0x1234567ull) ^
                            (std::uint64_t(layer) << 48) ^ (std::uint64_t(head) << 32) ^
                            (std::uint64_t(dim) << 1) ^ (is_v ? 1u : 0u);
  const auto byte = static_cast<std::int32_t>(mix64(key) & 0xffu);
  return static_cast<float>(byte - 128) * 0.5f;
}

float v_value(const KVShape& shape, std::uint64_t uid, std::int32_t layer, std::int32_t head,
              std::int32_t dim) {
  return token_value(uid, layer, head, dim, !shape.v_in_k);
}

KVBuffers make_kv(const KVShape& s, std::span<const std::uint64_t> uids) {
  const auto n = static_cast<std::int64_t>(uids.size());
  KVBuffers b{std::vector<float>(s.k_floats(n)), std::vector<float>(s.v_floats(n))};
  for (std::int32_t l = 0; l < s.num_layers; ++l)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int32_t h = 0; h < s.num_kv_heads; ++h) {
        for (std::int32_t d = 0; d < s.head_dim; ++d)
          b.k[buffer_index(s, n, l, t, h, d, s.head_dim)] = token_value(uids[t], l, h, d, false);
        for (std::int32_t d = 0; d < s.v_head_dim; ++d)
          b.v[buffer_index(s, n, l, t, h, d, s.v_head_dim)] = v_value(s, uids[t], l, h, d);
      }
  return b;
}

KVBuffers read_kv(const PagedKVCache& kv, SeqId id, std::int64_t start, std::int64_t end) {
  const KVShape s = KVShape::of(kv.config());
  KVBuffers b{std::vector<float>(s.k_floats(end - start)),
              std::vector<float>(s.v_floats(end - start))};
  kv.debug_get_kv(id, start, end, b.k, b.v);
  return b;
}

void write_kv(PagedKVCache& kv, SeqId id, std::int64_t start, std::span<const std::uint64_t> uids) {
  const KVShape shape = KVShape::of(kv.config());
  const KVBuffers b = make_kv(shape, uids);
  kv.debug_set_kv(id, start, start + static_cast<std::int64_t>(uids.size()), b.k,
                  shape.v_in_k ? std::span<const float>() : std::span<const float>(b.v));
}

void end_metadata_step(PagedKVCache& kv) {
  for (std::int32_t l = 0; l < kv.config().num_layers; ++l) kv.mark_layer_appended(l);
  kv.end_forward();
}

void write_kv_through_slots(const PagedKVCache& kv, const BatchPlan& plan, std::int32_t b,
                            std::span<const std::uint64_t> uids) {
  const KVCacheConfig& c = kv.config();
  const std::int32_t first = plan.qo_indptr[b];
  for (std::int32_t l = 0; l < c.num_layers; ++l) {
    const PagedKVStorage st = kv.layer_storage(l);
    for (std::size_t i = 0; i < uids.size(); ++i) {
      const std::int64_t slot = plan.slot_mapping[first + i];
      const std::int64_t page = slot / plan.page_size, offset = slot % plan.page_size;
      for (std::int32_t h = 0; h < c.num_kv_heads; ++h) {
        const std::int64_t k0 = st.k_offset(page, h, offset), v0 = st.v_offset(page, h, offset);
        for (std::int32_t d = 0; d < c.head_dim; ++d)
          store_from_float(st.k_data, st.dtype, static_cast<std::size_t>(k0 + d),
                           token_value(uids[i], l, h, d, false));
        for (std::int32_t d = 0; d < c.v_head_dim && !st.v_in_k; ++d)
          store_from_float(st.v_data, st.dtype, static_cast<std::size_t>(v0 + d),
                           token_value(uids[i], l, h, d, true));
      }
    }
  }
}

namespace {

// "" or the first differing element of one of the two arrays.
std::string first_difference_in(const KVShape& s, const std::vector<float>& expected,
                                const std::vector<float>& actual, std::int32_t head_dim,
                                const char* which) {
  if (expected.size() != actual.size()) return std::string(which) + " sizes differ";
  const std::size_t per_layer = expected.size() / static_cast<std::size_t>(s.num_layers);
  const std::size_t per_token = static_cast<std::size_t>(s.num_kv_heads * head_dim);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == actual[i]) continue;
    std::ostringstream os;
    os << which << " differs at layer " << i / per_layer << " token " << (i % per_layer) / per_token
       << " head " << (i % per_token) / head_dim << " dim " << i % head_dim << ": expected "
       << expected[i] << ", got " << actual[i];
    return os.str();
  }
  return {};
}

}  // namespace

std::string first_difference(const KVShape& s, const KVBuffers& expected, const KVBuffers& actual) {
  std::string d = first_difference_in(s, expected.k, actual.k, s.head_dim, "K");
  if (d.empty()) d = first_difference_in(s, expected.v, actual.v, s.v_head_dim, "V");
  return d;
}

std::string check_tokens(const PagedKVCache& kv, SeqId id, std::int64_t start,
                         std::span<const std::uint64_t> uids) {
  const KVShape s = KVShape::of(kv.config());
  const KVBuffers actual = read_kv(kv, id, start, start + static_cast<std::int64_t>(uids.size()));
  const std::string d = first_difference(s, make_kv(s, uids), actual);
  if (d.empty()) return d;
  std::ostringstream os;
  os << "seq " << id << " tokens from " << start << ": " << d;
  return os.str();
}

std::vector<std::uint64_t> uid_range(std::uint64_t first, std::int64_t n) {
  std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = first + static_cast<std::uint64_t>(i);
  return v;
}

}  // namespace pagedattn::test
