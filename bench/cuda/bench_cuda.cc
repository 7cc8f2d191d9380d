// The CUDA backend's benchmark (include/pagedattn/cuda.h) on one GPU: paged
// decode over bf16 / fp8 e4m3 / int8 K/V, prefill, K/V append (vLLM's
// reshape_and_cache) and MLA decode, each beside a device-to-device copy
// probe measured in the same run. A plain main(); one line per case:
//
//   case=<name> ms=<median> GBps=<bytes/s / 1e9> TFLOPs=<FLOP/s / 1e12> frac_copy=<GBps / copy's>
//
// followed by more key=value pairs (vs=<case> speedup=<its ms / this ms>,
// single_ms, the plan's item counts, ...); a failed case prints
// `case=<name> error="..."` and the run goes on. Lines starting with # are
// notes (the byte and FLOP formulas among them).
//
// Isolation: every case runs in a forked child process and the parent never
// touches CUDA, so a kernel fault (a CUDA error is sticky for the rest of its
// process) or a hang (the parent kills the child past --timeout) costs that
// case alone. Each child allocates and frees its own buffers (at most about
// 4 GiB of K/V, the copy probe's 2 x 2 GiB).
//
// Timing: CUDA events on one stream; 3 warm-up calls, 3 single calls (their
// median is single_ms: the latency of one call on an idle stream, host
// enqueue included), then samples of back-to-back calls (each sample at
// least 1 ms) between one event pair, until there are >= 10 samples and
// >= 20 ms in all; ms is the median sample's time per call. Attention cases
// time cuda_paged_attention alone with a plan made once beforehand; every
// call includes the copy of the plan's work items to the workspace that it
// makes on the stream. Decode working sets smaller than 256 MiB are
// replicated (independent shuffled page ranges) and the calls rotate through
// the copies, so a call does not find its K/V in L2.
//
// Flags: --quick (fewer samples), --json FILE (every result also as a JSON
// line), --filter SUBSTR (only the cases whose name contains it; the copy
// probe always runs), --timeout S (per case, default 20), --budget S (no new
// case starts after S seconds, default 75; a case started late gets at most
// 10 s past it), --no-fork (all cases in this process: for compute-sanitizer
// or a debugger).
#include <cuda_runtime.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/cuda.h"
#include "pagedattn/dtype.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::int32_t kPageSize = 16;
// Decode working sets below this are replicated and rotated (well past the
// 50 MiB L2 of an H100 / H200).
constexpr double kMinRotatedBytes = 256.0 * kMiB;
constexpr int kMaxCopies = 16;
// Random element codes are made on the host once per buffer kind and tiled
// over the device buffers (the timing does not depend on the values).
constexpr std::size_t kPatternBytes = 8 * kMiB;
constexpr std::uint64_t kSeed = 20240611;

// --- CUDA helpers ------------------------------------------------------------

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
}

// Device memory of `bytes`, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void* get() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  void zero() {
    if (bytes_ > 0) check_cuda(cudaMemset(data_, 0, bytes_), "cudaMemset");
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  if (!host.empty())
    check_cuda(cudaMemcpy(buffer.get(), host.data(), buffer.bytes(), cudaMemcpyHostToDevice),
               "cudaMemcpy (upload)");
  return buffer;
}

