#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "pagedattn/errors.h"
#include "support/random_floats.h"

namespace pagedattn::ops::test {

std::vector<unsigned char> poisoned_buffer(std::size_t count, DType dtype) {
  std::vector<unsigned char> raw(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i)
    store_from_float(raw.data(), dtype, i, std::numeric_limits<float>::quiet_NaN());
  return raw;
}

std::vector<float> randn(std::mt19937& rng, std::size_t count, DType dtype) {
  pagedattn::test::NormalFloats normal;
  std::vector<float> values(count);
  for (float& x : values) {
    std::uint32_t bits = 0;
    store_from_float(&bits, dtype, 0, normal(rng));
    x = load_as_float(&bits, dtype, 0);
  }
  return values;
}

std::vector<float> reference_output(const LogicalBatch& batch, const AttentionOptions& options) {
  const std::int32_t hkv = batch.num_kv_heads, d = batch.head_dim;
  const auto num_seqs = static_cast<std::int32_t>(batch.q_lens.size());
  std::int32_t page_size = 1;
  for (const auto& k : batch.k)
    page_size = std::max(page_size, static_cast<std::int32_t>(k.size() / (std::size_t(hkv) * d)));
  const std::size_t page_elems = std::size_t(page_size) * hkv * d;
  std::vector<float> k_pages(page_elems * num_seqs), v_pages(page_elems * num_seqs);
  std::vector<std::int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_page_len, kv_lens;
  for (std::int32_t b = 0; b < num_seqs; ++b) {
    std::copy(batch.k[b].begin(), batch.k[b].end(), k_pages.begin() + b * page_elems);
    std::copy(batch.v[b].begin(), batch.v[b].end(), v_pages.begin() + b * page_elems);
    const auto len = static_cast<std::int32_t>(batch.k[b].size() / (std::size_t(hkv) * d));
    qo_indptr.push_back(qo_indptr.back() + batch.q_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + (len > 0));
    if (len > 0) kv_indices.push_back(b);
    last_page_len.push_back(len);
    kv_lens.push_back(len);
  }
  std::vector<float> out(batch.q.size() / batch.head_dim * d);
  AttentionParams p;
  p.q = {const_cast<float*>(batch.q.data()), DType::kF32, std::int64_t{batch.num_qo_heads} * d, d};
  p.o = {out.data(), DType::kF32, std::int64_t{batch.num_qo_heads} * d, d};
  p.num_qo_heads = batch.num_qo_heads;
  p.table = {num_seqs,         page_size,         qo_indptr.data(),
             kv_indptr.data(), kv_indices.data(), last_page_len.data(),
             kv_lens.data(),   nullptr,           nullptr};
  p.kv = PagedKVStorage::dense(k_pages.data(), v_pages.data(), DType::kF32, KVLayout::kNHD,
                               page_size, hkv, d, d, num_seqs);
  p.options = options;
  paged_attention_reference(p);
  return out;
}

void rotate(std::vector<float>& x, std::int32_t heads, std::int32_t dim,
            const std::vector<std::int32_t>& positions, const std::vector<float>& cos,
            const std::vector<float>& sin, std::int32_t rotary_dim, bool interleaved) {
  const std::int32_t half = rotary_dim / 2;
  for (std::size_t t = 0; t < positions.size(); ++t)
    for (std::int32_t h = 0; h < heads; ++h) {
      float* row = x.data() + (t * heads + h) * dim;
      for (std::int32_t i = 0; i < half; ++i) {
        const float c = cos[std::size_t(positions[t]) * half + i];
        const float s = sin[std::size_t(positions[t]) * half + i];
        float& a = row[interleaved ? 2 * i : i];
        float& b = row[interleaved ? 2 * i + 1 : i + half];
        const float a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
    }
}

std::vector<float> decode(const void* raw, DType dtype, std::size_t count) {
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = load_as_float(raw, dtype, i);
  return out;
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, float atol,
                  float rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int misses = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float a = actual[i], e = expected[i];
    if (std::fabs(a - e) <= atol + rtol * std::fabs(e)) continue;
    if (++misses <= 5)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e;
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << actual.size() << " elements differ";
}

void expect_invalid(const std::function<void()>& call, const std::vector<std::string_view>& parts,
                    const std::vector<const std::vector<unsigned char>*>& watched) {
  std::vector<std::vector<unsigned char>> before;
  for (const auto* w : watched) before.push_back(*w);
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error containing \"" << parts.front() << "\"";
  } catch (const InvalidArgument& e) {
    for (std::string_view part : parts)
      EXPECT_NE(std::string_view(e.what()).find(part), std::string_view::npos)
          << "\"" << e.what() << "\" lacks \"" << part << "\"";
  }
  std::size_t i = 0;
  for (const auto* w : watched) EXPECT_EQ(*w, before[i++]) << "a failed call changed a cache";
}

}  // namespace pagedattn::ops::test
