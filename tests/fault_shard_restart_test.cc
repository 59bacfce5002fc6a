// A shard stops abruptly in the middle of training and comes back on the same
// port from its checkpoint: the workers reconnect with backoff, rejoin at the
// round they are in, resend what the shard lost, and training ends with the
// same anchor, bit for bit, as an undisturbed run; nothing is counted twice.
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/aggregator_client.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace co2::testing {
namespace {

using ::co2::testing::TempDir;

// Parameters: the round after which shard 1 stops, and the parameters: one
// chunk per shard, or several (the shard streams chunks of a round ahead of
// its close, and may stop with some of them journaled and sent).
class FaultShardRestartTest
    : public ::testing::TestWithParam<std::tuple<uint64_t, uint64_t>> {};

TEST_P(FaultShardRestartTest, TrainingFinishesWithTheUndisturbedAnchor) {
  E2eSpec spec;
  spec.params = std::get<1>(GetParam());
  spec.workers = 3;
  spec.rounds = 12;
  const TempDir temp_dir("co2-fault");
  Cluster cluster(spec.shards, temp_dir.path());
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  const uint64_t crash_after = std::get<0>(GetParam());
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
  CO2_ASSERT_OK(restart_status);
  ASSERT_TRUE(restarted);
  uint64_t reconnects = 0;
  for (const WorkerResult& r : results) {
    CO2_ASSERT_OK(r.status);
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

INSTANTIATE_TEST_SUITE_P(
    CrashAfterRound, FaultShardRestartTest,
    ::testing::Combine(::testing::Values(0, 4, 9),
                       ::testing::Values(common::kChunkElements + 1000,
                                         6 * common::kChunkElements + 1000)));

// An update that arrived whole but that the trainer had not taken yet when
// the shard's stream broke is not handed out from the old stream: a shard
// that lost its state would compute that round again, maybe from other
// contributions. While the shard is down WaitForUpdate waits; once it is
// back the new stream replays the update, and it is the same update.
TEST(StreamBreakTest, AnUpdateNotYetTakenIsAskedForAgain) {
  E2eSpec spec;
  spec.params = 300000;
  spec.shards = 1;
  spec.workers = 1;
  const TempDir temp_dir("co2-fault");
  Cluster cluster(spec.shards, temp_dir.path());
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  std::vector<float> anchor = InitialAnchor(spec.params);
  auto connected = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "break", config, 0),
      absl::MakeSpan(anchor));
  CO2_ASSERT_OK(connected);
  client::AggregatorClient& client = **connected;
  std::vector<float> delta(spec.params);
  for (size_t j = 0; j < spec.params; ++j) delta[j] = Delta(0, 0, j);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  CO2_ASSERT_OK(client.Push(0, delta, Weight(0), deadline));
  const uint64_t update_bytes = spec.params * sizeof(float);
  ASSERT_TRUE(
      WaitFor([&] { return client.stats().bytes_received == update_bytes; },
              absl::Seconds(30)))
      << "the update of round 0 did not arrive";

  absl::Status while_down;
  const absl::Status restarted = cluster.Restart(0, [&](const std::string&) {
    if (!WaitFor([&] { return client.stats().broken_streams >= 1; },
                 absl::Seconds(30))) {
      while_down = absl::InternalError("the client did not see the break");
      return;
    }
    while_down = client.WaitForUpdate(0, absl::Now() + absl::Milliseconds(300));
  });
  CO2_ASSERT_OK(restarted);
  EXPECT_EQ(while_down.code(), absl::StatusCode::kDeadlineExceeded)
      << "the update from the broken stream was handed out: " << while_down;

  CO2_ASSERT_OK(client.WaitForUpdate(0, deadline));
  EXPECT_EQ(client.stats().bytes_received, 2 * update_bytes)
      << "the new stream did not send the update again";
  std::vector<float> applied = anchor;
  CO2_ASSERT_OK(client.ApplyUpdate(0, absl::MakeSpan(applied)));
  uint64_t round = 0;
  const std::vector<float> shard = cluster.Anchor("break", &round);
  EXPECT_EQ(
      std::memcmp(applied.data(), shard.data(), shard.size() * sizeof(float)),
      0)
      << "the replayed update is not the one the shard applied";
}

}  // namespace
}  // namespace co2::testing
