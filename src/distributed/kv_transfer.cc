#include "distributed/kv_transfer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace detail {

// Staging buffers kept between transfers: a fresh allocation of a few MiB
// per transfer costs its page faults every time.
class StagingPool {
 public:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    std::int64_t capacity = 0;
  };

  Buffer take(std::int64_t bytes) {
    if (bytes == 0) return {};
    {
      const std::lock_guard lock(mutex_);
      const auto fits = std::find_if(free_.begin(), free_.end(),
                                     [&](const Buffer& b) { return b.capacity >= bytes; });
      if (fits != free_.end()) {
        Buffer b = std::move(*fits);
        free_.erase(fits);
        return b;
      }
    }
    return {std::make_unique_for_overwrite<std::byte[]>(static_cast<std::size_t>(bytes)), bytes};
  }

  void give_back(Buffer b) {
    if (b.capacity == 0) return;
    const std::lock_guard lock(mutex_);
    free_.push_back(std::move(b));
    // Keep the largest few; a burst of concurrent transfers does not pin memory for good.
    std::sort(free_.begin(), free_.end(),
              [](const Buffer& x, const Buffer& y) { return x.capacity > y.capacity; });
    if (free_.size() > kKeep) free_.resize(kKeep);
  }

 private:
  static constexpr std::size_t kKeep = 2;
  std::mutex mutex_;
  std::vector<Buffer> free_;
};

StagingPool& staging_pool() {
  static StagingPool pool;
  return pool;
}

}  // namespace detail

using detail::staging_pool;
using detail::StagingPool;

struct KVTransfer::State {
  // A stretch of consecutive short runs and where it sits in the staging buffer.
  struct Staged {
    std::vector<std::span<std::byte>> runs;
    std::int64_t offset = 0;
  };

  bool sending = false;
  std::vector<MpiRequest> requests;
  std::vector<Staged> staged;
  StagingPool::Buffer staging;  // every stretch, one after another
  std::int64_t staged_bytes = 0, blocks = 0;
  bool unpacked = false;

  ~State() {
    requests.clear();  // each waits for its message, before the staging buffer goes
    staging_pool().give_back(std::move(staging));
  }

  void unpack() {
    for (const Staged& group : staged) {
      const std::byte* in = staging.data.get() + group.offset;
      for (const std::span<std::byte> run : group.runs) {
        std::memcpy(run.data(), in, run.size());
        in += run.size();
      }
    }
    unpacked = true;
  }
};

