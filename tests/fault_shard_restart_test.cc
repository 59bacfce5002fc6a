// A shard stops abruptly in the middle of training and comes back on the same
// port from its checkpoint: the workers reconnect with backoff, rejoin at the
// round they are in, resend what the shard lost, and training ends with the
// same anchor, bit for bit, as an undisturbed run; nothing is counted twice.
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"

namespace co2::testing {
namespace {

std::string TempDir() {
  char pattern[] = "/tmp/co2-fault-XXXXXX";
  return mkdtemp(pattern);
}

class FaultShardRestartTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FaultShardRestartTest, TrainingFinishesWithTheUndisturbedAnchor) {
  E2eSpec spec;
  spec.params = 300000;
  spec.workers = 3;
  spec.rounds = 12;
  Cluster cluster(spec.shards, TempDir());
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  const uint64_t crash_after = GetParam();
  absl::Mutex mu;
  bool restarted = false;
  absl::Status restart_status;
  std::vector<WorkerResult> results = RunWorkers(
      spec, cluster.addresses(), "fault", config,
      [](int) { return common::Codec::kFp32; },
      [&](int worker, uint64_t round) {
        absl::MutexLock lock(&mu);
        if (worker == 0 && round == crash_after && !restarted) {
          restarted = true;
          restart_status = cluster.Restart(1);
        }
      });
  ASSERT_TRUE(restart_status.ok()) << restart_status;
  ASSERT_TRUE(restarted);
  uint64_t reconnects = 0;
  for (const WorkerResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    reconnects += r.reconnects;
  }
  EXPECT_GE(reconnects, 1u) << "no worker noticed the restart";
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("fault", &round);
  EXPECT_EQ(round, spec.rounds + 1) << "rounds are not contiguous";
  const std::vector<float> reference = ReferenceAnchor(spec, config);
  ASSERT_EQ(shards.size(), reference.size());
  EXPECT_EQ(std::memcmp(shards.data(), reference.data(),
                        shards.size() * sizeof(float)),
            0)
      << "a contribution was lost or counted twice";
  for (const WorkerResult& r : results) {
    EXPECT_EQ(std::memcmp(r.anchor.data(), shards.data(),
                          shards.size() * sizeof(float)),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(CrashAfterRound, FaultShardRestartTest,
                         ::testing::Values(0, 4, 9));

}  // namespace
}  // namespace co2::testing
