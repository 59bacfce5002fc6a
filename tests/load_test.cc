// Load: 64 simulated workers × 2 shards × 50 rounds of a 1M-parameter model on
// loopback. Every round closes, no contribution is lost or counted twice (the
// anchor equals the reference bit for bit), and the memory the process has
// allocated stays flat after warm-up. Writes round-time percentiles as JSON to
// the path in $CO2_LOAD_REPORT (bench/results/load.json via bench/run_load.sh).
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"

namespace co2::testing {
namespace {

// Resident set size of this process in KiB.
long RssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// Bytes this process has allocated and not freed, in KiB: malloc's heap in
// use in every arena plus its mmapped blocks. Unlike the RSS, it does not
// count free memory that the arenas of 64 client threads keep mapped, which
// varies from run to run with how the threads interleave.
long HeapInUseKib() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<long>((info.uordblks + info.hblkhd) / 1024);
}

// The largest RSS and allocated memory seen at the samples taken, in KiB.
struct MemoryKib {
  long rss = 0;
  long heap = 0;
  void Sample() {
    rss = std::max(rss, RssKib());
    heap = std::max(heap, HeapInUseKib());
  }
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

TEST(LoadTest, SixtyFourWorkersFiftyRounds) {
  E2eSpec spec;
  spec.params = 1 << 20;
  spec.shards = 2;
  spec.workers = 64;
  spec.rounds = 50;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  absl::Mutex mu;
  std::vector<absl::Time> round_done(spec.rounds, absl::InfinitePast());
  MemoryKib after_warmup, end;
  const absl::Time start = absl::Now();
  std::vector<WorkerResult> results = RunWorkers(
      spec, cluster.addresses(), "load", config,
      [](int) { return common::Codec::kFp32; },
      [&](int, uint64_t round) {
        absl::MutexLock lock(&mu);
        round_done[round] = std::max(round_done[round], absl::Now());
        if (round == 10) after_warmup.Sample();
        if (round + 1 == spec.rounds) end.Sample();
      });
  for (const WorkerResult& r : results) CO2_ASSERT_OK(r.status);
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("load", &round);
  EXPECT_EQ(round, spec.rounds + 1);
  const std::vector<float> reference = ReferenceAnchor(spec, config);
  EXPECT_EQ(std::memcmp(shards.data(), reference.data(),
                        shards.size() * sizeof(float)),
            0)
      << "a contribution was lost or counted twice";
  // Memory is allocated up front: 50 rounds later what is allocated has not
  // grown by more than a small fraction of what 64 workers hold (4 buffers ×
  // 4 MiB each).
  EXPECT_LT(end.heap - after_warmup.heap, 64 * 16 * 1024 / 4)
      << "allocated memory grew from " << after_warmup.heap << " to "
      << end.heap << " KiB (RSS from " << after_warmup.rss << " to " << end.rss
      << " KiB)";

  std::vector<double> round_seconds;
  absl::Time previous = start;
  for (absl::Time t : round_done) {
    round_seconds.push_back(absl::ToDoubleSeconds(t - previous));
    previous = t;
  }
  if (const char* path = std::getenv("CO2_LOAD_REPORT")) {
    std::ofstream out(path);
    out << "{\n  \"workers\": " << spec.workers
        << ",\n  \"shards\": " << spec.shards
        << ",\n  \"rounds\": " << spec.rounds
        << ",\n  \"parameters\": " << spec.params
        << ",\n  \"round_seconds\": {\"p50\": "
        << Percentile(round_seconds, 0.5)
        << ", \"p90\": " << Percentile(round_seconds, 0.9)
        << ", \"p99\": " << Percentile(round_seconds, 0.99)
        << ", \"max\": " << Percentile(round_seconds, 1.0)
        << "},\n  \"rss_kib\": {\"after_round_10\": " << after_warmup.rss
        << ", \"end\": " << end.rss
        << "},\n  \"heap_in_use_kib\": {\"after_round_10\": "
        << after_warmup.heap << ", \"end\": " << end.heap << "}\n}\n";
  }
}

}  // namespace
}  // namespace co2::testing