class StreamHandle {
 public:
  StreamHandle() {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  ~StreamHandle() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class EventPair {
 public:
  EventPair() {
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  cudaEvent_t start = nullptr, stop = nullptr;
};

// Random codes of `dtype` (finite values in [-2, 2); int8 codes in
// [-127, 127]), `bytes` of them, from a fixed seed.
std::vector<std::uint8_t> random_codes(DType dtype, std::size_t bytes, std::uint64_t seed) {
  std::vector<std::uint8_t> codes(bytes);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const std::size_t count = bytes / dtype_size(dtype);
  const float code_scale = dtype == DType::kINT8 ? 63.5f : 1.0f;
  for (std::size_t i = 0; i < count; ++i)
    store_from_float(codes.data(), dtype, i, code_scale * value(rng));
  return codes;
}

// Fills `bytes` at device address `dst` with copies of `pattern` (one upload,
// then doubling device-to-device copies).
void fill_device(void* dst, std::size_t bytes, const std::vector<std::uint8_t>& pattern) {
  auto* out = static_cast<std::byte*>(dst);
  std::size_t filled = std::min(bytes, pattern.size());
  if (filled == 0) return;
  check_cuda(cudaMemcpy(out, pattern.data(), filled, cudaMemcpyHostToDevice), "fill upload");
  while (filled < bytes) {
    const std::size_t n = std::min(filled, bytes - filled);
    check_cuda(cudaMemcpy(out + filled, out, n, cudaMemcpyDeviceToDevice), "fill copy");
    filled += n;
  }
}

DeviceBuffer random_device_buffer(DType dtype, std::size_t bytes, std::uint64_t seed) {
  DeviceBuffer buffer(bytes);
  fill_device(buffer.get(), bytes, random_codes(dtype, std::min(bytes, kPatternBytes), seed));
  return buffer;
}

// --- timing ------------------------------------------------------------------

struct TimingConfig {
  int warmup_calls = 3;
  int single_calls = 3;
  int min_samples = 10;
  double min_total_ms = 20.0;
  double min_sample_ms = 1.0;
  int max_samples = 200;
  int max_calls_per_sample = 1000;
};

struct Timing {
  double ms = kNaN;         // median over samples of a sample's time per call
  double single_ms = kNaN;  // median time of one call alone on an idle stream
  int samples = 0;
  int calls_per_sample = 0;
};

double median(std::vector<double> values) {
  if (values.empty()) return kNaN;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Times `call(i)` (i: the running call index, for rotating through copies)
// enqueued on `stream`. An asynchronous fault of the calls surfaces at the
// event synchronisation and throws.
Timing time_calls(const std::function<void(std::int64_t)>& call, cudaStream_t stream,
                  const TimingConfig& config) {
  EventPair events;
  std::int64_t index = 0;
  for (int i = 0; i < config.warmup_calls; ++i) call(index++);
  check_cuda(cudaStreamSynchronize(stream), "synchronising after the warm-up calls");
  const auto sample = [&](int calls) {
    check_cuda(cudaEventRecord(events.start, stream), "cudaEventRecord");
    for (int i = 0; i < calls; ++i) call(index++);
    check_cuda(cudaEventRecord(events.stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(events.stop), "synchronising on the timed calls");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, events.start, events.stop), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  };
  Timing timing;
  std::vector<double> singles;
  for (int i = 0; i < config.single_calls; ++i) singles.push_back(sample(1));
  timing.single_ms = median(singles);
  const double calls = std::ceil(config.min_sample_ms / std::max(timing.single_ms, 1e-3));
  timing.calls_per_sample =
      static_cast<int>(std::clamp(calls, 1.0, static_cast<double>(config.max_calls_per_sample)));
  std::vector<double> per_call;
  double total_ms = 0.0;
  while (
      (static_cast<int>(per_call.size()) < config.min_samples || total_ms < config.min_total_ms) &&
      static_cast<int>(per_call.size()) < config.max_samples) {
    const double ms = sample(timing.calls_per_sample);
    total_ms += ms;
    per_call.push_back(ms / timing.calls_per_sample);
  }
  timing.samples = static_cast<int>(per_call.size());
  timing.ms = median(per_call);
  return timing;
}

// --- results -----------------------------------------------------------------

struct Result {
  std::string name;
  std::string baseline;  // the case whose time gives the speed-up (its ms / ms), or ""
  double ms = kNaN;
  double single_ms = kNaN;
  double bytes = 0.0;  // bytes moved per call (0: not a bandwidth case)
  double flops = 0.0;  // FLOPs per call (0: not counted)
  std::vector<std::pair<std::string, std::string>> fields;  // more key=value, in order
  std::string error;

  void add(const std::string& key, const std::string& value) { fields.emplace_back(key, value); }
  void add(const std::string& key, double value) {
    char text[64];
    const bool integral = value == std::floor(value) && std::fabs(value) < 1e15;
    std::snprintf(text, sizeof text, integral ? "%.0f" : "%.6g", value);
    add(key, std::string(text));
  }
  void add_timing(const Timing& timing) {
    ms = timing.ms;
    single_ms = timing.single_ms;
    add("samples", timing.samples);
    add("calls_per_sample", timing.calls_per_sample);
  }
};

// --- the copy probe ----------------------------------------------------------

void run_copy_probe(const TimingConfig& config, Result& result) {
  constexpr std::size_t kBytes = 2 * kGiB;
  DeviceBuffer src(kBytes), dst(kBytes);
  check_cuda(cudaMemset(src.get(), 1, kBytes), "cudaMemset");
  dst.zero();
  StreamHandle stream;
  const auto call = [&](std::int64_t) {
    check_cuda(
        cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, stream.get()),
        "cudaMemcpyAsync (device to device)");
  };
  result.add_timing(time_calls(call, stream.get(), config));
  result.bytes = 2.0 * kBytes;  // read + written
}

// --- attention ---------------------------------------------------------------

struct AttentionSpec {
  DType kv_dtype = DType::kBF16;
  KVLayout layout = KVLayout::kNHD;
  std::int32_t batch = 1, q_len = 1, kv_len = 0;
  std::int32_t qo_heads = 32, kv_heads = 8, head_dim = 128, v_head_dim = 128;
  bool latent = false;         // MLA: PagedKVStorage::latent (one KV head, V inside K's rows)
  bool e4m3_nan_flags = true;  // e4m3: page_may_hold_nan kept (all clear), as PagedKVCache does
};

bool is_decode(const AttentionSpec& spec) {
  return spec.q_len == 1;
}

// K/V bytes one call reads once: keys x KV heads x (head_dim + v_head_dim)
// elements (MLA: the head_dim-wide latent rows alone), plus int8 token scales.
double kv_bytes(const AttentionSpec& spec) {
  const double keys = static_cast<double>(spec.batch) * spec.kv_len;
  const double row = spec.latent ? spec.head_dim : spec.head_dim + spec.v_head_dim;
  double bytes = keys * spec.kv_heads * row * static_cast<double>(dtype_size(spec.kv_dtype));
  if (spec.kv_dtype == DType::kINT8)
    bytes += keys * spec.kv_heads * (spec.latent ? 1 : 2) * sizeof(float);
  return bytes;
}

// FLOPs = 2 * qo_heads * (head_dim + v_head_dim) * pairs per sequence, pairs
// = kv_len for decode and q_len * kv_len - q_len^2 / 2 for causal prefill
// (FlashAttention's convention; at q_len = kv_len and head_dim = v_head_dim
// it is 4 * q_len * kv_len * heads * head_dim / 2).
double attention_flops(const AttentionSpec& spec) {
  const double q = spec.q_len, kv = spec.kv_len;
  const double pairs = is_decode(spec) ? kv : q * kv - q * q / 2.0;
  return 2.0 * spec.qo_heads * (spec.head_dim + spec.v_head_dim) * pairs * spec.batch;
}

// One replica's page table: host arrays (for the plan) and their device copies.
struct TableCopy {
  std::vector<std::int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_lens;
  DeviceBuffer d_qo_indptr, d_kv_indptr, d_kv_indices, d_kv_last_page_len, d_kv_lens;

  TableCopy(const AttentionSpec& spec, std::span<const std::int32_t> pages) {
    const std::int32_t pages_per_seq = (spec.kv_len + kPageSize - 1) / kPageSize;
    const std::int32_t last = spec.kv_len - (pages_per_seq - 1) * kPageSize;
    for (std::int32_t b = 0; b <= spec.batch; ++b) {
      qo_indptr.push_back(b * spec.q_len);
      kv_indptr.push_back(b * pages_per_seq);
    }
    kv_indices.assign(pages.begin(), pages.end());
    kv_last_page_len.assign(spec.batch, pages_per_seq > 0 ? last : 0);
    kv_lens.assign(spec.batch, spec.kv_len);
    d_qo_indptr = upload(qo_indptr);
    d_kv_indptr = upload(kv_indptr);
    d_kv_indices = upload(kv_indices);
    d_kv_last_page_len = upload(kv_last_page_len);
    d_kv_lens = upload(kv_lens);
  }

  PagedKVTable host_table(std::int32_t batch) const {
    return table(batch, qo_indptr.data(), kv_indptr.data(), kv_indices.data(),
                 kv_last_page_len.data(), kv_lens.data());
  }
  PagedKVTable device_table(std::int32_t batch) const {
    return table(batch, d_qo_indptr.as<std::int32_t>(), d_kv_indptr.as<std::int32_t>(),
                 d_kv_indices.as<std::int32_t>(), d_kv_last_page_len.as<std::int32_t>(),
                 d_kv_lens.as<std::int32_t>());
  }

 private:
  static PagedKVTable table(std::int32_t batch, const std::int32_t* qo_indptr,
                            const std::int32_t* kv_indptr, const std::int32_t* kv_indices,
                            const std::int32_t* kv_last_page_len, const std::int32_t* kv_lens) {
    PagedKVTable t;
    t.batch_size = batch;
    t.page_size = kPageSize;
    t.qo_indptr = qo_indptr;
    t.kv_indptr = kv_indptr;
    t.kv_indices = kv_indices;
    t.kv_last_page_len = kv_last_page_len;
    t.kv_lens = kv_lens;
    return t;
  }
};

// The pages of `spec` (num_pages of them) with random codes, and the scale
// and flag arrays its dtype needs, all device memory.
struct KVPool {
  DeviceBuffer k, v, k_scales, v_scales, nan_flags;
  PagedKVStorage storage;

  KVPool(const AttentionSpec& spec, std::int64_t num_pages) {
    const auto elem = static_cast<std::int64_t>(dtype_size(spec.kv_dtype));
    const std::int64_t slots = num_pages * kPageSize;
    k = random_device_buffer(spec.kv_dtype, slots * spec.kv_heads * spec.head_dim * elem, kSeed);
    if (spec.latent) {
      storage = PagedKVStorage::latent(k.get(), spec.kv_dtype, spec.layout, kPageSize,
                                       spec.head_dim, spec.v_head_dim, num_pages);
    } else {
      v = random_device_buffer(spec.kv_dtype, slots * spec.kv_heads * spec.v_head_dim * elem,
                               kSeed + 1);
      storage = PagedKVStorage::dense(k.get(), v.get(), spec.kv_dtype, spec.layout, kPageSize,
                                      spec.kv_heads, spec.head_dim, spec.v_head_dim, num_pages);
    }
    if (spec.kv_dtype == DType::kINT8) {
      const std::vector<float> scales(slots * spec.kv_heads, 1.0f / 127.0f);
      k_scales = upload(scales);
      storage.k_token_scales = k_scales.as<float>();
      if (!spec.latent) {
        v_scales = upload(scales);
        storage.v_token_scales = v_scales.as<float>();
      }
    }
    if (spec.kv_dtype == DType::kFP8E4M3 && spec.e4m3_nan_flags) {
      nan_flags = DeviceBuffer(num_pages);
      nan_flags.zero();
      storage.page_may_hold_nan = nan_flags.as<std::uint8_t>();
    }
    if (spec.latent) storage.share_k_scales_with_v();
  }
};

// How many bf16 elements of `buffer` are not finite (a correct kernel
// writes none for these inputs).
std::int64_t count_nonfinite_bf16(const DeviceBuffer& buffer) {
  std::vector<std::uint16_t> host(buffer.bytes() / sizeof(std::uint16_t));
  check_cuda(cudaMemcpy(host.data(), buffer.get(), host.size() * sizeof(std::uint16_t),
                        cudaMemcpyDeviceToHost),
             "cudaMemcpy (output download)");
  return std::count_if(host.begin(), host.end(),
                       [](std::uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u; });
}

void run_attention(const AttentionSpec& spec, const TimingConfig& config, Result& result) {
  const std::int32_t pages_per_seq = (spec.kv_len + kPageSize - 1) / kPageSize;
  const std::int64_t pages_per_copy = static_cast<std::int64_t>(spec.batch) * pages_per_seq;
  const double bytes = kv_bytes(spec);
  const int copies =
      is_decode(spec)
          ? static_cast<int>(std::clamp(std::ceil(kMinRotatedBytes / std::max(bytes, 1.0)), 1.0,
                                        static_cast<double>(kMaxCopies)))
          : 1;
  const std::int64_t num_pages = pages_per_copy * copies;
  KVPool pool(spec, num_pages);

  // Shuffled pages: replica c uses pages[c * pages_per_copy, (c + 1) * pages_per_copy).
  std::vector<std::int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937_64(kSeed + 2));

  const std::int64_t tokens = static_cast<std::int64_t>(spec.batch) * spec.q_len;
  const std::size_t q_bytes = tokens * spec.qo_heads * spec.head_dim * sizeof(std::uint16_t);
  DeviceBuffer q = random_device_buffer(DType::kBF16, q_bytes, kSeed + 3);
  DeviceBuffer o(tokens * spec.qo_heads * spec.v_head_dim * sizeof(std::uint16_t));
  o.zero();

  AttentionParams base;
  base.q = HeadTensor{.data = q.get(),
                      .dtype = DType::kBF16,
                      .token_stride = static_cast<std::int64_t>(spec.qo_heads) * spec.head_dim,
                      .head_stride = spec.head_dim};
  base.o = HeadTensor{.data = o.get(),
                      .dtype = DType::kBF16,
                      .token_stride = static_cast<std::int64_t>(spec.qo_heads) * spec.v_head_dim,
                      .head_stride = spec.v_head_dim};
  base.num_qo_heads = spec.qo_heads;
  base.kv = pool.storage;
  base.options.causal = true;

  std::vector<TableCopy> tables;
  std::vector<cuda::CudaAttentionPlan> plans;
  std::vector<AttentionParams> params;
  tables.reserve(copies);
  double plan_us = 0.0;
  for (int c = 0; c < copies; ++c) {
    tables.emplace_back(spec, std::span<const std::int32_t>(pages).subspan(
                                  static_cast<std::size_t>(c * pages_per_copy), pages_per_copy));
    AttentionParams host_view = base;
    host_view.table = tables.back().host_table(spec.batch);
    const auto plan_start = std::chrono::steady_clock::now();
    plans.push_back(cuda::plan_cuda_attention(host_view));
    if (c == 0)
      plan_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - plan_start)
              .count();
    params.push_back(base);
    params.back().table = tables.back().device_table(spec.batch);
  }
  std::size_t workspace_bytes = 0;
  for (const auto& plan : plans) workspace_bytes = std::max(workspace_bytes, plan.workspace_bytes);
  DeviceBuffer workspace(std::max<std::size_t>(workspace_bytes, 256));  // cudaMalloc: 256-aligned

  StreamHandle stream;
  const auto call = [&](std::int64_t i) {
    const auto c = static_cast<std::size_t>(i % copies);
    cuda::cuda_paged_attention(params[c], plans[c], workspace.get(), stream.get());
  };
  result.add_timing(time_calls(call, stream.get(), config));
  result.bytes = is_decode(spec) ? bytes : 0.0;
  result.flops = attention_flops(spec);
  const cuda::CudaAttentionPlan& plan = plans.front();
  result.add("decode_items", static_cast<double>(plan.decode_items.size()));
  result.add("prefill_items", static_cast<double>(plan.prefill_items.size()));
  result.add("merges", static_cast<double>(plan.merges.size()));
  result.add("partials", plan.num_partials);
  result.add("workspace_bytes", static_cast<double>(workspace_bytes));
  result.add("plan_us", plan_us);
  result.add("copies", copies);
  result.add("nonfinite_out", static_cast<double>(count_nonfinite_bf16(o)));
}

// --- append (reshape_and_cache) ----------------------------------------------

void run_append(const TimingConfig& config, Result& result) {
  constexpr std::int32_t kTokens = 65536, kHeads = 8, kDim = 128;
  // Twice the slots the tokens need, so the slot mapping scatters over the pool.
  constexpr std::int64_t kNumPages = 2 * kTokens / kPageSize;
  constexpr std::size_t kRowBytes = std::size_t{kHeads} * kDim * sizeof(std::uint16_t);
  DeviceBuffer k_in = random_device_buffer(DType::kBF16, kTokens * kRowBytes, kSeed);
  DeviceBuffer v_in = random_device_buffer(DType::kBF16, kTokens * kRowBytes, kSeed + 1);
  DeviceBuffer k_pages(kNumPages * kPageSize * kRowBytes),
      v_pages(kNumPages * kPageSize * kRowBytes);
  k_pages.zero();
  v_pages.zero();
  std::vector<std::int64_t> slots(kNumPages * kPageSize);
  std::iota(slots.begin(), slots.end(), std::int64_t{0});
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(kSeed + 2));
  slots.resize(kTokens);
  const DeviceBuffer slot_mapping = upload(slots);

