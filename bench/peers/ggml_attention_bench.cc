// llama.cpp's CPU flash attention (ggml_flash_attn_ext on the ggml CPU
// backend) on the shapes of `pagedattn bench-attention`, printing the same
// "time per call" / "K+V read" lines so that compare_attention.sh can put it
// beside pagedattn. Build: bench/peers/build_ggml_bench.sh (see README.md).
//
// Layout: each sequence has its own contiguous K/V, the 4th ggml dimension
//   q    [head_dim, q_len,  qo_heads, batch]  f32 (as llama.cpp passes it)
//   k, v [head_dim, kv_len, kv_heads, batch]  --kv-dtype (GQA by broadcast)
//   mask [kv_len,   q_len,  1,        1]      f16, causal bottom-right; only
//                                             when q_len > 1 (decode sees every key)
//   out  [head_dim, qo_heads, q_len,  batch]  f32 (ggml permutes the result)
//
// Precision (ggml-cpu/ops.cpp of the vendored ggml): GGML_PREC_F32 is set as
// llama.cpp sets it; the CPU backend runs the same code for it as for
// GGML_PREC_DEFAULT (and accepts no other setting). Two paths:
//  - tiled (>= 64 query rows per head with f16/f32 K/V, i.e. prefill): K is
//    widened to f32, QK^T is an f32 GEMM, softmax and the P.V accumulator f32;
//  - per row (decode, and bf16/q8_0 K/V): Q is rounded to K's dot type (f16
//    for f16 K), each q.k dot sums in f32, online softmax in f32, and with f16
//    V the output accumulator itself is f16 (rounded after every key);
//    other V types accumulate in f32. Decode with batch 1 and >= 512 keys
//    splits the keys across threads and merges partial results in f32.
#include <ggml-cpu.h>
#include <ggml.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "workload_rules.h"  // bench-attention's working set and FLOP count

namespace {

using pagedattn::bench::attention_flops;
using pagedattn::bench::l3_cache_bytes;
using pagedattn::bench::min_working_set_bytes;

struct Options {
  bool prefill = false;
  ggml_type kv_type = GGML_TYPE_F16;
  std::string kv_name = "f16";
  int batch = 1, kv_len = 4096, q_len = 0, qo_heads = 32, kv_heads = 8, head_dim = 128;
  int threads = 2;
  double seconds = 2.0;
  bool hot = false, check = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(
      stderr,
      "error: %s\nusage: ggml_attention_bench [--mode decode|prefill] [--kv-dtype f16|bf16|q8_0]\n"
      "  [--batch N] [--kv-len N] [--q-len N] [--heads QxK] [--head-dim D] [--threads N]\n"
      "  [--seconds S] [--hot] [--check]\n",
      message.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& text, int low, int high) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < low || v > high)
    usage_error(flag + ": expected an integer in [" + std::to_string(low) + ", " +
                std::to_string(high) + "], got '" + text + "'");
  return int(v);
}

ggml_type parse_kv_type(const std::string& name) {
  if (name == "f16") return GGML_TYPE_F16;
  if (name == "bf16") return GGML_TYPE_BF16;
  if (name == "q8_0") return GGML_TYPE_Q8_0;
  usage_error("--kv-dtype: expected f16, bf16 or q8_0, got '" + name + "'");
}

void parse_heads(const std::string& text, Options& o) {
  const auto x = text.find('x');
  if (x == std::string::npos) usage_error("--heads: expected QxK, got '" + text + "'");
  o.qo_heads = parse_int("--heads", text.substr(0, x), 1, 1024);
  o.kv_heads = parse_int("--heads", text.substr(x + 1), 1, 1024);
  if (o.qo_heads % o.kv_heads != 0)
    usage_error("--heads: query heads must be a multiple of KV heads");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--mode") {
      const std::string m = value();
      if (m != "decode" && m != "prefill") usage_error("--mode: expected decode or prefill");
      o.prefill = m == "prefill";
    } else if (flag == "--kv-dtype") {
      o.kv_name = value();
      o.kv_type = parse_kv_type(o.kv_name);
    } else if (flag == "--batch") {
      o.batch = parse_int(flag, value(), 1, 4096);
    } else if (flag == "--kv-len") {
      o.kv_len = parse_int(flag, value(), 1, 1 << 22);
    } else if (flag == "--q-len") {
      o.q_len = parse_int(flag, value(), 1, 1 << 20);
    } else if (flag == "--heads") {
      parse_heads(value(), o);
    } else if (flag == "--head-dim") {
      o.head_dim = parse_int(flag, value(), 1, 1024);
    } else if (flag == "--threads") {
      o.threads = parse_int(flag, value(), 1, 1024);
    } else if (flag == "--seconds") {
      o.seconds = std::atof(value().c_str());
      if (!(o.seconds > 0.0 && o.seconds <= 600.0)) usage_error("--seconds: expected (0, 600]");
    } else if (flag == "--hot") {
      o.hot = true;
    } else if (flag == "--check") {
      o.check = true;
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  // As bench-attention: decode is one query per sequence, prefill q_len = kv_len.
  if (o.q_len == 0) o.q_len = o.prefill ? o.kv_len : 1;
  if (o.q_len > o.kv_len) usage_error("--q-len exceeds --kv-len");
  if (o.head_dim % ggml_blck_size(o.kv_type) != 0)
    usage_error("--head-dim must be a multiple of " + std::to_string(ggml_blck_size(o.kv_type)) +
                " for " + o.kv_name);
  return o;
}

