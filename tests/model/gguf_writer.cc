#include "model/gguf_writer.h"

#include "pagedattn/dtype.h"
#include "support/random_floats.h"

#include <random>

namespace pagedattn::test {
namespace {

template <typename T>
std::vector<std::byte> encode(T value) {
  ByteSink sink;
  sink.put(value);
  return sink.bytes();
}

// Byte offsets of the f16 scales inside one block of `type`.
std::vector<int> scale_offsets(GgufType type) {
  switch (type) {
    case GgufType::kQ4_0:
    case GgufType::kQ5_0:
    case GgufType::kQ8_0:
      return {0};
    case GgufType::kQ4_1:
    case GgufType::kQ5_1:
    case GgufType::kQ4_K:
    case GgufType::kQ5_K:
      return {0, 2};
    case GgufType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

}  // namespace

std::vector<std::byte> encode_array(GgufValueType element_type, std::uint64_t count,
                                    const std::vector<std::byte>& elements) {
  ByteSink sink;
  sink.put(static_cast<std::uint32_t>(element_type)).put(count).put_bytes(elements);
  return sink.bytes();
}

GgufWriter& GgufWriter::kv_raw(std::string_view key, GgufValueType type,
                               std::vector<std::byte> value) {
  entries_.push_back({std::string(key), type, std::move(value)});
  return *this;
}

GgufWriter& GgufWriter::kv_u8(std::string_view k, std::uint8_t v) {
  return kv_raw(k, GgufValueType::kUint8, encode(v));
}
GgufWriter& GgufWriter::kv_i8(std::string_view k, std::int8_t v) {
  return kv_raw(k, GgufValueType::kInt8, encode(v));
}
GgufWriter& GgufWriter::kv_u16(std::string_view k, std::uint16_t v) {
  return kv_raw(k, GgufValueType::kUint16, encode(v));
}
GgufWriter& GgufWriter::kv_i16(std::string_view k, std::int16_t v) {
  return kv_raw(k, GgufValueType::kInt16, encode(v));
}
GgufWriter& GgufWriter::kv_u32(std::string_view k, std::uint32_t v) {
  return kv_raw(k, GgufValueType::kUint32, encode(v));
}
GgufWriter& GgufWriter::kv_i32(std::string_view k, std::int32_t v) {
  return kv_raw(k, GgufValueType::kInt32, encode(v));
}
GgufWriter& GgufWriter::kv_u64(std::string_view k, std::uint64_t v) {
  return kv_raw(k, GgufValueType::kUint64, encode(v));
}
GgufWriter& GgufWriter::kv_i64(std::string_view k, std::int64_t v) {
  return kv_raw(k, GgufValueType::kInt64, encode(v));
}
GgufWriter& GgufWriter::kv_f32(std::string_view k, float v) {
  return kv_raw(k, GgufValueType::kFloat32, encode(v));
}
GgufWriter& GgufWriter::kv_f64(std::string_view k, double v) {
  return kv_raw(k, GgufValueType::kFloat64, encode(v));
}
GgufWriter& GgufWriter::kv_bool(std::string_view k, bool v) {
  return kv_raw(k, GgufValueType::kBool, encode(static_cast<std::uint8_t>(v)));
}

GgufWriter& GgufWriter::kv_string(std::string_view key, std::string_view v) {
  ByteSink sink;
  sink.put_string(v);
  return kv_raw(key, GgufValueType::kString, sink.bytes());
}

GgufWriter& GgufWriter::kv_string_array(std::string_view key, const std::vector<std::string>& v) {
  ByteSink elements;
  for (const std::string& s : v) elements.put_string(s);
  return kv_raw(key, GgufValueType::kArray,
                encode_array(GgufValueType::kString, v.size(), elements.bytes()));
}

GgufWriter& GgufWriter::kv_i32_array(std::string_view key, const std::vector<std::int32_t>& v) {
  ByteSink elements;
  for (std::int32_t x : v) elements.put(x);
  return kv_raw(key, GgufValueType::kArray,
                encode_array(GgufValueType::kInt32, v.size(), elements.bytes()));
}

GgufWriter& GgufWriter::kv_f32_array(std::string_view key, const std::vector<float>& v) {
  ByteSink elements;
  for (float x : v) elements.put(x);
  return kv_raw(key, GgufValueType::kArray,
                encode_array(GgufValueType::kFloat32, v.size(), elements.bytes()));
}

GgufWriter& GgufWriter::tensor(GgufTestTensor t) {
  tensors_.push_back(std::move(t));
  return *this;
}

GgufWriter& GgufWriter::tensor(std::string name, GgufType type, std::vector<std::uint64_t> dims,
                               std::uint64_t seed) {
  const GgufTypeInfo& info = gguf_type_info(type);
  std::uint64_t elements = 1;
  for (std::uint64_t d : dims) elements *= d;
  const auto blocks =
      static_cast<std::int64_t>(elements / static_cast<std::uint64_t>(info.block_size));
  std::vector<std::byte> data = random_blocks(type, blocks, seed);
  if (type == GgufType::kF32 || type == GgufType::kF16 || type == GgufType::kBF16) {
    // Finite values in [-1, 1] (random bits would hold NaNs and infinities).
    std::mt19937_64 rng(seed);
    pagedattn::test::UniformFloats value(-1.0f, 1.0f);
    for (std::uint64_t i = 0; i < elements; ++i) {
      const float v = value(rng);
      if (type == GgufType::kF32) {
        std::memcpy(data.data() + i * 4, &v, 4);
      } else {
        const std::uint16_t bits =
            type == GgufType::kF16 ? float_to_f16_bits(v) : float_to_bf16_bits(v);
        std::memcpy(data.data() + i * 2, &bits, 2);
      }
    }
  }
  return tensor({std::move(name), static_cast<std::uint32_t>(type), std::move(dims),
                 std::move(data), std::nullopt});
}

std::vector<std::byte> GgufWriter::build() const {
  ByteSink sink;
  sink.put<std::uint32_t>(0x46554747).put(version);
  sink.put<std::uint64_t>(tensors_.size()).put<std::uint64_t>(entries_.size());
  for (const Entry& e : entries_) {
    sink.put_string(e.key).put(static_cast<std::uint32_t>(e.type)).put_bytes(e.value);
  }
  std::vector<std::uint64_t> offsets;
  std::uint64_t next = 0;
  for (const GgufTestTensor& t : tensors_) {
    offsets.push_back(t.offset.value_or(next));
    next = (offsets.back() + t.data.size() + alignment - 1) / alignment * alignment;
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTestTensor& t = tensors_[i];
    sink.put_string(t.name).put(static_cast<std::uint32_t>(t.dims.size()));
    for (std::uint64_t d : t.dims) sink.put(d);
    sink.put(t.type_id).put(offsets[i]);
  }
  if (tensors_.empty()) return sink.bytes();
  sink.pad_to(alignment);
  const std::size_t data_start = sink.bytes().size();
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (offsets[i] > (1u << 24)) continue;  // a deliberately bad offset: no data written
    std::vector<std::byte>& out = sink.bytes();
    const std::size_t end = data_start + offsets[i] + tensors_[i].data.size();
    if (out.size() < end) out.resize(end);
    std::memcpy(out.data() + data_start + offsets[i], tensors_[i].data.data(),
                tensors_[i].data.size());
  }
  return sink.bytes();
}

std::vector<std::byte> random_blocks(GgufType type, std::int64_t blocks, std::uint64_t seed) {
  const GgufTypeInfo& info = gguf_type_info(type);
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(static_cast<std::size_t>(blocks * info.block_bytes));
  for (std::byte& b : out) b = static_cast<std::byte>(rng() & 0xff);
  for (std::int64_t b = 0; b < blocks; ++b) {
    for (int offset : scale_offsets(type)) {
      // A finite f16 with a moderate exponent: sign | exponent in [5, 20] | mantissa.
      const auto mantissa = static_cast<std::uint16_t>(rng() & 0x3ff);
      const auto exponent = static_cast<std::uint16_t>(5 + rng() % 16);
      const auto sign = static_cast<std::uint16_t>((rng() & 1) << 15);
      const auto half = static_cast<std::uint16_t>(sign | (exponent << 10) | mantissa);
      std::memcpy(out.data() + b * info.block_bytes + offset, &half, 2);
    }
  }
  return out;
}

GgufWriter tiny_model(const std::string& arch, bool tied, bool biases, TinyShape s,
                      TinyTypes types) {
  GgufWriter w;
  w.kv_string("general.architecture", arch).kv_string("general.name", "tiny");
  w.kv_u32(arch + ".block_count", s.layers).kv_u32(arch + ".context_length", 2048);
  w.kv_u32(arch + ".embedding_length", s.hidden).kv_u32(arch + ".feed_forward_length", s.ff);
  w.kv_u32(arch + ".attention.head_count", s.heads)
      .kv_u32(arch + ".attention.head_count_kv", s.kv_heads);
  w.kv_f32(arch + ".rope.freq_base", 500000.0f)
      .kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1).kv_u32("tokenizer.ggml.eos_token_id", 2);
  const std::uint64_t h = s.hidden, hd = s.hidden / s.heads, q = s.heads * hd, kv = s.kv_heads * hd;
  std::uint64_t seed = 1;
  w.tensor("token_embd.weight", types.embedding, {h, s.vocab}, seed++);
  w.tensor("output_norm.weight", GgufType::kF32, {h}, seed++);
  if (!tied) w.tensor("output.weight", types.output, {h, s.vocab}, seed++);
  // The tensors each architecture adds or fuses (gguf_model.h).
  const bool fused = arch == "phi3", qk_norm = arch == "qwen3" || arch == "gemma3",
             sandwich = arch == "gemma2" || arch == "gemma3";
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w.tensor(p + "attn_norm.weight", GgufType::kF32, {h}, seed++);
    if (fused) {
      w.tensor(p + "attn_qkv.weight", types.q, {h, q + 2 * kv}, seed++);
    } else {
      w.tensor(p + "attn_q.weight", types.q, {h, q}, seed++);
      w.tensor(p + "attn_k.weight", types.k, {h, kv}, seed++);
      w.tensor(p + "attn_v.weight", types.v, {h, kv}, seed++);
    }
    if (biases) {
      w.tensor(p + "attn_q.bias", GgufType::kF32, {q}, seed++);
      w.tensor(p + "attn_k.bias", GgufType::kF32, {kv}, seed++);
      w.tensor(p + "attn_v.bias", GgufType::kF32, {kv}, seed++);
    }
    if (qk_norm) {
      w.tensor(p + "attn_q_norm.weight", GgufType::kF32, {hd}, seed++);
      w.tensor(p + "attn_k_norm.weight", GgufType::kF32, {hd}, seed++);
    }
    w.tensor(p + "attn_output.weight", types.o, {q, h}, seed++);
    if (sandwich) w.tensor(p + "post_attention_norm.weight", GgufType::kF32, {h}, seed++);
    w.tensor(p + "ffn_norm.weight", GgufType::kF32, {h}, seed++);
    if (fused) {
      w.tensor(p + "ffn_up.weight", types.up, {h, 2 * std::uint64_t{s.ff}}, seed++);
    } else {
      w.tensor(p + "ffn_gate.weight", types.gate, {h, s.ff}, seed++);
      w.tensor(p + "ffn_up.weight", types.up, {h, s.ff}, seed++);
    }
    w.tensor(p + "ffn_down.weight", types.down, {s.ff, h}, seed++);
    if (sandwich) w.tensor(p + "post_ffw_norm.weight", GgufType::kF32, {h}, seed++);
  }
  return w;
}

}  // namespace pagedattn::test