  AppendParams params;
  params.k = HeadTensor{.data = k_in.get(),
                        .dtype = DType::kBF16,
                        .token_stride = kHeads * kDim,
                        .head_stride = kDim};
  params.v = HeadTensor{.data = v_in.get(),
                        .dtype = DType::kBF16,
                        .token_stride = kHeads * kDim,
                        .head_stride = kDim};
  params.slot_mapping = slot_mapping.as<std::int64_t>();
  params.num_tokens = kTokens;
  params.kv = PagedKVStorage::dense(k_pages.get(), v_pages.get(), DType::kBF16, KVLayout::kNHD,
                                    kPageSize, kHeads, kDim, kDim, kNumPages);
  StreamHandle stream;
  const auto call = [&](std::int64_t) { cuda::cuda_append_paged_kv(params, stream.get()); };
  result.add_timing(time_calls(call, stream.get(), config));
  // K and V read from the inputs and written to the pages, and the slot mapping read.
  result.bytes = 2.0 * 2.0 * kTokens * kRowBytes + kTokens * sizeof(std::int64_t);
}

// --- the device --------------------------------------------------------------

// The device's properties; throws where the runtime sees none (the run stops there).
void run_device_info(const TimingConfig&, Result& result) {
  if (cuda::device_count() == 0)
    throw std::runtime_error("no CUDA device: " + cuda::no_device_reason());
  const cuda::DeviceInfo info = cuda::current_device_info();
  int device = 0, l2_bytes = 0, driver = 0, runtime = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "L2 size");
  check_cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  check_cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  result.add("name", info.name);
  result.add("sm_count", info.sm_count);
  result.add("cc", std::to_string(info.major) + "." + std::to_string(info.minor));
  result.add("global_GiB", static_cast<double>(info.global_bytes) / kGiB);
  result.add("l2_MiB", static_cast<double>(l2_bytes) / kMiB);
  result.add("max_shared_KiB", static_cast<double>(info.max_shared_bytes_per_block) / 1024.0);
  result.add("driver", driver);
  result.add("runtime", runtime);
}

