// The read probes of perf/machine_probes.h on small buffers: what they report
// about the runs they read (the figures themselves are the machine's).
#include "machine_probes.h"

#include <gtest/gtest.h>

#include <cstddef>

namespace pb = pagedattn::bench;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The paged read probe reads runs of the length asked for (rounded down to
// the read loop's 256 bytes, at least one loop), over the whole buffer, and
// reports the spread of its passes.
TEST(MachineProbes, PagedReadProbeReportsItsRunsAndPasses) {
  const pb::ReadBandwidthResult r = pb::measure_paged_read_bandwidth(4096, 8 * kMiB, 3, 1);
  EXPECT_EQ(r.run_bytes, 4096u);
  EXPECT_EQ(r.bytes, 8 * kMiB);
  EXPECT_EQ(r.passes, 3);
  EXPECT_EQ(r.threads, 1);
  EXPECT_GT(r.min_gbps, 0.0);
  EXPECT_LE(r.min_gbps, r.median_gbps);
  EXPECT_LE(r.median_gbps, r.best_gbps);
  EXPECT_EQ(pb::measure_paged_read_bandwidth(1000, kMiB, 1, 1).run_bytes, 768u);
  EXPECT_EQ(pb::measure_paged_read_bandwidth(100, kMiB, 1, 1).run_bytes, 256u);
  // The sequential probe is not a paged one.
  EXPECT_EQ(pb::measure_read_bandwidth(kMiB, 1, 1).run_bytes, 0u);
}

// Both ways of reading runs cover the buffer on any thread count, the last
// runs (nothing two runs ahead) included: under ASan a read past the buffer
// would stop the test.
TEST(MachineProbes, RunsPassReadsTheBufferWithAndWithoutPrefetches) {
  pb::HugeBuffer buf(4 * kMiB + 4096);
  pb::touch_parallel(buf.data(), buf.size());
  for (int threads : {1, 2, 3})
    for (pb::RunPrefetch prefetch : {pb::RunPrefetch::kNone, pb::RunPrefetch::kTwoRunsAhead})
      for (std::size_t run : {std::size_t{256}, std::size_t{4096}, std::size_t{32768}}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, runs of " << run);
        EXPECT_GT(pb::read_runs_pass_seconds(buf.data(), buf.size(), run, threads, prefetch), 0.0);
      }
}

// With FMAs on what it reads (an odd count rounds down, a negative one is
// none) and the runs walked more than once, the pass still stays inside the
// buffer, with and without prefetches.
TEST(MachineProbes, RunsPassWithWorkReadsTheBuffer) {
  pb::HugeBuffer buf(2 * kMiB + 4096);
  pb::touch_parallel(buf.data(), buf.size());
  for (int threads : {1, 3})
    for (pb::RunPrefetch prefetch : {pb::RunPrefetch::kNone, pb::RunPrefetch::kTwoRunsAhead})
      for (pb::RunWork work : {pb::RunWork{4, 1}, pb::RunWork{3, 2}, pb::RunWork{-1, 0}}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, " << work.fmas_per_line
                                        << " FMAs a line, " << work.repeat << " walks");
        EXPECT_GT(
            pb::read_runs_pass_seconds(buf.data(), buf.size(), 32768, threads, prefetch, work),
            0.0);
      }
}

}  // namespace
