// The CUDA merge and decode kernels: cuda_merge_states against the CPU
// merge_states, and the decode kernel (with and without KV splits, whose
// partials the merge kernel combines) against the double-precision
// reference, launched directly from work items built here. Host-only tests
// (argument validation, launch shapes) run without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "cuda_test_support.h"
#include "kernels/cuda/device_args.h"
#include "pagedattn/attention.h"
#include "pagedattn/cuda.h"
#include "pagedattn/errors.h"

namespace pagedattn::testing {
namespace {

using cuda::CudaMergeTask;
using cuda::CudaWorkItem;
using cuda::LaunchConfig;
using cuda::detail::AttentionArgs;

constexpr float kInf = std::numeric_limits<float>::infinity();

// --- cuda_merge_states ----------------------------------------------------------------

// The exception cuda_merge_states throws, or "" if none (or another type).
std::string merge_states_error(const float* v_a, const float* s_a, const float* v_b,
                               const float* s_b, float* v_out, float* s_out, std::int64_t num_rows,
                               std::int32_t dim) {
  try {
    cuda::cuda_merge_states(v_a, s_a, v_b, s_b, v_out, s_out, num_rows, dim);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Host pointers that are never dereferenced: every call below fails
// validation, which happens before any CUDA call (so this runs without a GPU).
TEST(CudaMergeStates, RejectsBadArgumentsBeforeTouchingTheDevice) {
  float v[4] = {}, s[2] = {};
  EXPECT_THAT(merge_states_error(nullptr, s, v, s, v, s, 2, 2), ::testing::HasSubstr("v_a"));
  EXPECT_THAT(merge_states_error(v, nullptr, v, s, v, s, 2, 2), ::testing::HasSubstr("s_a"));
  EXPECT_THAT(merge_states_error(v, s, nullptr, s, v, s, 2, 2), ::testing::HasSubstr("v_b"));
  EXPECT_THAT(merge_states_error(v, s, v, nullptr, v, s, 2, 2), ::testing::HasSubstr("s_b"));
  EXPECT_THAT(merge_states_error(v, s, v, s, nullptr, s, 2, 2), ::testing::HasSubstr("v_out"));
  EXPECT_THAT(merge_states_error(v, s, v, s, v, nullptr, 2, 2), ::testing::HasSubstr("s_out"));
  EXPECT_THAT(merge_states_error(v, s, v, s, v, s, 2, 0), ::testing::HasSubstr("dim = 0"));
  EXPECT_THAT(merge_states_error(v, s, v, s, v, s, -1, 2), ::testing::HasSubstr("num_rows = -1"));
  // No rows: nothing to do, and nothing is launched.
  EXPECT_NO_THROW(
      cuda::cuda_merge_states(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 3));
}

struct MergeInputs {
  std::vector<float> v_a, s_a, v_b, s_b;
};

// Random states; about a quarter of each side's LSEs are -inf (empty), some
// rows on both sides.
MergeInputs random_merge_inputs(std::int64_t rows, std::int32_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> quarter(0, 3);
  MergeInputs in;
  const auto n = static_cast<std::size_t>(rows * dim);
  for (auto* v : {&in.v_a, &in.v_b}) {
    v->resize(n);
    for (float& x : *v) x = normal(rng);
  }
  for (auto* s : {&in.s_a, &in.s_b}) {
    s->resize(static_cast<std::size_t>(rows));
    for (float& x : *s) x = quarter(rng) == 0 ? -kInf : 4.0f * normal(rng);
  }
  return in;
}

void expect_states_equal(const std::vector<float>& want_v, const std::vector<float>& want_s,
                         const std::vector<float>& got_v, const std::vector<float>& got_s,
                         const std::string& what) {
  ASSERT_EQ(got_v.size(), want_v.size());
  ASSERT_EQ(got_s.size(), want_s.size());
  int bad = 0;
  for (std::size_t i = 0; i < want_v.size() && bad < 5; ++i)
    if (!(std::fabs(got_v[i] - want_v[i]) <= 1e-5f * (1.0f + std::fabs(want_v[i])))) {
      ++bad;
      ADD_FAILURE() << what << " v[" << i << "] = " << got_v[i] << ", CPU " << want_v[i];
    }
  for (std::size_t i = 0; i < want_s.size() && bad < 5; ++i) {
    const bool ok = std::isinf(want_s[i])
                        ? got_s[i] == want_s[i]
                        : std::fabs(got_s[i] - want_s[i]) <= 1e-5f * (1.0f + std::fabs(want_s[i]));
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << " s[" << i << "] = " << got_s[i] << ", CPU " << want_s[i];
    }
  }
}

// cuda_merge_states on `rows` random rows against the CPU merge_states,
// into separate outputs and in place (v_out = v_a, s_out = s_a).
void check_merge_states(std::int64_t rows, std::int32_t dim, std::uint32_t seed) {
  const MergeInputs in = random_merge_inputs(rows, dim, seed);
  std::vector<float> want_v(in.v_a.size()), want_s(in.s_a.size());
  merge_states(in.v_a, in.s_a, in.v_b, in.s_b, want_v, want_s, dim);

  DeviceBytes v_a(in.v_a), s_a(in.s_a), v_b(in.v_b), s_b(in.s_b);
  DeviceBytes v_out(in.v_a.size() * sizeof(float)), s_out(in.s_a.size() * sizeof(float));
  cuda::cuda_merge_states(v_a.as<float>(), s_a.as<float>(), v_b.as<float>(), s_b.as<float>(),
                          v_out.as<float>(), s_out.as<float>(), rows, dim);
  synchronize();
  const std::string what = std::to_string(rows) + " rows of " + std::to_string(dim);
  expect_states_equal(want_v, want_s, v_out.download<float>(), s_out.download<float>(), what);

  cuda::cuda_merge_states(v_a.as<float>(), s_a.as<float>(), v_b.as<float>(), s_b.as<float>(),
                          v_a.as<float>(), s_a.as<float>(), rows, dim);
  synchronize();
  expect_states_equal(want_v, want_s, v_a.download<float>(), s_a.download<float>(),
                      what + " in place");
}

TEST(CudaMergeStates, MatchesTheCpuMergeIncludingEmptyStatesAndAliasing) {
  PAGEDATTN_REQUIRE_GPU();
  check_merge_states(67, 1, 1);
  check_merge_states(67, 33, 2);
  check_merge_states(130, 128, 3);
  check_merge_states(5, 512, 4);
}

TEST(CudaMergeStates, CoversMoreRowsThanOneGrid) {
  PAGEDATTN_REQUIRE_GPU();
  check_merge_states(600000, 1, 5);  // more rows than the kernel's grid has warps
}

// --- launch shapes (host) ---------------------------------------------------------------

TEST(CudaDecodeLaunch, ShapesGrowWithHeadDimsAndFitTheDevices) {
  using cuda::detail::decode_launch;
  for (const DType kv :
       {DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8, DType::kF32}) {
    const LaunchConfig small = decode_launch(1, 1, kv);
    const LaunchConfig usual = decode_launch(128, 128, kv);
    const LaunchConfig mla = decode_launch(576, 512, kv);
    EXPECT_GT(usual.threads, 0u);
    EXPECT_EQ(usual.threads % 32, 0u);
    EXPECT_EQ(mla.threads, usual.threads);
    EXPECT_GT(small.shared_bytes, 0u);
    EXPECT_LE(small.shared_bytes, usual.shared_bytes) << dtype_name(kv);
    EXPECT_LT(usual.shared_bytes, mla.shared_bytes) << dtype_name(kv);
    // H100 / H200 allow 227 KiB per CTA, A100 163 KiB (f32 K/V, which the
    // planner refuses, needs more).
    EXPECT_LE(mla.shared_bytes, (kv == DType::kF32 ? 227u : 163u) * 1024) << dtype_name(kv);
    for (const std::int32_t dim : {1, 3, 72, 100})
      EXPECT_LE(decode_launch(dim, dim, kv).shared_bytes, 227u * 1024) << dim;
  }
  // Value dims beyond the accumulators are not served: more shared memory than any device has.
  EXPECT_GT(decode_launch(128, 1024, DType::kBF16).shared_bytes, 227u * 1024);
  EXPECT_GT(decode_launch(0, 128, DType::kBF16).shared_bytes, 227u * 1024);

  for (const std::int32_t dim : {1, 64, 100, 128, 512, 4096}) {
    const LaunchConfig merge = cuda::detail::merge_launch(dim);
    EXPECT_GE(merge.threads, 32u) << dim;
    EXPECT_LE(merge.threads, 1024u) << dim;
    EXPECT_EQ(merge.threads % 32, 0u) << dim;
  }
}

// --- the decode kernel against the reference -------------------------------------------

// The work of one decode run: items of at most kDecodeMaxRows rows (a KV
// head's query heads in chunks of up to 16, as many tokens as fit), each
// sequence's keys cut into chunks of `kv_chunk` (0: whole) whose partials
// merge tasks combine.
struct DecodeWork {
  std::vector<CudaWorkItem> items;
  std::vector<CudaMergeTask> merges;
  std::int32_t num_partials = 0;
  std::int32_t max_rows = 1;
};

DecodeWork make_decode_work(const AttentionParams& p, std::int32_t kv_chunk) {
  DecodeWork work;
  const std::int32_t group = p.num_qo_heads / p.kv.num_kv_heads;
  const std::int32_t head_chunk = std::min(group, cuda::detail::kDecodeMaxRows);
  for (std::int32_t b = 0; b < p.table.batch_size; ++b) {
    const std::int32_t q_len = p.table.q_len(b), kv_len = p.table.kv_lens[b];
    for (std::int32_t kv_head = 0; kv_head < p.kv.num_kv_heads; ++kv_head) {
      const std::int32_t heads_end = (kv_head + 1) * group;
      for (std::int32_t h0 = kv_head * group, h1 = 0; h0 < heads_end; h0 = h1) {
        h1 = std::min(h0 + head_chunk, heads_end);
        const std::int32_t tokens = cuda::detail::kDecodeMaxRows / (h1 - h0);
        for (std::int32_t t0 = 0; t0 < q_len; t0 += tokens) {
          CudaWorkItem item;
          item.batch = b;
          item.qo_head_begin = h0;
          item.qo_head_end = h1;
          item.q_begin = t0;
          item.q_end = std::min(t0 + tokens, q_len);
          work.max_rows = std::max(work.max_rows, (item.q_end - t0) * (h1 - h0));
          if (kv_chunk == 0 || kv_len <= kv_chunk) {
            item.kv_begin = 0;
            item.kv_end = kv_len;
            work.items.push_back(item);
            continue;
          }
          CudaMergeTask merge;
          merge.batch = b;
          merge.qo_head_begin = h0;
          merge.qo_head_end = h1;
          merge.q_begin = item.q_begin;
          merge.q_end = item.q_end;
          merge.first_partial = work.num_partials;
          for (std::int32_t k = 0; k < kv_len; k += kv_chunk) {
            item.kv_begin = k;
            item.kv_end = std::min(k + kv_chunk, kv_len);
            item.partial = work.num_partials++;
            work.items.push_back(item);
          }
          merge.num_partials = work.num_partials - merge.first_partial;
          work.merges.push_back(merge);
        }
      }
    }
  }
  return work;
}

template <class T>
DeviceBytes upload(const T* host, std::size_t count) {
  return host ? DeviceBytes(host, count * sizeof(T)) : DeviceBytes();
}

// Runs the decode (and merge) kernels on `host`'s case, every buffer copied
// to the device, and writes the outputs back to host.o / host.lse.
void run_decode_kernels(const AttentionParams& host, std::int32_t kv_chunk) {
  const PagedKVTable& t = host.table;
  const PagedKVStorage& kv = host.kv;
  const std::int32_t batch = t.batch_size, heads = host.num_qo_heads;
  const std::size_t tokens = static_cast<std::size_t>(t.qo_indptr[batch]);
  const std::size_t kv_elem = dtype_size(kv.dtype);
  const std::size_t slots = static_cast<std::size_t>(kv.num_pages) * kv.page_size;
  const std::size_t o_bytes = tokens * host.o.token_stride * dtype_size(host.o.dtype);

  DeviceBytes q(host.q.data, tokens * host.q.token_stride * dtype_size(host.q.dtype));
  DeviceBytes o(host.o.data, o_bytes);
  DeviceBytes lse = upload(host.lse, tokens * heads);
  DeviceBytes qo_indptr = upload(t.qo_indptr, batch + 1);
  DeviceBytes kv_indptr = upload(t.kv_indptr, batch + 1);
  DeviceBytes kv_indices = upload(t.kv_indices, static_cast<std::size_t>(t.kv_indptr[batch]));
  DeviceBytes kv_lens = upload(t.kv_lens, batch);
  DeviceBytes k_data(kv.k_data,
                     static_cast<std::size_t>(kv.num_pages * kv.k_page_stride) * kv_elem);
  DeviceBytes v_data =
      kv.v_in_k ? DeviceBytes()
                : DeviceBytes(kv.v_data,
                              static_cast<std::size_t>(kv.num_pages * kv.v_page_stride) * kv_elem);
  const std::size_t kv_heads = static_cast<std::size_t>(kv.num_kv_heads);
  DeviceBytes k_head_scales = upload(kv.k_head_scales, kv_heads);
  DeviceBytes v_head_scales = upload(kv.v_head_scales, kv_heads);
  DeviceBytes k_token_scales = upload(kv.k_token_scales, slots * kv_heads);
  DeviceBytes v_token_scales = upload(kv.v_token_scales, slots * kv_heads);
  DeviceBytes alibi = upload(host.options.alibi_slopes, static_cast<std::size_t>(heads));
  DeviceBytes sinks = upload(host.options.sinks, static_cast<std::size_t>(heads));

  AttentionArgs args;
  args.q = {q.get(), host.q.dtype, host.q.token_stride, host.q.head_stride};
  args.o = {o.get(), host.o.dtype, host.o.token_stride, host.o.head_stride};
  args.lse = lse.as<float>();
  args.num_qo_heads = heads;
  args.group = heads / kv.num_kv_heads;
  args.qo_indptr = qo_indptr.as<std::int32_t>();
  args.kv_indptr = kv_indptr.as<std::int32_t>();
  args.kv_indices = kv_indices.as<std::int32_t>();
  args.kv_lens = kv_lens.as<std::int32_t>();
  args.kv = kv;
  args.kv.k_data = k_data.get();
  args.kv.v_data = kv.v_in_k ? k_data.get() : v_data.get();
  args.kv.k_head_scales = k_head_scales.as<float>();
  args.kv.v_head_scales = kv.v_in_k ? args.kv.k_head_scales : v_head_scales.as<float>();
  args.kv.k_token_scales = k_token_scales.as<float>();
  args.kv.v_token_scales = kv.v_in_k ? args.kv.k_token_scales : v_token_scales.as<float>();
  args.kv.page_may_hold_nan = nullptr;
  args.scale = host.options.scale.value_or(1.0f / std::sqrt(static_cast<float>(kv.head_dim)));
  args.softcap = host.options.softcap;
  args.window_left = host.options.window_left;
  args.causal = host.options.causal;
  args.alibi_slopes = alibi.as<float>();
  args.sinks = sinks.as<float>();

  const DecodeWork work = make_decode_work(host, kv_chunk);
  DeviceBytes items(work.items), merges(work.merges);
  DeviceBytes partial_out(static_cast<std::size_t>(work.num_partials) * work.max_rows *
                          kv.v_head_dim * sizeof(float));
  DeviceBytes partial_lse(static_cast<std::size_t>(work.num_partials) * work.max_rows *
                          sizeof(float));
  if (work.num_partials > 0) {  // NaN: a slot row the decode kernel misses shows
    partial_out.fill(0xff);
    partial_lse.fill(0xff);
  }
  args.items = items.as<CudaWorkItem>();
  args.num_items = static_cast<std::int32_t>(work.items.size());
  args.merges = merges.as<CudaMergeTask>();
  args.num_merges = static_cast<std::int32_t>(work.merges.size());
  args.partial_out = partial_out.as<float>();
  args.partial_lse = partial_lse.as<float>();
  args.max_rows = work.max_rows;

  LaunchConfig decode = cuda::detail::decode_launch(kv.head_dim, kv.v_head_dim, kv.dtype);
  decode.grid = static_cast<std::uint32_t>(work.items.size());
  cuda::detail::launch_decode(args, decode, nullptr);
  LaunchConfig merge = cuda::detail::merge_launch(kv.v_head_dim);
  merge.grid = static_cast<std::uint32_t>(work.merges.size() * work.max_rows);
  cuda::detail::launch_merge(args, merge, nullptr);
  synchronize();
  o.download_to(host.o.data);
  if (host.lse) lse.download_to(host.lse);
}

// A random decode-sized case: up to 3 query tokens per sequence (some none),
// up to 700 keys (some none), GQA groups that fill row blocks unevenly, head
// dims with and without 16-byte rows, every K/V type and option.
CaseSpec decode_spec(std::uint32_t seed) {
  std::mt19937 rng(seed);
  CaseSpec s;
  s.seed = seed;
  const int batch = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int b = 0; b < batch; ++b) {
    const std::int32_t q_len = pick_one(rng, 0, 1, 1, 1, 2, 3);
    s.q_lens.push_back(q_len);
    s.kv_lens.push_back(std::max(q_len, pick_one(rng, 0, 1, 17, 100, 300, 700)));
  }
  s.num_kv_heads = pick_one(rng, 1, 2);
  s.num_qo_heads = s.num_kv_heads * pick_one(rng, 1, 3, 4, 5, 8, 16, 20);
  const std::pair<std::int32_t, std::int32_t> dims =
      pick_one(rng, std::pair{128, 128}, std::pair{64, 64}, std::pair{72, 72}, std::pair{100, 100},
               std::pair{3, 3}, std::pair{1, 1}, std::pair{256, 256}, std::pair{192, 128},
               std::pair{80, 96});
  s.head_dim = dims.first;
  s.v_head_dim = dims.second;
  s.kv_dtype =
      pick_one(rng, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kINT8);
  s.q_dtype = pick_one(rng, DType::kF32, DType::kF16, DType::kBF16);
  s.o_dtype = pick_one(rng, DType::kF32, DType::kF16, DType::kBF16);
  s.layout = pick_one(rng, KVLayout::kHND, KVLayout::kNHD);
  s.page_size = pick_one(rng, 1, 7, 16, 64);
  s.per_head_fp8_scales = pick_one(rng, false, true);
  s.options.causal = pick_one(rng, true, true, true, false);
  s.options.window_left = pick_one(rng, -1, -1, 0, 5, 64);
  s.options.softcap = pick_one(rng, 0.0f, 0.0f, 30.0f);
  if (pick_one(rng, false, true)) s.options.scale = 0.3f;
  s.alibi = pick_one(rng, false, true);
  s.sinks = pick_one(rng, false, true);
  s.with_lse = pick_one(rng, true, true, false);
  return s;
}

std::string describe(const CaseSpec& s, std::int32_t kv_chunk) {
  return describe_case(s) + " kv_chunk " + std::to_string(kv_chunk);
}

RowTolerance decode_tolerance(const CaseSpec& s) {
  return {output_row_tolerance(s.o_dtype), kFp32LseTolerance};
}

TEST(CudaDecodeKernel, MatchesTheReferenceWithAndWithoutKvSplits) {
  PAGEDATTN_REQUIRE_GPU();
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    const CaseSpec spec = decode_spec(seed);
    AttentionCase c(spec);
    paged_attention_reference(c.params(0));
    for (const std::int32_t kv_chunk : {0, 64, 37}) {
      const std::string what = describe(spec, kv_chunk);
      run_decode_kernels(c.params(1), kv_chunk);
      expect_rows_close(c, decode_tolerance(spec), what);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Latent attention (MLA): one KV head, K rows of 576, V the first 512
// elements of each K row (no V stored).
TEST(CudaDecodeKernel, ServesLatentAttentionWithVInsideK) {
  PAGEDATTN_REQUIRE_GPU();
  for (const DType kv : {DType::kBF16, DType::kFP8E4M3, DType::kINT8}) {
    CaseSpec spec;
    spec.seed = 7;
    spec.q_lens = {1, 2, 1};
    spec.kv_lens = {300, 41, 1};
    spec.num_kv_heads = 1;
    spec.num_qo_heads = 16;
    spec.head_dim = 576;
    spec.v_head_dim = 512;
    spec.kv_dtype = kv;
    spec.q_dtype = DType::kBF16;
    spec.o_dtype = DType::kF32;
    spec.page_size = 16;
    spec.options.scale = 0.05f;
    AttentionCase c(spec);
    const auto latent = [&](AttentionParams p) {
      PagedKVStorage s = PagedKVStorage::latent(p.kv.k_data, kv, p.kv.layout, p.kv.page_size, 576,
                                                512, p.kv.num_pages);
      s.k_scale = p.kv.k_scale;
      s.k_head_scales = p.kv.k_head_scales;
      s.k_token_scales = p.kv.k_token_scales;
      s.share_k_scales_with_v();
      p.kv = s;
      return p;
    };
    paged_attention_reference(latent(c.params(0)));
    for (const std::int32_t kv_chunk : {0, 64}) {
      run_decode_kernels(latent(c.params(1)), kv_chunk);
      expect_rows_close(
          c, decode_tolerance(spec),
          "MLA " + std::string(dtype_name(kv)) + " kv_chunk " + std::to_string(kv_chunk));
    }
  }
}

}  // namespace
}  // namespace pagedattn::testing
