// Over real gRPC against in-process shards: a worker that stops while the
// job goes on without it (rounds close at their deadline) is refused when
// it comes back, heals in its own process through AnchorExchange's
// reconnect, and ends with the shards' anchor, bit for bit, like the worker
// that never stopped.
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/aggregator_client.h"
#include "client/anchor_exchange.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"

namespace co2::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

struct Trainer {
  absl::Status status;
  std::vector<float> anchor;
  std::optional<uint64_t> healed_round;
  const char* heal_reason = nullptr;
};

// Worker `worker` through AnchorExchange, one step per round: x = A − Δ.
// `pause(r)` runs after round r's boundary; with `heal`, the exchange
// reconnects as a rejoining worker when the shards refuse it.
void Train(const E2eSpec& spec, const Cluster& cluster,
           const v1::JobConfig& config, int worker, bool heal, Barrier& joined,
           const std::function<void(uint64_t)>& pause, Trainer& out) {
  std::vector<float> x = InitialAnchor(spec.params);
  const client::ClientOptions options =
      WorkerOptions(cluster.addresses(), "heal", config, worker);
  auto connected =
      ConnectWithEveryone(options, absl::MakeSpan(x), joined, kTimeout);
  if (!connected.ok()) {
    out.status = connected.status();
    return;
  }
  client::AnchorExchangeOptions eo = ExchangeOptions(spec, worker, kTimeout);
  if (heal) {
    eo.reconnect = client::RejoinWith(options);
  }
  auto exchange = client::AnchorExchange::Create(eo, *std::move(connected), x);
  if (!exchange.ok()) {
    out.status = exchange.status();
    return;
  }
  uint64_t round = 0;
  while (round < spec.rounds) {
    const std::vector<float>& a = (*exchange)->anchor();
    for (size_t j = 0; j < spec.params; ++j)
      x[j] = a[j] - Delta(worker, round, j);
    client::ExchangeTimes times;
    out.status = (*exchange)->Boundary(round, 1, absl::MakeSpan(x), times);
    if (!out.status.ok()) return;
    if (times.healed_round) {
      out.healed_round = times.healed_round;
      out.heal_reason = times.heal_reason;
      round = *times.healed_round;
      continue;
    }
    if (pause) pause(round);
    ++round;
  }
  const std::optional<uint64_t> owed =
      client::OwedUpdate((*exchange)->staleness(), spec.rounds, round);
  client::ExchangeTimes times;
  if (owed) out.status = (*exchange)->Drain(*owed, absl::MakeSpan(x), times);
  out.anchor = x;
  (*exchange)->Leave();
}

TEST(HealE2eTest, AWorkerLeftBehindHealsAndEndsOnTheShardsAnchor) {
  E2eSpec spec;
  spec.params = 2 * common::kChunkElements + 77;
  spec.shards = 2;
  spec.workers = 2;
  spec.rounds = 14;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_min_workers(1);  // rounds close at their deadline without 1
  config.set_round_timeout_ms(300);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  Barrier joined(spec.workers);
  std::atomic<uint64_t> done0{0};  // rounds worker 0 has passed
  absl::Notification far_ahead;
  Trainer steady, stopped;
  std::thread t0([&] {
    Train(
        spec, cluster, config, 0, /*heal=*/false, joined,
        [&](uint64_t r) {
          done0 = r + 1;
          if (r + 1 == 8) far_ahead.Notify();
        },
        steady);
  });
  std::thread t1([&] {
    Train(
        spec, cluster, config, 1, /*heal=*/true, joined,
        [&](uint64_t r) {
          // Stops after round 1 until worker 0 is six rounds further on:
          // past what the shards replay, and its next push stale.
          if (r == 1) far_ahead.WaitForNotificationWithTimeout(kTimeout);
        },
        stopped);
  });
  t0.join();
  t1.join();
  CO2_ASSERT_OK(steady.status);
  CO2_ASSERT_OK(stopped.status);
  ASSERT_TRUE(stopped.healed_round.has_value()) << "worker 1 did not heal";
  EXPECT_GE(*stopped.healed_round, 8u);
  ASSERT_NE(stopped.heal_reason, nullptr);
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("heal", &round);
  ASSERT_EQ(shards.size(), spec.params);
  ASSERT_EQ(steady.anchor.size(), spec.params);
  ASSERT_EQ(stopped.anchor.size(), spec.params);
  EXPECT_EQ(std::memcmp(steady.anchor.data(), shards.data(),
                        spec.params * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(stopped.anchor.data(), shards.data(),
                        spec.params * sizeof(float)),
            0)
      << "the healed worker ends on another anchor";
}

// Worker 1 joins a running job (it fetches the anchor that starts round 2)
// and worker 0, the only other member, leaves before it sends round 1. No
// live worker takes part in round 1 any more: it closes with no
// contributions, worker 1 gets the update it owes and trains the job to its
// end alone, on the shards' anchor bit for bit.
TEST(HealE2eTest, ARoundNoMemberTakesPartInClosesAndTheJoinerGoesOn) {
  E2eSpec spec;
  spec.params = 2 * common::kChunkElements + 77;
  spec.shards = 2;
  spec.workers = 2;
  spec.rounds = 6;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_min_workers(1);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  const absl::Time deadline = absl::Now() + kTimeout;

  std::vector<float> a0 = InitialAnchor(spec.params);
  auto w0 = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "orphan", config, 0),
      absl::MakeSpan(a0));
  CO2_ASSERT_OK(w0);
  std::vector<float> delta(spec.params);
  for (size_t j = 0; j < spec.params; ++j) delta[j] = Delta(0, 0, j);
  CO2_ASSERT_OK((*w0)->Push(0, delta, Weight(0), deadline));
  CO2_ASSERT_OK((*w0)->WaitForUpdate(0, deadline));  // round 0 closed

  std::vector<float> x = InitialAnchor(spec.params);
  auto w1 = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "orphan", config, 1),
      absl::MakeSpan(x));
  CO2_ASSERT_OK(w1);
  EXPECT_EQ((*w1)->start_round(), 2u);
  CO2_ASSERT_OK((*w0)->Leave(deadline));
  w0->reset();

  auto exchange = client::AnchorExchange::Create(
      ExchangeOptions(spec, 1, kTimeout), *std::move(w1), x);
  CO2_ASSERT_OK(exchange);
  for (uint64_t round = 2; round < spec.rounds; ++round) {
    const std::vector<float>& a = (*exchange)->anchor();
    for (size_t j = 0; j < spec.params; ++j) x[j] = a[j] - Delta(1, round, j);
    client::ExchangeTimes times;
    const absl::Status s =
        (*exchange)->Boundary(round, 1, absl::MakeSpan(x), times);
    CO2_ASSERT_OK(s) << "round " << round;
  }
  client::ExchangeTimes times;
  CO2_ASSERT_OK((*exchange)->Drain(spec.rounds - 1, absl::MakeSpan(x), times));
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("orphan", &round);
  EXPECT_EQ(round, spec.rounds + 1);
  ASSERT_EQ(shards.size(), spec.params);
  EXPECT_EQ(std::memcmp(x.data(), shards.data(), spec.params * sizeof(float)),
            0);
}

}  // namespace
}  // namespace co2::testing
