#include "ort_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pagedattn::ops::test {
namespace {

std::vector<unsigned char> encode(const std::vector<float>& values, DType dtype) {
  std::vector<unsigned char> raw(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) store_from_float(raw.data(), dtype, i, values[i]);
  return raw;
}

std::vector<float> round_to(std::vector<float> values, DType dtype) {
  return decode(encode(values, dtype).data(), dtype, values.size());
}

}  // namespace

OrtCase::OrtCase(const OrtSpec& spec) : spec_(spec) {
  std::mt19937 rng(spec.seed);
  const std::int32_t hq = spec.num_heads, hkv = spec.kv_num_heads, d = spec.head_size;
  const std::int32_t bs = spec.block_size;
  const auto batch = static_cast<std::int32_t>(spec.seqs.size());
  // Block table: shuffled ids, one spare column whose entries are out of range.
  std::int32_t used_blocks = 0;
  for (const auto& [n, total] : spec.seqs) {
    max_blocks = std::max(max_blocks, (total + bs - 1) / bs + 1);
    used_blocks += (total + bs - 1) / bs;
  }
  num_blocks = used_blocks + 2;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  block_table.assign(std::size_t(batch) * max_blocks, 1 << 30);
  std::size_t next = 0;
  cu = {0};
  for (std::int32_t b = 0; b < batch; ++b) {
    const auto [n, total] = spec.seqs[std::size_t(b)];
    for (std::int32_t i = 0; i < (total + bs - 1) / bs; ++i)
      block_table[std::size_t(b) * max_blocks + i] = ids[next++];
    cu.push_back(cu.back() + n);
    past.push_back(total - n);
  }
  tokens_ = cu.back();
  const std::size_t cache_elems = std::size_t(num_blocks) * bs * hkv * d;
  key_cache = poisoned_buffer(cache_elems, spec.dtype);
  value_cache = poisoned_buffer(cache_elems, spec.dtype);

  // Rotary tables [rows][R/2], rounded to the query dtype as a model would pass them.
  const std::int32_t rotary_dim = spec.half_rotary ? d / 2 : d;
  std::int32_t rows = 1;
  for (const auto& [n, total] : spec.seqs) rows = std::max(rows, total + 3);
  std::vector<float> cos_f, sin_f;
  for (std::int32_t pos = 0; pos < rows; ++pos)
    for (std::int32_t i = 0; i < rotary_dim / 2; ++i) {
      const double angle = pos / std::pow(10000.0, 2.0 * i / rotary_dim);
      cos_f.push_back(float(std::cos(angle)));
      sin_f.push_back(float(std::sin(angle)));
    }
  cos_f = round_to(cos_f, spec.dtype);
  sin_f = round_to(sin_f, spec.dtype);
  cos = encode(cos_f, spec.dtype);
  sin = encode(sin_f, spec.dtype);

  // New tokens.
  const std::size_t q_row = std::size_t(hq) * d, kv_row = std::size_t(hkv) * d;
  std::vector<float> q = randn(rng, tokens_ * q_row, spec.dtype);
  std::vector<float> k = randn(rng, tokens_ * kv_row, spec.dtype);
  std::vector<float> v = randn(rng, tokens_ * kv_row, spec.dtype);
  if (spec.packed) {
    std::vector<float> qkv;
    for (std::int32_t t = 0; t < tokens_; ++t) {
      qkv.insert(qkv.end(), q.begin() + t * q_row, q.begin() + (t + 1) * q_row);
      qkv.insert(qkv.end(), k.begin() + t * kv_row, k.begin() + (t + 1) * kv_row);
      qkv.insert(qkv.end(), v.begin() + t * kv_row, v.begin() + (t + 1) * kv_row);
    }
    query = encode(qkv, spec.dtype);
  } else {
    query = encode(q, spec.dtype);
    key = encode(k, spec.dtype);
    value = encode(v, spec.dtype);
  }
  out.assign(tokens_ * q_row * dtype_size(spec.dtype), 0xcd);
  std::vector<std::int32_t> positions;
  for (std::int32_t b = 0; b < batch; ++b)
    for (std::int32_t j = 0; j < spec.seqs[std::size_t(b)].first; ++j)
      positions.push_back(past[b] + j);
  if (spec.rotary) {
    rotate(q, hq, d, positions, cos_f, sin_f, rotary_dim, spec.interleaved);
    rotate(k, hkv, d, positions, cos_f, sin_f, rotary_dim, spec.interleaved);
  }
  new_k_ = round_to(k, spec.dtype);
  new_v_ = v;
  if (spec.slot_mapping)
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t j = 0; j < spec.seqs[std::size_t(b)].first; ++j)
        slots.push_back(slot_of(b, past[b] + j));

  // The logical batch: past K/V written into the cache now, then the new rows.
  logical_.num_qo_heads = hq;
  logical_.num_kv_heads = hkv;
  logical_.head_dim = d;
  logical_.q = q;
  for (std::int32_t b = 0; b < batch; ++b) {
    const auto [n, total] = spec.seqs[std::size_t(b)];
    logical_.q_lens.push_back(n);
    std::vector<float> pk = randn(rng, std::size_t(past[b]) * kv_row, spec.dtype);
    std::vector<float> pv = randn(rng, std::size_t(past[b]) * kv_row, spec.dtype);
    for (std::int32_t pos = 0; pos < past[b]; ++pos)
      write_cache(slot_of(b, pos), pk.data() + pos * kv_row, pv.data() + pos * kv_row);
    for (std::int32_t t = cu[b]; t < cu[b + 1]; ++t) {
      if (t == spec.skip_token) {  // not written: the cache keeps what it held
        std::vector<float> held_k = randn(rng, kv_row, spec.dtype),
                           held_v = randn(rng, kv_row, spec.dtype);
        write_cache(slots[std::size_t(t)], held_k.data(), held_v.data());
        pk.insert(pk.end(), held_k.begin(), held_k.end());
        pv.insert(pv.end(), held_v.begin(), held_v.end());
        continue;
      }
      pk.insert(pk.end(), new_k_.begin() + t * kv_row, new_k_.begin() + (t + 1) * kv_row);
      pv.insert(pv.end(), v.begin() + t * kv_row, v.begin() + (t + 1) * kv_row);
    }
    logical_.k.push_back(std::move(pk));
    logical_.v.push_back(std::move(pv));
  }
  if (spec.skip_token >= 0) slots[std::size_t(spec.skip_token)] = -1;
  if (spec.head_sink) {
    sink_values_ = randn(rng, std::size_t(hq), spec.dtype);
    sink = encode(sink_values_, spec.dtype);
  }
}