// --- the cases ---------------------------------------------------------------

struct Case {
  std::string name;
  std::string baseline;  // the case whose time gives the speed-up, or ""
  std::function<void(const TimingConfig&, Result&)> run;
};

const char* short_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8";
    case DType::kINT8:
      return "int8";
    default:
      return "other";
  }
}

std::string decode_name(const AttentionSpec& spec, const char* variant = "") {
  return std::string("decode_") + short_name(spec.kv_dtype) + variant + "_" +
         (spec.layout == KVLayout::kNHD ? "nhd" : "hnd") + "_b" + std::to_string(spec.batch) +
         "_k" + std::to_string(spec.kv_len);
}

Case attention_case(std::string name, std::string baseline, const AttentionSpec& spec) {
  return Case{
      std::move(name), std::move(baseline),
      [spec](const TimingConfig& config, Result& result) { run_attention(spec, config, result); }};
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  struct DecodeShape {
    std::int32_t batch, kv_len;
  };
  constexpr DecodeShape kDecodeShapes[] = {{8, 16384}, {64, 8192}, {256, 4096}};
  const auto decode_spec = [](DType dtype, KVLayout layout, DecodeShape shape) {
    AttentionSpec spec;
    spec.kv_dtype = dtype;
    spec.layout = layout;
    spec.batch = shape.batch;
    spec.kv_len = shape.kv_len;
    return spec;
  };
  for (const DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kINT8}) {
    for (const DecodeShape shape : kDecodeShapes) {
      const AttentionSpec spec = decode_spec(dtype, KVLayout::kNHD, shape);
      const std::string baseline =
          dtype == DType::kBF16 ? ""
                                : decode_name(decode_spec(DType::kBF16, KVLayout::kNHD, shape));
      cases.push_back(attention_case(decode_name(spec), baseline, spec));
    }
  }
  const DecodeShape middle = kDecodeShapes[1];
  {
    const AttentionSpec hnd = decode_spec(DType::kBF16, KVLayout::kHND, middle);
    cases.push_back(attention_case(
        decode_name(hnd), decode_name(decode_spec(DType::kBF16, KVLayout::kNHD, middle)), hnd));
    // e4m3 without page_may_hold_nan (the kernel scans blocks for NaN codes).
    AttentionSpec no_flags = decode_spec(DType::kFP8E4M3, KVLayout::kNHD, middle);
    no_flags.e4m3_nan_flags = false;
    cases.push_back(attention_case(
        decode_name(no_flags, "noflags"),
        decode_name(decode_spec(DType::kFP8E4M3, KVLayout::kNHD, middle)), no_flags));
  }
  const auto prefill_spec = [](std::int32_t kv_heads, std::int32_t batch, std::int32_t len) {
    AttentionSpec spec;
    spec.kv_heads = kv_heads;
    spec.batch = batch;
    spec.q_len = len;
    spec.kv_len = len;
    return spec;
  };
  cases.push_back(attention_case("prefill_bf16_gqa32x8_b1_q4096", "", prefill_spec(8, 1, 4096)));
  cases.push_back(attention_case("prefill_bf16_mha32_b1_q4096", "", prefill_spec(32, 1, 4096)));
  cases.push_back(attention_case("prefill_bf16_gqa32x8_b8_q1024", "", prefill_spec(8, 8, 1024)));
  cases.push_back(Case{"append_bf16_nhd_t65536", "", run_append});
  AttentionSpec mla;
  mla.qo_heads = 16;
  mla.kv_heads = 1;
  mla.head_dim = 576;
  mla.v_head_dim = 512;
  mla.latent = true;
  mla.batch = 8;
  mla.kv_len = 8192;
  cases.push_back(attention_case("mla_decode_bf16_b8_k8192", "", mla));
  return cases;
}

