// Over real gRPC against in-process shards: the same contributions give the
// same anchor bits whatever order they arrive in (workers delayed at random),
// and an anchor corrupted in a worker's memory is caught by the shard's
// digest in the round it happens and fetched again.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/aggregator_client.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace co2::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

// Worker i's delta of round r: values over 30 binades with random bits,
// whose fp32 sum depends on the order of addition.
std::vector<float> RandomDelta(size_t params, int worker, uint64_t round) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * worker + round));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-25, 5);
  std::vector<float> delta(params);
  for (float& x : delta) x = std::ldexp(normal(rng), exponent(rng));
  return delta;
}

// Runs `workers` synchronous workers (max_staleness 0) for `rounds` rounds
// on a fresh cluster, each sleeping a random 0–20 ms (seeded by
// `delay_seed`) before each push; returns the shards' final anchor.
std::vector<float> RunWithDelays(uint32_t delay_seed) {
  E2eSpec spec;
  spec.params = 2 * common::kChunkElements + 777;
  spec.shards = 2;
  spec.workers = 4;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_max_staleness(0);
  config.set_deterministic(true);
  Cluster cluster(spec.shards);
  const uint64_t rounds = 4;
  std::vector<absl::Status> results(spec.workers);
  // Every worker takes part from round 0: none pushes before all joined.
  Barrier joined(spec.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < spec.workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 delays(delay_seed * 100 + w);
      std::vector<float> anchor = InitialAnchor(spec.params);
      auto client = client::AggregatorClient::Connect(
          WorkerOptions(cluster.addresses(), "repro", config, w),
          absl::MakeSpan(anchor));
      if (!client.ok()) {
        results[w] = client.status();
        return;
      }
      if (!joined.ArriveAndWait([] {}, kTimeout)) {
        results[w] = absl::DeadlineExceededError("workers did not all join");
        return;
      }
      for (uint64_t r = 0; r < rounds; ++r) {
        absl::SleepFor(absl::Milliseconds(delays() % 20));
        const std::vector<float> delta = RandomDelta(spec.params, w, r);
        absl::Status s =
            (*client)->Push(r, delta, 1.0 + 3 * w, absl::Now() + kTimeout);
        if (s.ok()) s = (*client)->WaitForUpdate(r, absl::Now() + kTimeout);
        if (s.ok())
          s = (*client)->ApplyUpdate(r, absl::MakeSpan(anchor)).status();
        if (!s.ok()) {
          results[w] = s;
          return;
        }
      }
      results[w] = (*client)->Leave(absl::Now() + kTimeout);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) CO2_EXPECT_OK(s);
  uint64_t round = 0;
  std::vector<float> anchor = cluster.Anchor("repro", &round);
  EXPECT_EQ(round, rounds);
  return anchor;
}

TEST(ReproducibleE2eTest, RandomDelaysGiveTheSameAnchorBits) {
  const std::vector<float> first = RunWithDelays(1);
  ASSERT_FALSE(first.empty());
  for (uint32_t seed : {2u, 3u}) {
    const std::vector<float> again = RunWithDelays(seed);
    ASSERT_EQ(again.size(), first.size());
    EXPECT_EQ(
        std::memcmp(again.data(), first.data(), first.size() * sizeof(float)),
        0)
        << "delay seed " << seed;
  }
}

TEST(ReproducibleE2eTest, AnAnchorCorruptedInMemoryIsHealedInTheSameRound) {
  E2eSpec spec;
  spec.params = 3 * common::kChunkElements + 5;
  spec.shards = 2;
  spec.workers = 1;
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_BF16);
  Cluster cluster(spec.shards);
  std::vector<float> anchor = InitialAnchor(spec.params);
  auto client = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "heal", config, 0),
      absl::MakeSpan(anchor));
  CO2_ASSERT_OK(client);
  CO2_ASSERT_OK((*client)->TrackAnchor(anchor));
  // With max_staleness 1, the update of round r makes the anchor of r + 2:
  // the worker pushes round r and applies that update before it pushes
  // r + 1, so the shards still hold that anchor.
  for (uint64_t r = 0; r < 3; ++r) {
    const std::vector<float> delta = RandomDelta(spec.params, 0, r);
    CO2_ASSERT_OK((*client)->Push(r, delta, 2.0, absl::Now() + kTimeout));
    CO2_ASSERT_OK((*client)->WaitForUpdate(r, absl::Now() + kTimeout));
    if (r == 1) (*client)->CorruptNextUpdateForTesting();
    absl::StatusOr<uint64_t> applied =
        (*client)->ApplyUpdate(r, absl::MakeSpan(anchor));
    CO2_ASSERT_OK(applied);
    EXPECT_EQ((*client)->stats().anchor_mismatches, r >= 1 ? 1u : 0u)
        << "round " << r;
    uint64_t round = 0;
    const std::vector<float> shards = cluster.Anchor("heal", &round);
    ASSERT_EQ(round, *applied);
    ASSERT_EQ(std::memcmp(shards.data(), anchor.data(),
                          anchor.size() * sizeof(float)),
              0)
        << "round " << r << ": the worker's anchor is the shards'";
  }
  CO2_EXPECT_OK((*client)->Leave(absl::Now() + kTimeout));
}

// The shard may close the next round before the worker fetches its range
// again: the range is then the later anchor, and the update it includes is
// checked when it arrives, not added twice.
TEST(ReproducibleE2eTest, AHealWhileTheShardMovesOnSkipsTheUpdateItHolds) {
  E2eSpec spec;
  spec.params = 2 * common::kChunkElements;
  spec.shards = 2;
  spec.workers = 1;
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  Cluster cluster(spec.shards);
  std::vector<float> anchor = InitialAnchor(spec.params);
  auto client = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "ahead", config, 0),
      absl::MakeSpan(anchor));
  CO2_ASSERT_OK(client);
  const absl::Time deadline = absl::Now() + kTimeout;
  CO2_ASSERT_OK(
      (*client)->Push(0, RandomDelta(spec.params, 0, 0), 1.0, deadline));
  CO2_ASSERT_OK((*client)->WaitForUpdate(0, deadline));
  // Round 1 closes (the anchor of round 3) before update 0 is applied.
  CO2_ASSERT_OK(
      (*client)->Push(1, RandomDelta(spec.params, 0, 1), 1.0, deadline));
  ASSERT_TRUE(WaitFor(
      [&] {
        uint64_t round = 0;
        cluster.Anchor("ahead", &round);
        return round == 3;
      },
      kTimeout));
  (*client)->CorruptNextUpdateForTesting();
  absl::StatusOr<uint64_t> applied =
      (*client)->ApplyUpdate(0, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(applied);
  EXPECT_EQ(*applied, 2u);
  EXPECT_EQ((*client)->stats().anchor_mismatches, 1u);
  CO2_ASSERT_OK((*client)->WaitForUpdate(1, deadline));
  applied = (*client)->ApplyUpdate(1, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(applied);
  EXPECT_EQ((*client)->stats().anchor_mismatches, 1u) << "checked, not added";
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("ahead", &round);
  ASSERT_EQ(round, 3u);
  EXPECT_EQ(
      std::memcmp(shards.data(), anchor.data(), anchor.size() * sizeof(float)),
      0);
  CO2_EXPECT_OK((*client)->Leave(absl::Now() + kTimeout));
}

}  // namespace
}  // namespace co2::testing
