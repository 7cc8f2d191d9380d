// Device storage checked without a GPU: random operation sequences run on a
// CPU cache and on a device cache over HostDeviceBackend (host memory behind
// the KVDeviceBackend interface, the CPU kernels), which must agree on
// everything - attention outputs and LSE bit for bit (the same kernels over
// the same bytes), state_digest() after every operation, debug_get_kv reads
// and every refusal. The backend keeps its memory inaccessible outside its
// own calls, so the device cache can only have moved its bytes through it;
// its counters show which kinds of movement each setup exercised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_device.h"
#include "support/expect_error.h"
#include "support/host_device_backend.h"
#include "support/random_floats.h"

namespace pagedattn::test {
namespace {

struct DeviceSetup {
  const char* name;
  KVCacheConfig config;
  DType activations = DType::kF32;
};

void PrintTo(const DeviceSetup& setup, std::ostream* os) {
  *os << setup.name;
}

KVCacheConfig config_of(DType kv_dtype, KVLayout layout, std::int32_t page_size) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.v_head_dim = 6;
  c.page_size = page_size;
  c.num_pages = 24;
  c.kv_dtype = kv_dtype;
  c.layout = layout;
  c.enable_prefix_caching = true;
  c.host_num_pages = 10;
  c.support_sliding_window = true;
  return c;
}

std::vector<DeviceSetup> setups() {
  std::vector<DeviceSetup> s;
  s.push_back({"f16_hnd", config_of(DType::kF16, KVLayout::kHND, 4)});
  {
    KVCacheConfig c = config_of(DType::kBF16, KVLayout::kNHD, 3);
    c.rope_mode = RopeMode::kNormal;
    c.rope.rotary_dim = 6;
    s.push_back({"bf16_nhd_rope", c});
  }
  {
    KVCacheConfig c = config_of(DType::kFP8E4M3, KVLayout::kHND, 4);
    c.k_head_scales = {0.5f, 0.25f};
    c.v_head_scales = {0.125f, 1.0f};
    s.push_back({"e4m3_head_scales", c});
  }
  {
    KVCacheConfig c = config_of(DType::kINT8, KVLayout::kNHD, 5);
    c.rope_mode = RopeMode::kNormal;
    c.rope.style = RopeStyle::kGptJ;
    s.push_back({"int8_nhd_rope", c});
  }
  s.push_back({"f32_f16_activations", config_of(DType::kF32, KVLayout::kHND, 2), DType::kF16});
  {
    KVCacheConfig c = config_of(DType::kF16, KVLayout::kHND, 4);
    c.attention_kind = AttentionKind::kMLA;
    c.num_kv_heads = 1;
    c.head_dim = 10;
    c.v_head_dim = 8;
    s.push_back({"mla_f16", c});
  }
  {
    KVCacheConfig c = config_of(DType::kFP8E5M2, KVLayout::kNHD, 1);
    c.attention_plan.fixed_kv_chunk = 4;  // split KV: partial states and merges
    s.push_back({"e5m2_page1_split", c});
  }
  return s;
}

// Backend memory holding `bytes` bytes, released on destruction.
class DeviceBytes {
 public:
  DeviceBytes(KVDeviceBackend& backend, std::size_t bytes)
      : backend_(backend), bytes_(std::max<std::size_t>(bytes, 1)) {
    data_ = backend_.allocate_zeroed(bytes_);
  }
  DeviceBytes(KVDeviceBackend& backend, const std::vector<std::byte>& host)
      : DeviceBytes(backend, host.size()) {
    if (!host.empty()) backend_.from_host(data_, host.data(), host.size());
  }
  ~DeviceBytes() { backend_.release(data_, bytes_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return data_; }
  std::vector<std::byte> download(std::size_t bytes) const {
    std::vector<std::byte> host(bytes);
    if (bytes > 0) backend_.to_host(host.data(), data_, bytes);
    return host;
  }

 private:
  KVDeviceBackend& backend_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

// What a call threw ("" when it returned).
template <class Call>
std::string outcome(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return detail::concat(error_code_name(e.code()), ": ", e.what());
  }
  return {};
}

// What the episodes of a setup exercised (successful calls), summed.
struct DeviceCoverage {
  std::int64_t attended_rows = 0, tree_steps = 0, cancels = 0, forks = 0, swaps = 0;
  std::int64_t prefix_hit_tokens = 0, reads = 0, writes = 0, commits = 0, windows = 0;
};

class Twins {
 public:
  Twins(const DeviceSetup& setup, std::shared_ptr<HostDeviceBackend> backend, std::uint64_t seed,
        DeviceCoverage& coverage)
      : coverage_(coverage),
        backend_(std::move(backend)),
        cpu_(setup.config),
        dev_(device_config(setup.config), backend_),
        activations_(setup.activations),
        rng_(seed) {}