// --- running a case in a child process ---------------------------------------

std::string one_line(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\t'; }, ' ');
  return text;
}

std::string number_text(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

// "key\tvalue\n" lines; fields as "field.<key>".
std::string serialize(const Result& r) {
  std::string out = "name\t" + one_line(r.name) + "\nbaseline\t" + one_line(r.baseline) + "\nms\t" +
                    number_text(r.ms) + "\nsingle_ms\t" + number_text(r.single_ms) + "\nbytes\t" +
                    number_text(r.bytes) + "\nflops\t" + number_text(r.flops) + "\nerror\t" +
                    one_line(r.error) + "\n";
  for (const auto& [key, value] : r.fields)
    out += "field." + one_line(key) + "\t" + one_line(value) + "\n";
  return out;
}

Result deserialize(const std::string& text) {
  Result r;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    const std::string key = line.substr(0, tab), value = line.substr(tab + 1);
    const auto number = [&] { return std::strtod(value.c_str(), nullptr); };
    if (key == "name")
      r.name = value;
    else if (key == "baseline")
      r.baseline = value;
    else if (key == "ms")
      r.ms = number();
    else if (key == "single_ms")
      r.single_ms = number();
    else if (key == "bytes")
      r.bytes = number();
    else if (key == "flops")
      r.flops = number();
    else if (key == "error")
      r.error = value;
    else if (key.rfind("field.", 0) == 0)
      r.add(key.substr(6), value);
  }
  return r;
}

