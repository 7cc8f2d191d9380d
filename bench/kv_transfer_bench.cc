// KV transfer bandwidth of disaggregated prefill/decode against MPI's own
// point-to-point bandwidth, in the same run:
//   mpirun -np 2 pagedattn_bench_kv_transfer [--tokens N] [--reps R]
//   [--stage-below B] [--only SHAPE/KV/PAGES]   (e.g. --only SmolLM2/int8/fragmented)
// Rank 0 holds an N-token sequence (every layer's K/V, int8 scales too) and
// sends its pages the way the decode path does (distributed/kv_transfer.h: one
// derived-datatype message over the page runs, runs shorter than B bytes
// staged, into pages the receiver reserved). Interleaved with it, in each
// round: the same pages as one message over a datatype of every run, none
// staged (the previous transport), and the same byte count as one
// message between two contiguous buffers (the reference). Rank 1 times each
// from the moment its receives are posted to their completion, and the
// reserve_incoming / commit_incoming calls around the paged transfer.
// "fragmented": both caches' free pages alternate with used ones, so every
// page is its own run (the worst case).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/kv_transfer.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSender = 0, kReceiver = 1;
constexpr int kTagReady = 7, kTagPages = 8, kTagPlain = 9, kTagDone = 10, kTagDatatype = 11;

