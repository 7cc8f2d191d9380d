// The canonical attention definition, written for clarity: one (token, head)
// row at a time, double accumulation, no tiling. The oracle for every
// optimised kernel.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/validate.h"
#include "pagedattn/attention.h"

namespace pagedattn {
namespace {

struct RowInput {
  const AttentionParams* p;
  std::int32_t b;      // sequence in the batch
  std::int32_t token;  // global query token index
  std::int32_t head;   // query head
  std::int64_t q_pos;  // the query's key index (causal and window limits)
};

// Key j of sequence b, dequantised, and rotated at its position (j, or its
// token-tree position) when the options ask for inline RoPE: kv.head_dim
// values at `key`.
void load_key(const AttentionParams& p, std::int32_t b, std::int64_t j, std::int32_t kv_head,
              double* key) {
  const PagedKVStorage& kv = p.kv;
  const PagedKVTable& t = p.table;
  const std::int32_t page = t.page_of_key(b, j), slot = t.offset_of_key(b, j);
  const std::int64_t off = kv.k_offset(page, kv_head, slot);
  for (std::int32_t d = 0; d < kv.head_dim; ++d)
    key[d] = double(load_as_float(kv.k_data, kv.dtype, static_cast<std::size_t>(off + d))) *
             kv.k_dequant(page, kv_head, slot);
  const RopeConfig* rope = p.options.key_rope;
  if (rope == nullptr) return;
  const std::int32_t r = rope->rotary_dim ? rope->rotary_dim : kv.head_dim, half = r / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    double c, s;
    const std::int64_t pos = p.tree_mask.position(b, j);
    if (rope->cos_cache) {
      c = rope->cos_cache[pos * half + i];
      s = rope->sin_cache[pos * half + i];
    } else {
      const double angle = double(pos) * rope_inv_freq(*rope, r, i);
      c = rope_attention_factor(*rope) * std::cos(angle);
      s = rope_attention_factor(*rope) * std::sin(angle);
    }
    const std::size_t a = rope->style == RopeStyle::kNeox ? i : 2 * i;
    const std::size_t bi = rope->style == RopeStyle::kNeox ? i + half : 2 * i + 1;
    const double x = key[a], y = key[bi];
    key[a] = x * c - y * s;
    key[bi] = y * c + x * s;
  }
}

// Value j of sequence b, dequantised: kv.v_head_dim values at `value`.
void load_value(const AttentionParams& p, std::int32_t b, std::int64_t j, std::int32_t kv_head,
                double* value) {
  const PagedKVStorage& kv = p.kv;
  const std::int32_t page = p.table.page_of_key(b, j), slot = p.table.offset_of_key(b, j);
  const std::int64_t off = kv.v_offset(page, kv_head, slot);
  for (std::int32_t d = 0; d < kv.v_head_dim; ++d)
    value[d] = double(load_as_float(kv.v_data, kv.dtype, static_cast<std::size_t>(off + d))) *
               kv.v_dequant(page, kv_head, slot);
}

// Every key and value of one KV head of a sequence, as load_key and
// load_value give them, loaded once for all the rows that read them.
struct HeadKV {
  std::vector<double> k;  // [kv_len][head_dim]
  std::vector<double> v;  // [kv_len][v_head_dim]
  const double* key(std::int64_t j, std::int32_t dim) const { return k.data() + j * dim; }
  const double* value(std::int64_t j, std::int32_t dim) const { return v.data() + j * dim; }
};

void load_head_kv(const AttentionParams& p, std::int32_t b, std::int32_t kv_head, HeadKV& h) {
  const std::int64_t kv_len = p.table.kv_lens[b];
  const std::int32_t dk = p.kv.head_dim, dv = p.kv.v_head_dim;
  h.k.resize(static_cast<std::size_t>(kv_len * dk));
  h.v.resize(static_cast<std::size_t>(kv_len * dv));
  for (std::int64_t j = 0; j < kv_len; ++j) {
    load_key(p, b, j, kv_head, h.k.data() + j * dk);
    load_value(p, b, j, kv_head, h.v.data() + j * dv);
  }
}

bool visible(const AttentionParams& p, std::int32_t b, std::int64_t j, std::int64_t q_pos) {
  const AttentionOptions& opt = p.options;
  if (opt.causal && j > q_pos) return false;
  if (opt.window_left >= 0 && j < q_pos - opt.window_left) return false;
  return p.tree_mask.visible(b, j, q_pos);
}

// `rows`: the keys and values of the row's sequence and KV head.
void attend_row(const RowInput& r, const HeadKV& rows, std::vector<double>& logits,
                std::vector<double>& acc, std::vector<double>& query) {
  const AttentionParams& p = *r.p;
  const PagedKVStorage& kv = p.kv;
  const AttentionOptions& opt = p.options;
  const std::int64_t kv_len = p.table.kv_lens[r.b];
  const double scale = kernels::resolved_scale(p);
  const std::int64_t q_off = r.token * p.q.token_stride + r.head * p.q.head_stride;
  query.resize(static_cast<std::size_t>(kv.head_dim));
  for (std::int32_t d = 0; d < kv.head_dim; ++d)
    query[d] = double(load_as_float(p.q.data, p.q.dtype, static_cast<std::size_t>(q_off + d)));

  double m = -std::numeric_limits<double>::infinity();
  logits.assign(static_cast<std::size_t>(kv_len), m);
  for (std::int64_t j = 0; j < kv_len; ++j) {
    if (!visible(p, r.b, j, r.q_pos)) continue;
    const double* key = rows.key(j, kv.head_dim);
    double dot = 0.0;
    for (std::int32_t d = 0; d < kv.head_dim; ++d) dot += query[d] * key[d];
    double s = scale * dot;
    if (opt.softcap > 0.0f) s = opt.softcap * std::tanh(s / opt.softcap);
    if (opt.alibi_slopes)
      s += double(opt.alibi_slopes[r.head]) *
           double(p.tree_mask.position(r.b, j) - p.tree_mask.position(r.b, r.q_pos));
    logits[j] = s;
    m = std::max(m, s);
  }
  const bool has_sink = opt.sinks != nullptr;
  if (has_sink) m = std::max(m, double(opt.sinks[r.head]));

  double denom = has_sink ? std::exp(double(opt.sinks[r.head]) - m) : 0.0;
  acc.assign(static_cast<std::size_t>(kv.v_head_dim), 0.0);
  bool any_visible = false;
  for (std::int64_t j = 0; j < kv_len; ++j) {
    if (!visible(p, r.b, j, r.q_pos)) continue;
    any_visible = true;
    const double w = std::exp(logits[j] - m);
    denom += w;
    const double* value = rows.value(j, kv.v_head_dim);
    for (std::int32_t d = 0; d < kv.v_head_dim; ++d) acc[d] += w * value[d];
  }
  const std::int64_t o_off = r.token * p.o.token_stride + r.head * p.o.head_stride;
  for (std::int32_t d = 0; d < kv.v_head_dim; ++d)
    store_from_float(p.o.data, p.o.dtype, static_cast<std::size_t>(o_off + d),
                     any_visible ? static_cast<float>(acc[d] / denom) : 0.0f);
  if (p.lse)
    p.lse[std::int64_t{r.token} * p.num_qo_heads + r.head] =
        denom == 0.0 ? -std::numeric_limits<float>::infinity()  // nothing visible; NaN stays NaN
                     : static_cast<float>(m + std::log(denom));
}

}  // namespace

void paged_attention_reference(const AttentionParams& p) {
  kernels::validate_attention_params(p, "paged_attention_reference");
  std::vector<double> logits, acc, query;
  HeadKV rows;
  const PagedKVTable& t = p.table;
  const std::int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  for (std::int32_t b = 0; b < t.batch_size; ++b) {
    const std::int64_t q_len = t.q_len(b);
    const std::int64_t first_pos = std::int64_t{t.kv_lens[b]} - q_len;
    for (std::int32_t kv_head = 0; kv_head < p.kv.num_kv_heads; ++kv_head) {
      load_head_kv(p, b, kv_head, rows);
      for (std::int64_t i = 0; i < q_len; ++i)
        for (std::int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h)
          attend_row({&p, b, static_cast<std::int32_t>(t.qo_indptr[b] + i), h, first_pos + i}, rows,
                     logits, acc, query);
    }
  }
}

}  // namespace pagedattn