  void run(int ops) {
    for (int i = 0; i < ops && !::testing::Test::HasFailure(); ++i) random_op();
    if (::testing::Test::HasFailure()) ADD_FAILURE() << "operation log:\n" << log_.str();
  }

 private:
  static KVCacheConfig device_config(KVCacheConfig c) {
    c.device = KVDevice::kCuda;
    return c;
  }

  // Runs `call` on both caches: the same outcome and the same state after.
  template <class Call>
  bool both(Call&& call) {
    const std::string cpu = outcome([&] { call(cpu_); });
    const std::string dev = outcome([&] { call(dev_); });
    EXPECT_EQ(cpu, dev);
    EXPECT_EQ(cpu_.state_digest(), dev_.state_digest());
    return cpu.empty() && dev.empty();
  }

  // --- random choices ------------------------------------------------------------
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::vector<SeqId> ids(bool swapped) const {
    std::vector<SeqId> out;
    for (SeqId id : cpu_.sequence_ids())
      if (cpu_.is_swapped(id) == swapped) out.push_back(id);
    return out;
  }
  SeqId pick(const std::vector<SeqId>& from) {
    return from[static_cast<std::size_t>(uniform(0, std::ssize(from) - 1))];
  }
  // Token ids of a sequence's family: forks and prefix hits share them.
  std::vector<std::int32_t> new_family(const std::vector<std::int32_t>* prefix) {
    std::vector<std::int32_t> tokens;
    if (prefix) tokens.assign(prefix->begin(), prefix->begin() + uniform(0, std::ssize(*prefix)));
    while (tokens.size() < 256) tokens.push_back(static_cast<std::int32_t>(uniform(0, 3)));
    return tokens;
  }

  // --- operations ----------------------------------------------------------------
  void random_op() {
    const std::vector<SeqId> live = ids(false);
    const std::int64_t r = uniform(0, 99);
    if (live.empty() || r < 6) return op_add();
    if (r < 14) return op_add_with_prefix();
    if (r < 40) return op_step(live);
    if (r < 46) return op_fork(live);
    if (r < 52) return op_pop(live);
    if (r < 56) return op_remove();
    if (r < 60) return op_window(live);
    if (r < 66) return op_swap(live);
    if (r < 72) return op_commit_trees(live);
    if (r < 78) return op_tell(live);
    if (r < 86) return op_read(live);
    if (r < 92) return op_write(live);
    if (r < 94) return op_reset_prefix_cache();
    return op_step(live);
  }

  void op_add() {
    const SeqId id = next_id_++;
    log_ << "add " << id << "\n";
    family_[id] = new_family(nullptr);
    both([&](PagedKVCache& kv) { kv.add_sequence(id); });
  }