Result run_in_process(const Case& c, const TimingConfig& config) {
  Result result;
  result.name = c.name;
  result.baseline = c.baseline;
  try {
    c.run(config, result);
  } catch (const std::exception& e) {
    result.error = e.what();
  } catch (...) {
    result.error = "unknown exception";
  }
  return result;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status))
    return "the case's process died of signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  if (WIFEXITED(status))
    return "the case's process exited with status " + std::to_string(WEXITSTATUS(status)) +
           " without a result";
  return "the case's process ended without a result";
}

// Runs `c` in a forked child that reports through a pipe; the parent kills
// it past `timeout_s`.
Result run_isolated(const Case& c, const TimingConfig& config, double timeout_s) {
  Result failed;
  failed.name = c.name;
  failed.baseline = c.baseline;
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  if (pipe(fds) != 0) {
    failed.error = std::string("pipe: ") + std::strerror(errno);
    return failed;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    failed.error = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return failed;
  }
  if (pid == 0) {
    close(fds[0]);
    write_all(fds[1], serialize(run_in_process(c, config)));
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child wrote its result (or died)
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  // The child has closed its end; it should be gone within the deadline too.
  int status = 0;
  for (;;) {
    const pid_t waited = waitpid(pid, &status, timed_out ? 0 : WNOHANG);
    if (waited == pid || (waited < 0 && errno != EINTR)) break;
    if (waited == 0 && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      kill(pid, SIGKILL);
      continue;
    }
    if (waited == 0) usleep(10000);
  }
  if (timed_out) {
    failed.error = "timed out after " + fixed(timeout_s, 1) + " s (killed)";
    return failed;
  }
  Result result = deserialize(text);
  if (result.name.empty()) {
    failed.error = describe_exit(status);
    return failed;
  }
  return result;
}

// Keeps the driver initialised across the cases' processes, as persistence
// mode would: a child that opens a CUDA context and waits for the parent to
// close its pipe (or to die). Without it, a GPU left without a process may
// be torn down and set up again for every case.
class DriverKeeper {
 public:
  DriverKeeper() {
    int fds[2];
    if (pipe(fds) != 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[1]);
      cudaFree(nullptr);
      char byte;
      while (read(fds[0], &byte, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    close(fds[0]);
    if (pid_ < 0) {
      close(fds[1]);
      return;
    }
    write_end_ = fds[1];
  }
  DriverKeeper(const DriverKeeper&) = delete;
  DriverKeeper& operator=(const DriverKeeper&) = delete;
  ~DriverKeeper() {
    if (write_end_ < 0) return;
    close(write_end_);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }

 private:
  pid_t pid_ = -1;
  int write_end_ = -1;
};

// --- output ------------------------------------------------------------------

std::string quoted(const std::string& text, bool json) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += json ? "\\u0020" : " ";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A value as printed after key=: quoted where it holds a space or a quote.
std::string field_text(const std::string& value) {
  return value.find_first_of(" \"") == std::string::npos ? value : quoted(value, false);
}

// A field value as JSON: a number where the whole text is a finite one.
std::string json_value(const std::string& value) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (!value.empty() && end == value.c_str() + value.size() && std::isfinite(number)) return value;
  return quoted(value, true);
}

std::string json_number(double value) {
  return std::isfinite(value) ? number_text(value) : "null";
}

struct Derived {
  double gbps = kNaN, tflops = kNaN, frac_copy = kNaN, speedup = kNaN;
};

Derived derive(const Result& r, double copy_gbps, const std::map<std::string, Result>& done) {
  Derived d;
  const double seconds = r.ms * 1e-3;
  if (r.bytes > 0 && seconds > 0) d.gbps = r.bytes / seconds / 1e9;
  if (r.flops > 0 && seconds > 0) d.tflops = r.flops / seconds / 1e12;
  if (std::isfinite(d.gbps) && copy_gbps > 0) d.frac_copy = d.gbps / copy_gbps;
  const auto base = done.find(r.baseline);
  if (!r.baseline.empty() && base != done.end() && base->second.error.empty() && r.ms > 0)
    d.speedup = base->second.ms / r.ms;
  return d;
}

std::string text_line(const Result& r, const Derived& d) {
  if (!r.error.empty()) return "case=" + r.name + " error=" + quoted(r.error, false);
  std::string line = "case=" + r.name + " ms=" + fixed(r.ms, 4) + " GBps=" + fixed(d.gbps, 1) +
                     " TFLOPs=" + fixed(d.tflops, 3) + " frac_copy=" + fixed(d.frac_copy, 3);
  if (!r.baseline.empty()) line += " vs=" + r.baseline + " speedup=" + fixed(d.speedup, 3);
  line += " single_ms=" + fixed(r.single_ms, 4);
  for (const auto& [key, value] : r.fields) line += " " + key + "=" + field_text(value);
  return line;
}

std::string json_line(const Result& r, const Derived& d) {
  std::string line = "{\"case\":" + quoted(r.name, true);
  if (!r.error.empty()) return line + ",\"error\":" + quoted(r.error, true) + "}";
  line += ",\"ms\":" + json_number(r.ms) + ",\"GBps\":" + json_number(d.gbps) +
          ",\"TFLOPs\":" + json_number(d.tflops) + ",\"frac_copy\":" + json_number(d.frac_copy) +
          ",\"single_ms\":" + json_number(r.single_ms) + ",\"bytes\":" + json_number(r.bytes) +
          ",\"flops\":" + json_number(r.flops);
  if (!r.baseline.empty())
    line += ",\"vs\":" + quoted(r.baseline, true) + ",\"speedup\":" + json_number(d.speedup);
  for (const auto& [key, value] : r.fields)
    line += "," + quoted(key, true) + ":" + json_value(value);
  return line + "}";
}

constexpr const char* kNotes[] = {
    "# pagedattn CUDA benchmark: each case in its own process; ms = median over samples of "
    "back-to-back calls timed with CUDA events (warm-up 3)",
    "# attention cases time cuda_paged_attention alone (plan_cuda_attention made once before); "
    "each call includes its host-to-device copy of the plan's work items to the workspace",
    "# GBps = bytes / s / 1e9. bytes: copy = 2 GiB read + 2 GiB written; decode = K+V read once "
    "= keys x kv_heads x (head_dim + v_head_dim) x element bytes (+ int8 token scales); MLA = "
    "keys x head_dim x 2 (the latent rows once); append = K+V read + written + slot mapping",
    "# TFLOPs: FLOPs = 2 * qo_heads * (head_dim + v_head_dim) * pairs per sequence; pairs = "
    "kv_len for decode, q_len * kv_len - q_len^2 / 2 for causal prefill (FlashAttention's "
    "convention: 4 * q * kv * heads * d / 2)",
    "# frac_copy = GBps / the copy probe's GBps; speedup = (the vs case's ms) / ms; "
    "nonfinite_out = non-finite output elements after the run (0 expected)",
};

// --- main --------------------------------------------------------------------

struct Options {
  bool quick = false;
  bool fork = true;
  std::string json_path;
  std::string filter;
  double timeout_s = 20.0;
  double budget_s = 75.0;
};

[[noreturn]] void usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--json FILE] [--filter SUBSTR] [--timeout S] [--budget S] "
               "[--no-fork]\n",
               program);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (arg == "--quick")
      options.quick = true;
    else if (arg == "--no-fork")
      options.fork = false;
    else if (arg == "--json")
      options.json_path = value();
    else if (arg == "--filter")
      options.filter = value();
    else if (arg == "--timeout")
      options.timeout_s = std::atof(value().c_str());
    else if (arg == "--budget")
      options.budget_s = std::atof(value().c_str());
    else
      usage(argv[0]);
  }
  return options;
}