// Page-aligned memory on transparent huge pages where the kernel allows
// (bench-attention's buffers are huge-page backed too).
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

Buffer allocate(std::size_t bytes) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHugePage, rounded));
  if (!p) {
    std::fprintf(stderr, "error: cannot allocate %zu bytes\n", rounded);
    std::exit(1);
  }
  madvise(p, rounded, MADV_HUGEPAGE);
  return Buffer(p);
}

std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// K/V rows are filled from a pattern of random rows (stored in the KV type)
// cycled with a stride, so that filling a GiB takes memcpy time, not RNG time.
struct RowPattern {
  static constexpr std::size_t kRows = 4099;  // prime: no period that lines up with heads
  std::vector<std::byte> data;
  std::size_t row_bytes;

  RowPattern(ggml_type type, int head_dim, unsigned seed)
      : row_bytes(ggml_row_size(type, head_dim)) {
    const std::vector<float> values = normal_values(kRows * head_dim, seed);
    data.resize(kRows * row_bytes);
    ggml_quantize_chunk(type, values.data(), data.data(), 0, kRows, head_dim, nullptr);
  }
  void fill(std::byte* dst, std::size_t rows, std::size_t offset) const {
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * row_bytes, data.data() + (r * 7 + offset) % kRows * row_bytes,
                  row_bytes);
  }
};

// All the tensors' storage: copies of K and V (rotated through so that decode
// reads them from memory), queries, mask and output.
struct Storage {
  std::vector<Buffer> k, v;
  std::vector<float> q;
  std::vector<ggml_fp16_t> mask;
  std::vector<float> out;
  std::size_t kv_bytes_per_copy = 0;  // K + V
};

std::size_t kv_rows(const Options& o) {
  return std::size_t(o.batch) * o.kv_heads * o.kv_len;
}

// Enough copies that K+V exceed max(256 MiB, 4 x L3), as bench-attention does.
int copies_needed(const Options& o, std::size_t copy_bytes) {
  if (o.hot) return 1;
  return int(std::max<std::size_t>(1, (min_working_set_bytes() + copy_bytes - 1) / copy_bytes));
}

// Causal, bottom-right aligned: query i sees keys 0 .. kv_len - q_len + i.
std::vector<ggml_fp16_t> causal_mask(const Options& o) {
  std::vector<ggml_fp16_t> mask(std::size_t(o.kv_len) * o.q_len);
  const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
  for (int i = 0; i < o.q_len; ++i)
    for (int j = 0; j < o.kv_len; ++j)
      mask[std::size_t(i) * o.kv_len + j] = j <= o.kv_len - o.q_len + i ? zero : minus_inf;
  return mask;
}

Storage make_storage(const Options& o) {
  Storage s;
  const RowPattern k_pattern(o.kv_type, o.head_dim, 1), v_pattern(o.kv_type, o.head_dim, 2);
  const std::size_t tensor_bytes = kv_rows(o) * k_pattern.row_bytes;
  s.kv_bytes_per_copy = 2 * tensor_bytes;
  const int copies = copies_needed(o, s.kv_bytes_per_copy);
  for (int c = 0; c < copies; ++c) {
    s.k.push_back(allocate(tensor_bytes));
    s.v.push_back(allocate(tensor_bytes));
    k_pattern.fill(s.k.back().get(), kv_rows(o), std::size_t(c));
    v_pattern.fill(s.v.back().get(), kv_rows(o), std::size_t(c) + 11);
  }
  s.q = normal_values(std::size_t(o.batch) * o.qo_heads * o.q_len * o.head_dim, 3);
  if (o.q_len > 1) s.mask = causal_mask(o);
  s.out.resize(std::size_t(o.batch) * o.q_len * o.qo_heads * o.head_dim);
  return s;
}