  // A prompt sharing a random prefix with an earlier family, then its step.
  void op_add_with_prefix() {
    const SeqId id = next_id_++;
    const std::vector<std::int32_t>* prefix = nullptr;
    if (!family_.empty() && chance(0.8)) {
      auto it = family_.begin();
      std::advance(it, uniform(0, std::ssize(family_) - 1));
      prefix = &it->second;
    }
    family_[id] = new_family(prefix);
    const std::int64_t length = uniform(1, 4 * cpu_.config().page_size + 2);
    const std::vector<std::int32_t> prompt(family_[id].begin(), family_[id].begin() + length);
    log_ << "add_sequence_with_prefix " << id << " (" << length << " tokens)\n";
    std::int64_t hits[2] = {-1, -1};
    int side = 0;
    if (!both([&](PagedKVCache& kv) { hits[side++] = kv.add_sequence_with_prefix(id, prompt); }))
      return;
    EXPECT_EQ(hits[0], hits[1]);
    coverage_.prefix_hit_tokens += hits[0];
    step({id}, {length - hits[0]}, {});
    both([&](PagedKVCache& kv) { kv.set_sequence_tokens(id, prompt); });
  }

  void op_tell(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t told = uniform(0, cpu_.sequence_length(id));
    log_ << "set_sequence_tokens " << id << " (" << told << ")\n";
    const std::vector<std::int32_t> tokens(family_[id].begin(), family_[id].begin() + told);
    both([&](PagedKVCache& kv) { kv.set_sequence_tokens(id, tokens); });
  }

  void op_fork(const std::vector<SeqId>& live) {
    const SeqId parent = pick(live), child = next_id_++;
    const std::int64_t pos = chance(0.3) ? -1 : uniform(0, cpu_.sequence_length(parent));
    log_ << "fork " << parent << " -> " << child << " at " << pos << "\n";
    family_[child] = family_[parent];
    if (both([&](PagedKVCache& kv) { kv.fork_sequence(parent, child, pos); })) ++coverage_.forks;
  }

  void op_pop(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t n = uniform(0, std::min<std::int64_t>(cpu_.sequence_length(id), 6));
    log_ << "pop_n " << id << " " << n << "\n";
    both([&](PagedKVCache& kv) { kv.pop_n(id, n); });
  }

  void op_remove() {
    const std::vector<SeqId> all = cpu_.sequence_ids();
    if (all.empty()) return;
    const SeqId id = pick(all);
    log_ << "remove " << id << "\n";
    both([&](PagedKVCache& kv) { kv.remove_sequence(id); });
  }

  void op_window(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t window = uniform(1, 12), sink = uniform(0, window - 1);
    log_ << "enable_sliding_window " << id << " " << window << " " << sink << "\n";
    if (both([&](PagedKVCache& kv) { kv.enable_sliding_window(id, window, sink); }))
      ++coverage_.windows;
  }

  void op_swap(const std::vector<SeqId>& live) {
    const std::vector<SeqId> swapped = ids(true);
    if (!swapped.empty() && chance(0.5)) {
      const std::vector<SeqId> one = {pick(swapped)};
      log_ << "swap_in " << one[0] << "\n";
      if (both([&](PagedKVCache& kv) { kv.swap_in(one); })) ++coverage_.swaps;
      return;
    }
    const std::vector<SeqId> one = {pick(live)};
    log_ << "swap_out " << one[0] << "\n";
    if (both([&](PagedKVCache& kv) { kv.swap_out(one); })) ++coverage_.swaps;
  }

  void op_commit_trees(const std::vector<SeqId>& live) {
    std::vector<SeqId> open;
    std::vector<std::int64_t> leaves;
    for (SeqId id : live)
      if (cpu_.has_open_token_tree(id)) {
        open.push_back(id);
        leaves.push_back(uniform(-1, cpu_.token_tree_size(id) - 1));
      }
    if (open.empty()) return op_tree_step(live);
    log_ << "commit " << open.size() << " trees\n";
    if (both([&](PagedKVCache& kv) { kv.commit_accepted_token_tree_nodes(open, leaves); }))
      ++coverage_.commits;
  }

  void op_reset_prefix_cache() {
    log_ << "reset_prefix_cache\n";
    both([&](PagedKVCache& kv) { kv.reset_prefix_cache(); });
  }