namespace {

// The runs of consecutive layers, grouped into as few messages as MPI's
// int byte count allows (one for any sequence under 2 GiB).
std::vector<std::vector<std::span<std::byte>>> messages_of(const KVPageRuns& runs) {
  constexpr std::int64_t kMaxMessageBytes = std::numeric_limits<int>::max();
  std::vector<std::vector<std::span<std::byte>>> messages;
  std::int64_t bytes = kMaxMessageBytes;
  for (const auto& layer : runs.layers) {
    if (bytes + runs.layer_bytes > kMaxMessageBytes) {
      messages.emplace_back();
      bytes = 0;
    }
    for (const std::span<std::byte> run : layer)
      if (!run.empty()) messages.back().push_back(run);
    bytes += runs.layer_bytes;
  }
  return messages;
}

// The datatype blocks of one message: long runs as they are, each stretch of
// consecutive short runs as one block of the staging buffer (recorded in
// `s.staged`; the offsets are final once every message is planned).
std::vector<std::span<std::byte>> plan_blocks(const std::vector<std::span<std::byte>>& runs,
                                              std::int64_t stage_below, KVTransfer::State& s) {
  std::vector<std::span<std::byte>> blocks;
  bool in_stretch = false;
  for (const std::span<std::byte> run : runs) {
    if (std::ssize(run) >= stage_below) {
      blocks.push_back(run);
      in_stretch = false;
      continue;
    }
    if (!in_stretch) {
      s.staged.push_back({{}, s.staged_bytes});
      blocks.emplace_back();  // placeholder, pointed at the staging buffer later
      in_stretch = true;
    }
    s.staged.back().runs.push_back(run);
    s.staged_bytes += std::ssize(run);
  }
  return blocks;
}

void validate(const MpiComm& comm, const KVPageRuns& runs, int peer, int tag,
              std::int64_t stage_below, const char* call) {
  require(peer >= 0 && peer < comm.size(), call, ": peer = ", peer, " must be a rank in [0, ",
          comm.size(), ")");
  require(tag >= 0, call, ": tag = ", tag, " must be >= 0");
  require(stage_below >= 0, call, ": stage_below = ", stage_below, " must be >= 0");
  std::int64_t run_bytes = 0;
  for (const auto& layer : runs.layers)
    for (const std::span<std::byte> run : layer) run_bytes += std::ssize(run);
  require(run_bytes == runs.total_bytes(), call, ": runs hold ", run_bytes,
          " bytes, but runs.total_bytes() = ", runs.total_bytes());
}

std::unique_ptr<KVTransfer::State> post(const MpiComm& comm, const KVPageRuns& runs, bool sending,
                                        int peer, int tag, std::int64_t stage_below,
                                        const char* call) {
  validate(comm, runs, peer, tag, stage_below, call);
  auto s = std::make_unique<KVTransfer::State>();
  s->sending = sending;
  std::vector<std::vector<std::span<std::byte>>> messages;
  for (const auto& message : messages_of(runs))
    messages.push_back(plan_blocks(message, stage_below, *s));
  s->staging = staging_pool().take(s->staged_bytes);
  // Point each placeholder block at its stretch, in the order planned.
  std::size_t stretch = 0;
  for (auto& blocks : messages)
    for (std::span<std::byte>& block : blocks) {
      if (!block.empty()) continue;
      const KVTransfer::State::Staged& group = s->staged[stretch++];
      std::int64_t bytes = 0;
      for (const std::span<std::byte> run : group.runs) bytes += std::ssize(run);
      block = {s->staging.data.get() + group.offset, static_cast<std::size_t>(bytes)};
    }
  if (sending) {
    for (const auto& group : s->staged) {
      std::byte* out = s->staging.data.get() + group.offset;
      for (const std::span<std::byte> run : group.runs) {
        std::memcpy(out, run.data(), run.size());
        out += run.size();
      }
    }
  }
  for (const auto& blocks : messages) {
    s->blocks += std::ssize(blocks);
    s->requests.push_back(sending ? comm.isend_runs(blocks, peer, tag)
                                  : comm.irecv_runs(blocks, peer, tag));
  }
  return s;
}

}  // namespace

KVTransfer::KVTransfer(std::unique_ptr<State> state) : state_(std::move(state)) {}
KVTransfer::KVTransfer(KVTransfer&&) noexcept = default;
KVTransfer& KVTransfer::operator=(KVTransfer&&) noexcept = default;
KVTransfer::~KVTransfer() = default;

void KVTransfer::wait() {
  require<InvalidState>(state_ != nullptr, "KVTransfer::wait: the transfer was moved from");
  for (MpiRequest& r : state_->requests) r.wait();
  if (!state_->sending && !state_->unpacked) state_->unpack();
}

void KVTransfer::cancel() {
  require<InvalidState>(state_ != nullptr, "KVTransfer::cancel: the transfer was moved from");
  require<InvalidState>(!state_->sending, "KVTransfer::cancel: only receives can be cancelled");
  for (MpiRequest& r : state_->requests) r.cancel();
  state_->unpacked = true;  // nothing arrived that needs unpacking
}

std::int64_t KVTransfer::num_messages() const {
  return state_ ? std::ssize(state_->requests) : 0;
}

std::int64_t KVTransfer::num_blocks() const {
  return state_ ? state_->blocks : 0;
}

std::int64_t KVTransfer::num_staged_bytes() const {
  return state_ ? state_->staged_bytes : 0;
}

KVTransfer post_kv_sends(const MpiComm& comm, const KVPageRuns& runs, int dest, int tag,
                         std::int64_t stage_below) {
  return KVTransfer(post(comm, runs, true, dest, tag, stage_below, "post_kv_sends"));
}

KVTransfer post_kv_receives(const MpiComm& comm, const KVPageRuns& runs, int source, int tag,
                            std::int64_t stage_below) {
  return KVTransfer(post(comm, runs, false, source, tag, stage_below, "post_kv_receives"));
}

void wait_all(KVTransfer& transfer) {
  transfer.wait();
}

void cancel_all(KVTransfer& transfer) {
  transfer.cancel();
}

}  // namespace pagedattn::dist