std::int64_t OrtCase::slot_of(std::int32_t b, std::int32_t pos) const {
  const std::int32_t bs = spec_.block_size;
  return std::int64_t{block_table[std::size_t(b) * max_blocks + pos / bs]} * bs + pos % bs;
}

void OrtCase::write_cache(std::int64_t slot, const float* k_row, const float* v_row) {
  const std::size_t row = std::size_t(spec_.kv_num_heads) * spec_.head_size;
  for (std::size_t i = 0; i < row; ++i) {
    store_from_float(key_cache.data(), spec_.dtype, std::size_t(slot) * row + i, k_row[i]);
    store_from_float(value_cache.data(), spec_.dtype, std::size_t(slot) * row + i, v_row[i]);
  }
}

ort::PagedAttentionParams OrtCase::params() {
  const std::int32_t hq = spec_.num_heads, hkv = spec_.kv_num_heads, d = spec_.head_size;
  const DType dt = spec_.dtype;
  const auto batch = static_cast<std::int64_t>(spec_.seqs.size());
  ort::PagedAttentionParams p;
  if (spec_.packed) {
    p.query = TensorView::dense(query.data(), dt, {tokens_, std::int64_t{hq + 2 * hkv} * d});
  } else {
    p.query = TensorView::dense(query.data(), dt, {tokens_, std::int64_t{hq} * d});
    p.key = TensorView::dense(key.data(), dt, {tokens_, std::int64_t{hkv} * d});
    p.value = TensorView::dense(value.data(), dt, {tokens_, std::int64_t{hkv} * d});
  }
  if (spec_.four_d_cache) {
    p.key_cache = TensorView::dense(key_cache.data(), dt, {num_blocks, spec_.block_size, hkv, d});
    p.value_cache =
        TensorView::dense(value_cache.data(), dt, {num_blocks, spec_.block_size, hkv, d});
  } else {
    p.key_cache = TensorView::dense(key_cache.data(), dt,
                                    {num_blocks, spec_.block_size, std::int64_t{hkv} * d});
    p.value_cache = TensorView::dense(value_cache.data(), dt,
                                      {num_blocks, spec_.block_size, std::int64_t{hkv} * d});
  }
  p.cumulative_sequence_length = IndexView::dense(cu.data(), {batch + 1});
  p.past_seqlens = IndexView::dense(past.data(), {batch});
  p.block_table = IndexView::dense(block_table.data(), {batch, max_blocks});
  if (spec_.rotary) {
    const std::int64_t half = (spec_.half_rotary ? d / 2 : d) / 2;
    const std::int64_t rows = std::int64_t(cos.size() / dtype_size(dt)) / half;
    p.cos_cache = TensorView::dense(cos.data(), dt, {rows, half});
    p.sin_cache = TensorView::dense(sin.data(), dt, {rows, half});
  }
  if (spec_.slot_mapping) p.slot_mapping = IndexView::dense(slots.data(), {tokens_});
  if (spec_.head_sink) p.head_sink = TensorView::dense(sink.data(), dt, {hq});
  p.output = TensorView::dense(out.data(), dt, {tokens_, std::int64_t{hq} * d});
  p.num_heads = hq;
  p.kv_num_heads = hkv;
  p.scale = spec_.scale;
  p.softcap = spec_.softcap;
  p.local_window_size = spec_.local_window_size;
  p.do_rotary = spec_.rotary;
  p.rotary_interleaved = spec_.interleaved;
  return p;
}

AttentionOptions OrtCase::options() const {
  AttentionOptions o;
  if (spec_.scale != 0.0f) o.scale = spec_.scale;
  o.softcap = spec_.softcap;
  // ORT: L shows the last L keys, the query's own included.
  if (spec_.local_window_size >= 1) o.window_left = spec_.local_window_size - 1;
  if (spec_.head_sink) o.sinks = sink_values_.data();
  return o;
}

std::vector<float> OrtCase::output() const {
  return decode(out.data(), spec_.dtype, out.size() / dtype_size(spec_.dtype));
}

std::vector<float> OrtCase::stored_new(bool value) const {
  const std::size_t row = std::size_t(spec_.kv_num_heads) * spec_.head_size;
  const auto& cache = value ? value_cache : key_cache;
  std::vector<float> rows;
  for (std::int32_t b = 0; b < static_cast<std::int32_t>(spec_.seqs.size()); ++b)
    for (std::int32_t j = 0; j < spec_.seqs[std::size_t(b)].first; ++j) {
      const std::int64_t slot = slot_of(b, past[b] + j);
      const std::vector<float> r = decode(
          cache.data() + std::size_t(slot) * row * dtype_size(spec_.dtype), spec_.dtype, row);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  return rows;
}

}  // namespace pagedattn::ops::test