  // debug_get_kv of a random range: equal floats from both.
  void op_read(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t len = cpu_.sequence_length(id);
    const std::int64_t start = uniform(0, len), end = uniform(start, len);
    log_ << "debug_get_kv " << id << " [" << start << ", " << end << ")\n";
    const KVCacheConfig& c = cpu_.config();
    const auto rows = static_cast<std::size_t>(c.num_layers * (end - start) * c.num_kv_heads);
    std::vector<float> k[2], v[2];
    int side = 0;
    if (both([&](PagedKVCache& kv) {
          k[side].assign(rows * static_cast<std::size_t>(c.head_dim), -1.0f);
          v[side].assign(rows * static_cast<std::size_t>(c.v_head_dim), -1.0f);
          kv.debug_get_kv(id, start, end, k[side], v[side]);
          ++side;
        }))
      coverage_.reads += end - start;
    // Bitwise (NaNs included); memcmp needs non-null pointers even for 0 bytes.
    if (!k[0].empty()) {
      EXPECT_EQ(0, std::memcmp(k[0].data(), k[1].data(), k[0].size() * sizeof(float)));
    }
    if (!v[0].empty()) {
      EXPECT_EQ(0, std::memcmp(v[0].data(), v[1].data(), v[0].size() * sizeof(float)));
    }
  }

  // debug_set_kv of random values over a random range (refused in shared pages).
  void op_write(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t len = cpu_.sequence_length(id);
    const std::int64_t start = uniform(0, len), end = uniform(start, std::min(len, start + 6));
    log_ << "debug_set_kv " << id << " [" << start << ", " << end << ")\n";
    const KVCacheConfig& c = cpu_.config();
    const auto rows = static_cast<std::size_t>(c.num_layers * (end - start) * c.num_kv_heads);
    std::vector<float> k = random_floats(rows * static_cast<std::size_t>(c.head_dim));
    // Now and then a NaN: e4m3 stores a NaN code, which the CPU cache flags
    // and the device cache (keeping no flags) finds by looking.
    if (!k.empty() && chance(0.1)) k[static_cast<std::size_t>(uniform(0, std::ssize(k) - 1))] = NAN;
    const std::vector<float> v = c.attention_kind == AttentionKind::kMLA
                                     ? std::vector<float>()
                                     : random_floats(rows * static_cast<std::size_t>(c.v_head_dim));
    if (both([&](PagedKVCache& kv) { kv.debug_set_kv(id, start, end, k, v); }))
      coverage_.writes += end - start;
  }

  void op_step(const std::vector<SeqId>& live) {
    std::vector<SeqId> batch = live;
    std::shuffle(batch.begin(), batch.end(), rng_);
    batch.resize(
        static_cast<std::size_t>(uniform(1, std::min<std::int64_t>(4, std::ssize(batch)))));
    std::vector<std::int64_t> lens;
    for (std::size_t i = 0; i < batch.size(); ++i)
      lens.push_back(chance(0.5) ? uniform(0, 1) : uniform(0, 2 * cpu_.config().page_size + 1));
    step(batch, lens, {});
  }

  void op_tree_step(const std::vector<SeqId>& live) {
    const SeqId id = pick(live);
    const std::int64_t nodes = uniform(0, 5), before = cpu_.token_tree_size(id);
    std::vector<std::int64_t> parents;
    for (std::int64_t i = 0; i < nodes; ++i) parents.push_back(uniform(-1, before + i - 1));
    step({id}, {nodes}, parents);
  }

  // A step on both caches: begin_forward (a tree forward when `parents` is
  // given), attention for every layer, then end_forward - or, at random,
  // cancel_forward after some of the layers.
  void step(const std::vector<SeqId>& batch, const std::vector<std::int64_t>& lens,
            const std::vector<std::int64_t>& parents) {
    log_ << "step" << (parents.empty() ? "" : " (tree)");
    for (std::size_t i = 0; i < batch.size(); ++i) log_ << " " << batch[i] << ":+" << lens[i];
    log_ << "\n";
    const bool tree = !parents.empty() || (chance(0.2) && batch.size() == 1 && lens[0] == 0);
    if (!both([&](PagedKVCache& kv) {
          if (tree)
            kv.begin_forward(batch, lens, parents);
          else
            kv.begin_forward(batch, lens);
        }))
      return;
    const bool cancel = chance(0.1);
    const std::int64_t layers = cpu_.config().num_layers;
    const std::int64_t attended = cancel ? uniform(0, layers) : layers;
    for (std::int32_t layer = 0; layer < attended; ++layer) attend(layer, tree);
    coverage_.tree_steps += tree ? 1 : 0;
    if (cancel) {
      log_ << "  cancel_forward\n";
      if (both([](PagedKVCache& kv) { kv.cancel_forward(); })) ++coverage_.cancels;
    } else {
      both([](PagedKVCache& kv) { kv.end_forward(); });
    }
  }