// One graph holding the single flash-attention node; its K/V data pointers
// are switched between copies before each call.
struct Graph {
  ggml_context* ctx = nullptr;
  ggml_cgraph* graph = nullptr;
  ggml_tensor *k = nullptr, *v = nullptr;
  ggml_threadpool* threadpool = nullptr;
  ggml_cplan plan{};
  std::vector<std::uint8_t> work;

  Graph(const Options& o, Storage& s);
  ~Graph() {
    ggml_threadpool_free(threadpool);
    ggml_free(ctx);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void run(Storage& s, int copy) {
    k->data = s.k[std::size_t(copy)].get();
    v->data = s.v[std::size_t(copy)].get();
    if (ggml_graph_compute(graph, &plan) != GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "error: ggml_graph_compute failed\n");
      std::exit(1);
    }
  }
};

Graph::Graph(const Options& o, Storage& s) {
  // Metadata only: every tensor points into Storage.
  const ggml_init_params params{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
  ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, o.head_dim, o.q_len, o.qo_heads, o.batch);
  k = ggml_new_tensor_4d(ctx, o.kv_type, o.head_dim, o.kv_len, o.kv_heads, o.batch);
  v = ggml_new_tensor_4d(ctx, o.kv_type, o.head_dim, o.kv_len, o.kv_heads, o.batch);
  ggml_tensor* mask = nullptr;
  if (!s.mask.empty()) {
    mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, o.kv_len, o.q_len, 1, 1);
    mask->data = s.mask.data();
  }
  q->data = s.q.data();
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / std::sqrt(float(o.head_dim)),
                                         /*max_bias=*/0.0f, /*logit_softcap=*/0.0f);
  ggml_prec_set_acc(out, GGML_PREC_F32);  // as llama.cpp's graph does
  out->data = s.out.data();
  graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);

  ggml_threadpool_params tp = ggml_threadpool_params_default(o.threads);
  threadpool = ggml_threadpool_new(&tp);
  plan = ggml_graph_plan(graph, o.threads, threadpool);
  work.resize(plan.work_size);
  plan.work_data = work.data();
}

// `rows` rows of `n` values stored as `type`, widened to double.
std::vector<double> dequantized(ggml_type type, const std::byte* src, std::size_t rows, int n) {
  std::vector<float> f(rows * std::size_t(n));
  const std::size_t row_bytes = ggml_row_size(type, n);
  for (std::size_t r = 0; r < rows; ++r)
    ggml_get_type_traits(type)->to_float(src + r * row_bytes, f.data() + r * std::size_t(n), n);
  return {f.begin(), f.end()};
}

// One output row of causal softmax attention in double precision.
std::vector<double> reference_row(const Options& o, const float* q, const std::vector<double>& keys,
                                  const std::vector<double>& values, int visible) {
  const std::size_t d_count = std::size_t(o.head_dim);
  std::vector<double> scores(std::size_t(visible), 0.0), out(d_count, 0.0);
  double max_score = -INFINITY, sum = 0.0;
  for (int j = 0; j < visible; ++j) {
    double dot = 0.0;
    for (std::size_t d = 0; d < d_count; ++d)
      dot += double(q[d]) * keys[std::size_t(j) * d_count + d];
    scores[std::size_t(j)] = dot / std::sqrt(double(o.head_dim));
    max_score = std::max(max_score, scores[std::size_t(j)]);
  }
  for (int j = 0; j < visible; ++j) {
    const double p = std::exp(scores[std::size_t(j)] - max_score);
    sum += p;
    for (std::size_t d = 0; d < d_count; ++d) out[d] += p * values[std::size_t(j) * d_count + d];
  }
  for (double& x : out) x /= sum;
  return out;
}