struct Shape {
  const char* name;
  std::int32_t num_layers, num_kv_heads, head_dim;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

KVCacheConfig cache_config(const Shape& s, DType dtype, std::int64_t tokens) {
  KVCacheConfig c;
  c.num_layers = s.num_layers;
  c.num_qo_heads = s.num_kv_heads * 3;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.page_size = 16;
  c.kv_dtype = dtype;
  c.num_pages = 2 * (tokens / 16 + 1) + 8;
  return c;
}

// Leaves every other page free (sequences 1.. hold the rest), so the next
// sequence's pages are scattered one by one.
void fragment(PagedKVCache& kv) {
  const std::array<std::int64_t, 1> page{16};
  for (SeqId id = 1; kv.num_free_pages() > 0; ++id) {
    kv.add_sequence(id);
    const std::array<SeqId, 1> ids{id};
    kv.begin_forward(ids, page);
    for (std::int32_t l = 0; l < kv.config().num_layers; ++l) kv.mark_layer_appended(l);
    kv.end_forward();
  }
  for (SeqId id = 1; id <= kv.num_pages(); id += 2) kv.remove_sequence(id);
}

void fill(const KVPageRuns& runs, std::byte value) {
  for (const auto& layer : runs.layers)
    for (std::span<std::byte> run : layer)
      std::memset(run.data(), static_cast<int>(value), run.size());
}

struct Times {
  std::vector<double> paged, datatype, plain, reserve, commit, gather, memcpy;
};

// The same bytes copied out of the reserved pages' runs into one buffer (the
// pack a non-contiguous send does, in either rank) and as one memcpy: what
// the memory system makes of the runs, with no MPI in between. Each copy
// starts with the caches full of other bytes (`evict`, 128 MiB written), as
// neither source may have been left in cache by the transfers before.
void copy_round(PagedKVCache& kv, std::int64_t tokens, const std::vector<std::byte>& plain,
                std::vector<std::byte>& copy, std::vector<std::byte>& evict, Times& t) {
  const SeqId id = (1 << 30) + 2;
  const KVPageRuns runs = kv.reserve_incoming(id, tokens);
  std::memset(evict.data(), 1, evict.size());
  auto start = Clock::now();
  std::byte* out = copy.data();
  for (const auto& layer : runs.layers)
    for (const std::span<std::byte> run : layer) {
      std::memcpy(out, run.data(), run.size());
      out += run.size();
    }
  t.gather.push_back(seconds_since(start));
  kv.cancel_incoming(id);
  std::memset(evict.data(), 2, evict.size());
  start = Clock::now();
  std::memcpy(copy.data(), plain.data(), plain.size());
  t.memcpy.push_back(seconds_since(start));
}

// Every run of every layer, for one derived-datatype message (the sizes here
// stay far below MPI's 2 GiB message limit).
std::vector<std::span<std::byte>> all_runs(const KVPageRuns& runs) {
  std::vector<std::span<std::byte>> all;
  for (const auto& layer : runs.layers) all.insert(all.end(), layer.begin(), layer.end());
  return all;
}

// One interleaved round: the transfer as the decode path does it, the derived-datatype one, then
// the contiguous one.
void receiver_round(const MpiComm& comm, PagedKVCache& kv, std::int64_t tokens,
                    std::int64_t stage_below, std::vector<std::byte>& plain, Times& t) {
  const SeqId id = 1 << 30;
  auto start = Clock::now();
  const KVPageRuns runs = kv.reserve_incoming(id, tokens);
  t.reserve.push_back(seconds_since(start));
  start = Clock::now();
  KVTransfer receives = post_kv_receives(comm, runs, kSender, kTagPages, stage_below);
  comm.send({}, kSender, kTagReady);
  wait_all(receives);
  t.paged.push_back(seconds_since(start));
  start = Clock::now();
  kv.commit_incoming(id);
  t.commit.push_back(seconds_since(start));
  kv.remove_sequence(id);

  const KVPageRuns again = kv.reserve_incoming(id + 1, tokens);
  start = Clock::now();
  MpiRequest datatype = comm.irecv_runs(all_runs(again), kSender, kTagDatatype);
  comm.send({}, kSender, kTagReady);
  datatype.wait();
  t.datatype.push_back(seconds_since(start));
  kv.cancel_incoming(id + 1);

  start = Clock::now();
  MpiRequest r = comm.irecv(plain, kSender, kTagPlain);
  comm.send({}, kSender, kTagReady);
  r.wait();
  t.plain.push_back(seconds_since(start));
}

void sender_round(const MpiComm& comm, const KVPageRuns& runs, std::int64_t stage_below,
                  const std::vector<std::byte>& plain) {
  comm.recv({}, kReceiver, kTagReady);
  KVTransfer sends = post_kv_sends(comm, runs, kReceiver, kTagPages, stage_below);
  wait_all(sends);
  comm.recv({}, kReceiver, kTagReady);
  comm.isend_runs(all_runs(runs), kReceiver, kTagDatatype).wait();
  comm.recv({}, kReceiver, kTagReady);
  comm.isend(plain, kReceiver, kTagPlain).wait();
}

void run_case(const MpiComm& comm, const Shape& shape, DType dtype, bool fragmented,
              std::int64_t tokens, std::int64_t stage_below, int reps) {
  PagedKVCache kv(cache_config(shape, dtype, tokens));
  if (fragmented) fragment(kv);
  const std::int64_t bytes = (tokens + 15) / 16 * kv.bytes_per_page();
  std::vector<std::byte> plain(static_cast<std::size_t>(bytes), std::byte{1});
  if (comm.rank() == kSender) {
    const SeqId id = 1 << 30;
    kv.add_sequence(id);
    const std::array<SeqId, 1> ids{id};
    const std::array<std::int64_t, 1> lens{tokens};
    kv.begin_forward(ids, lens);
    for (std::int32_t l = 0; l < kv.config().num_layers; ++l) kv.mark_layer_appended(l);
    kv.end_forward();
    const OutgoingKV out = kv.outgoing_pages(id);
    fill(out.runs, std::byte{3});
    for (int rep = 0; rep <= reps; ++rep) sender_round(comm, out.runs, stage_below, plain);
    kv.release_outgoing(out.id);
    comm.recv({}, kReceiver, kTagDone);
    return;
  }
  // Touch the pages the transfers will use before timing anything.
  const KVPageRuns warm = kv.reserve_incoming(1 << 30, tokens);
  fill(warm, std::byte{0});
  kv.cancel_incoming(1 << 30);
  Times t, ignored;
  std::vector<std::byte> copy(plain.size()), evict(std::size_t{128} << 20);
  receiver_round(comm, kv, tokens, stage_below, plain, ignored);  // warm-up round
  copy_round(kv, tokens, plain, copy, evict, ignored);
  for (int rep = 0; rep < reps; ++rep) {
    receiver_round(comm, kv, tokens, stage_below, plain, t);
    copy_round(kv, tokens, plain, copy, evict, t);
  }
  // Ratios are paired per round (the same moment's contiguous transfer), which
  // cancels most of a shared machine's drift.
  std::vector<double> paged_ratio, datatype_ratio, copy_ratio;
  for (std::size_t i = 0; i < t.plain.size(); ++i) {
    paged_ratio.push_back(t.plain[i] / t.paged[i]);
    datatype_ratio.push_back(t.plain[i] / t.datatype[i]);
    copy_ratio.push_back(t.memcpy[i] / t.gather[i]);
  }
  const double paged = median(t.paged), contiguous = median(t.plain);
  std::printf(
      "| %-9s | %-7s | %-10s | %7.1f | %6.2f | %6.2f | %5.0f%% | %5.0f%% | %5.0f%% | %7.1f | "
      "%7.2f | %7.1f |\n",
      shape.name, std::string(dtype_name(dtype)).c_str(), fragmented ? "fragmented" : "in order",
      double(bytes) / (1 << 20), double(bytes) / paged * 1e-9, double(bytes) / contiguous * 1e-9,
      100.0 * median(paged_ratio), 100.0 * median(datatype_ratio), 100.0 * median(copy_ratio),
      median(t.reserve) * 1e6, paged * 1e3, median(t.commit) * 1e6);
  std::fflush(stdout);
  comm.send({}, kSender, kTagDone);
}

const char* flag_text(int argc, char** argv, const char* flag, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return argv[i + 1];
  return fallback;
}

std::int64_t flag_value(int argc, char** argv, const char* flag, std::int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace
}  // namespace pagedattn::dist

int main(int argc, char** argv) {
  using namespace pagedattn;
  using namespace pagedattn::dist;
  MpiSession session(&argc, &argv);
  const MpiComm world = MpiComm::world();
  if (world.size() != 2) {
    if (world.rank() == 0) std::fprintf(stderr, "run under mpirun -np 2\n");
    return 1;
  }
  const std::int64_t tokens = flag_value(argc, argv, "--tokens", 4096);
  const int reps = static_cast<int>(flag_value(argc, argv, "--reps", 15));
  const std::int64_t stage_below = flag_value(argc, argv, "--stage-below", kDefaultStageBelowBytes);
  const std::string only = flag_text(argc, argv, "--only", "");
  if (world.rank() == kReceiver) {
    std::printf(
        "KV transfer of a %lld-token sequence, medians of %d interleaved rounds "
        "(paged = pages into reserved pages, runs under %lld bytes staged; datatype = the same "
        "pages, none staged; contiguous = the same bytes as one message between "
        "plain buffers; copy = a memcpy of the pages' runs into one buffer against one memcpy of "
        "the same bytes, no MPI; ratios: median of each round's ratio)\n\n",
        static_cast<long long>(tokens), reps, static_cast<long long>(stage_below));
    std::printf(
        "| shape     | KV      | pages      | MiB     | paged GB/s | contiguous GB/s | "
        "paged/contiguous | datatype/contiguous | copy of runs/memcpy | reserve us | transfer ms "
        "| commit us |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  const Shape shapes[] = {{"small", 12, 4, 64}, {"SmolLM2", 30, 3, 64}};
  try {
    for (const Shape& shape : shapes)
      for (DType dtype : {DType::kF16, DType::kINT8})
        for (bool fragmented : {false, true})
          if (std::string(shape.name) + "/" + std::string(dtype_name(dtype)) + "/" +
                      (fragmented ? "fragmented" : "in-order") ==
                  only ||
              only.empty())
            run_case(world, shape, dtype, fragmented, tokens, stage_below, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
    world.abort(1);
  }
  return 0;
}