  std::vector<float> random_floats(std::size_t n) {
    NormalFloats normal;
    std::vector<float> values(n);
    for (float& x : values) x = normal(rng_);
    return values;
  }
  // `n` random values in the activation dtype, as bytes.
  std::vector<std::byte> random_activations(std::size_t n) {
    std::vector<std::byte> bytes(n * dtype_size(activations_));
    const std::vector<float> values = random_floats(n);
    for (std::size_t i = 0; i < n; ++i) store_from_float(bytes.data(), activations_, i, values[i]);
    return bytes;
  }

  // One layer's attention with the same inputs on both caches: host
  // buffers for the CPU cache, backend memory for the device cache.
  void attend(std::int32_t layer, bool tree) {
    const KVCacheConfig& c = cpu_.config();
    const bool mla = c.attention_kind == AttentionKind::kMLA;
    const auto tokens = static_cast<std::size_t>(cpu_.num_step_tokens());
    const auto hq = static_cast<std::size_t>(c.num_qo_heads);
    const auto hkv = static_cast<std::size_t>(c.num_kv_heads);
    const auto d = static_cast<std::size_t>(c.head_dim),
               dv = static_cast<std::size_t>(c.v_head_dim);
    const std::size_t es = dtype_size(activations_);
    const std::vector<std::byte> q = random_activations(tokens * hq * d);
    const std::vector<std::byte> k = random_activations(tokens * hkv * d);
    const std::vector<std::byte> v =
        mla ? std::vector<std::byte>() : random_activations(tokens * hkv * dv);
    std::vector<float> sinks, slopes;
    AttentionOptions options;
    options.causal = chance(0.8);
    if (!tree && chance(0.3)) options.window_left = static_cast<std::int32_t>(uniform(0, 6));
    if (chance(0.2)) options.softcap = 5.0f;
    if (chance(0.2)) sinks = random_floats(hq);
    if (chance(0.2)) slopes = random_floats(hq);
    const bool with_lse = chance(0.7);
    log_ << "  attention layer " << layer << "\n";

    const auto bytes_of = [](const std::vector<float>& f) {
      std::vector<std::byte> b(f.size() * sizeof(float));
      if (!f.empty()) std::memcpy(b.data(), f.data(), b.size());
      return b;
    };
    const auto tensor = [&](const void* data, std::size_t heads, std::size_t dim) {
      return HeadTensor{const_cast<void*>(data), activations_, std::int64_t(heads * dim),
                        std::int64_t(dim)};
    };
    // CPU cache: host memory.
    std::vector<std::byte> out_cpu(tokens * hq * dv * es);
    std::vector<float> lse_cpu(tokens * hq);
    AttentionOptions cpu_options = options;
    cpu_options.sinks = sinks.empty() ? nullptr : sinks.data();
    cpu_options.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    const std::string cpu_error = outcome([&] {
      cpu_.attention(layer, tensor(q.data(), hq, d), tensor(k.data(), hkv, d),
                     mla ? HeadTensor{} : tensor(v.data(), hkv, dv), tensor(out_cpu.data(), hq, dv),
                     cpu_options, with_lse ? lse_cpu.data() : nullptr);
    });
    // Device cache: backend memory.
    KVDeviceBackend& b = *backend_;
    const DeviceBytes q_dev(b, q), k_dev(b, k), v_dev(b, v);
    const DeviceBytes out_dev(b, out_cpu.size()), lse_dev(b, lse_cpu.size() * sizeof(float));
    const DeviceBytes sinks_dev(b, bytes_of(sinks)), slopes_dev(b, bytes_of(slopes));
    AttentionOptions dev_options = options;
    dev_options.sinks = sinks.empty() ? nullptr : static_cast<float*>(sinks_dev.get());
    dev_options.alibi_slopes = slopes.empty() ? nullptr : static_cast<float*>(slopes_dev.get());
    const std::string dev_error = outcome([&] {
      dev_.attention(layer, tensor(q_dev.get(), hq, d), tensor(k_dev.get(), hkv, d),
                     mla ? HeadTensor{} : tensor(v_dev.get(), hkv, dv),
                     tensor(out_dev.get(), hq, dv), dev_options,
                     with_lse ? static_cast<float*>(lse_dev.get()) : nullptr);
    });
    EXPECT_EQ(cpu_error, dev_error);
    if (!cpu_error.empty() || !dev_error.empty()) return;
    coverage_.attended_rows += static_cast<std::int64_t>(tokens);
    const std::vector<std::byte> out = out_dev.download(out_cpu.size());
    if (!out.empty()) {  // memcmp's pointers must be non-null even for 0 bytes
      EXPECT_EQ(0, std::memcmp(out.data(), out_cpu.data(), out.size()))
          << "attention outputs differ";
    }
    if (with_lse) {
      const std::vector<std::byte> lse = lse_dev.download(lse_cpu.size() * sizeof(float));
      if (!lse.empty()) {
        EXPECT_EQ(0, std::memcmp(lse.data(), lse_cpu.data(), lse.size())) << "LSE differs";
      }
    }
  }