// Largest |ggml - reference| / largest |reference| over the output rows of
// copy 0 (every row, or evenly strided rows when a scalar reference of all
// of them would take long), against a double-precision reference computed
// from the same stored K/V values.
double relative_error(const Options& o, Storage& s, Graph& g) {
  g.run(s, 0);
  const std::size_t rows = std::size_t(o.batch) * o.qo_heads * o.q_len;
  const double work_per_row = double(o.kv_len) * o.head_dim;
  const std::size_t stride =
      std::max<std::size_t>(1, std::size_t(double(rows) * work_per_row / 2e8));
  const std::size_t row_bytes = ggml_row_size(o.kv_type, o.head_dim);
  const int group = o.qo_heads / o.kv_heads;
  double max_err = 0.0, max_ref = 0.0;
  std::size_t loaded = SIZE_MAX;  // the (sequence, KV head) whose K/V are widened
  std::vector<double> keys, values;
  for (std::size_t r = 0; r < rows; r += stride) {
    const int i = int(r % o.q_len), h = int(r / o.q_len % o.qo_heads),
              b = int(r / o.q_len / o.qo_heads);
    const std::size_t slice = std::size_t(b) * o.kv_heads + h / group;
    if (slice != loaded) {
      keys =
          dequantized(o.kv_type, s.k[0].get() + slice * o.kv_len * row_bytes, o.kv_len, o.head_dim);
      values =
          dequantized(o.kv_type, s.v[0].get() + slice * o.kv_len * row_bytes, o.kv_len, o.head_dim);
      loaded = slice;
    }
    const float* q = &s.q[((std::size_t(b) * o.qo_heads + h) * o.q_len + i) * o.head_dim];
    const std::vector<double> ref = reference_row(o, q, keys, values, o.kv_len - o.q_len + i + 1);
    // ggml's output is permuted: [head_dim, qo_heads, q_len, batch].
    const float* got = &s.out[((std::size_t(b) * o.q_len + i) * o.qo_heads + h) * o.head_dim];
    for (int d = 0; d < o.head_dim; ++d) {
      max_err = std::max(max_err, std::fabs(double(got[d]) - ref[std::size_t(d)]));
      max_ref = std::max(max_ref, std::fabs(ref[std::size_t(d)]));
    }
  }
  std::printf("check: %zu of %zu output rows compared with a float64 reference\n",
              (rows + stride - 1) / stride, rows);
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

struct Timing {
  double best = 0.0, median = 0.0;
  int calls = 0;
};

// Rotates through the copies (copy 0 alone with --hot) for at least `seconds`.
Timing time_calls(const Options& o, Storage& s, Graph& g) {
  using Clock = std::chrono::steady_clock;
  const int copies = int(s.k.size());
  g.run(s, 0);  // warm-up: thread start, work buffer page faults
  std::vector<double> times;
  const auto start = Clock::now();
  for (int i = 0;
       times.size() < 3 || std::chrono::duration<double>(Clock::now() - start).count() < o.seconds;
       ++i) {
    const auto t0 = Clock::now();
    g.run(s, o.hot ? 0 : i % copies);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2], int(times.size())};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  ggml_cpu_init();
  std::printf("ggml: version %s (commit %s), CPU backend, ggml_flash_attn_ext, GGML_PREC_F32\n",
              ggml_version(), ggml_commit());
  std::printf(
      "shape: %s KV, heads %dx%d, head_dim %d, batch %d, q_len %d, kv_len %d, contiguous, %d "
      "threads\n",
      o.kv_name.c_str(), o.qo_heads, o.kv_heads, o.head_dim, o.batch, o.q_len, o.kv_len, o.threads);
  Storage s = make_storage(o);
  std::printf("working set: %zu copies, %.0f MiB of K/V (L3 %.0f MiB)\n", s.k.size(),
              double(s.k.size() * s.kv_bytes_per_copy) / double(1 << 20),
              double(l3_cache_bytes()) / double(1 << 20));
  Graph g(o, s);
  if (o.check) {
    constexpr double kTolerance = 2e-2;
    const double err = relative_error(o, s, g);
    std::printf("max |kernel - reference| / max |reference|: %.2e (%s)\n", err,
                err <= kTolerance ? "ok" : "FAILED");
    if (!(err <= kTolerance)) return 3;
  }
  const Timing t = time_calls(o, s, g);
  if (o.hot)
    std::printf("hot: every call re-reads copy 0 (%.1f MiB of K/V)\n",
                double(s.kv_bytes_per_copy) / double(1 << 20));
  const double kv_bytes = double(s.kv_bytes_per_copy);
  std::printf("time per call: median %.3f ms, best %.3f ms (%d calls)\n", t.median * 1e3,
              t.best * 1e3, t.calls);
  std::printf("K+V read: %.2f GB/s   compute: %.1f GFLOP/s\n", kv_bytes / t.median / 1e9,
              attention_flops(o.batch, o.qo_heads, o.head_dim, o.q_len, o.kv_len) / t.median / 1e9);
  return 0;
}