int run_benchmark(const Options& options) {
  const auto start = std::chrono::steady_clock::now();
  TimingConfig config;
  if (options.quick) {
    config.min_samples = 5;
    config.min_total_ms = 5.0;
    config.min_sample_ms = 0.5;
  }
  std::ofstream json;
  if (!options.json_path.empty()) {
    json.open(options.json_path);
    if (!json)
      std::fprintf(stderr, "cannot write %s; JSON output off\n", options.json_path.c_str());
  }
  for (const char* note : kNotes) std::printf("%s\n", note);

  // A case started late in the budget gets at most 10 s past it.
  const auto run = [&](const Case& c) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double timeout_s = std::min(options.timeout_s, options.budget_s + 10.0 - elapsed);
    return options.fork ? run_isolated(c, config, timeout_s) : run_in_process(c, config);
  };
  const Result device = run(Case{"device", "", run_device_info});
  if (!device.error.empty()) {
    std::printf("# no usable CUDA device: %s\n", device.error.c_str());
    if (json) json << "{\"device\":null,\"error\":" << quoted(device.error, true) << "}\n";
    return 0;
  }
  std::string device_line = "device";
  std::string device_json = "{\"case\":\"device\"";
  for (const auto& [key, value] : device.fields) {
    device_line += " " + key + "=" + field_text(value);
    device_json += "," + quoted(key, true) + ":" + json_value(value);
  }
  std::printf("%s\n", device_line.c_str());
  if (json) json << device_json << "}\n" << std::flush;

  std::optional<DriverKeeper> keeper;
  if (options.fork) keeper.emplace();
  std::vector<Case> cases = make_cases();
  cases.insert(cases.begin(), Case{"copy_d2d_2GiB", "", run_copy_probe});
  std::map<std::string, Result> done;
  double copy_gbps = kNaN;
  int failed = 0, skipped = 0;
  for (const Case& c : cases) {
    const bool is_copy = c.name == cases.front().name;
    if (!is_copy && c.name.find(options.filter) == std::string::npos) continue;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > options.budget_s) {
      std::printf("case=%s skipped=\"time budget of %.0f s spent\"\n", c.name.c_str(),
                  options.budget_s);
      ++skipped;
      continue;
    }
    const Result result = run(c);
    if (is_copy && result.error.empty()) copy_gbps = derive(result, kNaN, done).gbps;
    const Derived derived = derive(result, copy_gbps, done);
    if (!result.error.empty()) ++failed;
    std::printf("%s\n", text_line(result, derived).c_str());
    std::fflush(stdout);
    if (json) json << json_line(result, derived) << "\n" << std::flush;
    done[result.name] = result;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("summary cases=%zu failed=%d skipped=%d seconds=%.1f\n", done.size(), failed, skipped,
              elapsed);
  return 0;
}

}  // namespace
}  // namespace pagedattn

int main(int argc, char** argv) {
  return pagedattn::run_benchmark(pagedattn::parse_options(argc, argv));
}