  DeviceCoverage& coverage_;
  std::shared_ptr<HostDeviceBackend> backend_;
  PagedKVCache cpu_;
  PagedKVCache dev_;
  DType activations_;
  std::mt19937_64 rng_;
  SeqId next_id_ = 1;
  std::map<SeqId, std::vector<std::int32_t>> family_;
  std::ostringstream log_;
};

class DeviceBackendTest : public ::testing::TestWithParam<DeviceSetup> {};

TEST_P(DeviceBackendTest, RandomOperationsMatchTheCpuCache) {
  HostDeviceBackend::Counts counts;
  DeviceCoverage coverage;
  for (std::uint64_t seed = 1; seed <= 6 && !HasFailure(); ++seed) {
    const auto backend = std::make_shared<HostDeviceBackend>();
    {
      Twins twins(GetParam(), backend, seed, coverage);
      twins.run(160);
    }
    EXPECT_EQ(backend->live_allocations(), 0) << "the device cache leaked backend memory";
    const HostDeviceBackend::Counts c = backend->counts();
    counts.copies += c.copies;
    counts.copy_pages += c.copy_pages;
    counts.appends += c.appends;
    counts.attentions += c.attentions;
    counts.ropes += c.ropes;
    counts.to_host += c.to_host;
    counts.host_allocations += c.host_allocations;
  }
  const KVCacheConfig& c = GetParam().config;
  std::cout << "coverage: attended rows " << coverage.attended_rows << ", tree steps "
            << coverage.tree_steps << ", commits " << coverage.commits << ", cancels "
            << coverage.cancels << ", forks " << coverage.forks << ", swaps " << coverage.swaps
            << ", prefix hit tokens " << coverage.prefix_hit_tokens << ", windows "
            << coverage.windows << ", tokens read " << coverage.reads << ", written "
            << coverage.writes << "\n";
  for (std::int64_t n :
       {coverage.attended_rows, coverage.tree_steps, coverage.commits, coverage.cancels,
        coverage.forks, coverage.swaps, coverage.prefix_hit_tokens, coverage.windows,
        coverage.reads, coverage.writes})
    EXPECT_GT(n, 0) << "a kind of operation never succeeded";
  EXPECT_GT(counts.copies, 0) << "no copy-on-write, fork or tree commit copied slots";
  EXPECT_GT(counts.copy_pages, 0) << "no swap, demotion or host hit moved pages";
  EXPECT_GT(counts.appends, 0);
  EXPECT_GT(counts.attentions, 0);
  EXPECT_GT(counts.to_host, 0) << "state_digest read no device page";
  EXPECT_GT(counts.host_allocations, 0) << "the host tier is not the backend's";
  if (c.rope_mode == RopeMode::kNormal) {
    EXPECT_GT(counts.ropes, 0);
  } else {
    EXPECT_EQ(counts.ropes, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Setups, DeviceBackendTest, ::testing::ValuesIn(setups()),
                         [](const ::testing::TestParamInfo<DeviceSetup>& info) {
                           return std::string(info.param.name);
                         });

// --- construction and what a device cache refuses -------------------------------------

KVCacheConfig device_config() {
  KVCacheConfig c = config_of(DType::kF16, KVLayout::kHND, 4);
  c.device = KVDevice::kCuda;
  return c;
}

TEST(DeviceBackend, ADeviceCacheNeedsABackend) {
  expect_throws<Unsupported>([] { PagedKVCache kv(device_config()); },
                             {"PagedKVCache(config)", "device = cuda", "backend"});
  expect_throws<InvalidArgument>([] { PagedKVCache kv(device_config(), nullptr); },
                                 {"backend is null"});
  KVCacheConfig cpu = device_config();
  cpu.device = KVDevice::kCpu;
  expect_throws<InvalidArgument>(
      [&] { PagedKVCache kv(cpu, std::make_shared<HostDeviceBackend>()); }, {"device = cpu"});
  expect_throws<InvalidArgument>(
      [] { PagedKVCache kv(device_config(), std::make_shared<HostDeviceBackend>(KVDevice::kCpu)); },
      {"serves cpu"});
  KVCacheConfig bad = device_config();
  bad.device = static_cast<KVDevice>(7);
  expect_throws<InvalidArgument>([&] { PagedKVCache kv(bad); }, {"KVCacheConfig.device = 7"});
}

TEST(DeviceBackend, InlineRopeIsRefusedBeforeAnythingIsAllocated) {
  KVCacheConfig c = device_config();
  c.rope_mode = RopeMode::kInline;
  const auto backend = std::make_shared<HostDeviceBackend>();
  expect_throws<Unsupported>([&] { PagedKVCache kv(c, backend); }, {"rope_mode = kInline"});
  EXPECT_EQ(backend->counts().allocations, 0);
}

TEST(DeviceBackend, PageTransferIsRefused) {
  const auto backend = std::make_shared<HostDeviceBackend>();
  PagedKVCache kv(device_config(), backend);
  kv.add_sequence(1);
  const std::vector<SeqId> one = {1};
  const std::vector<std::int64_t> len = {3};
  kv.begin_forward(one, len);
  kv.mark_layer_appended(0);
  kv.mark_layer_appended(1);
  kv.end_forward();
  expect_rejected<Unsupported>(kv, [&] { kv.reserve_incoming(2, 4); },
                               {"reserve_incoming", "CUDA-aware MPI"});
  expect_rejected<Unsupported>(kv, [&] { kv.outgoing_pages(1); }, {"outgoing_pages"});
}

TEST(DeviceBackendDeathTest, PagesAreOutOfReachOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto backend = std::make_shared<HostDeviceBackend>();
  PagedKVCache kv(device_config(), backend);
  const auto* page = static_cast<const volatile std::byte*>(kv.layer_storage(0).k_data);
  EXPECT_DEATH((void)*page, "");
}

TEST(DeviceBackend, EveryAllocationIsReleasedWithTheCache) {
  const auto backend = std::make_shared<HostDeviceBackend>();
  {
    KVCacheConfig c = device_config();
    c.k_head_scales = {1.0f, 2.0f};  // f16 ignores them, but they are uploaded all the same
    PagedKVCache kv(c, backend);
    kv.add_sequence(1);
    EXPECT_GT(backend->live_allocations(), 0);
    EXPECT_NE(kv.layer_storage(0).k_data, nullptr);
  }
  EXPECT_EQ(backend->live_allocations(), 0);
}

}  // namespace
}  // namespace pagedattn::test
