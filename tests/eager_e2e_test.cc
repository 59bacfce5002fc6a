// Eager updates (client/anchor_exchange.h): EagerScale is the shards' own
// ∂U/∂D for every kind of outer momentum, and over real gRPC against
// in-process shards each worker starts every round from the shards' anchor
// plus its eager offset, pushes its progress from there, and ends on the
// shards' anchor bit for bit.
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "client/anchor_exchange.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/job/chunked_outer_step.h"
#include "server/job/outer_optimizer.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"

namespace co2::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

// (U(D + h) − U(D)) / h of the shards' step, element by element, against
// −EagerScale: the outer step is linear in D without clipping and with a
// penalty of 1 (or a constant λ).
TEST(EagerScaleTest, IsTheShardsStepPerUnitOfMean) {
  struct Case {
    v1::Momentum momentum;
    uint32_t period;
    v1::GapPenalty penalty;
  };
  for (const Case c :
       {Case{v1::MOMENTUM_HEAVY_BALL, 0, v1::GAP_PENALTY_NONE},
        Case{v1::MOMENTUM_NESTEROV, 0, v1::GAP_PENALTY_NONE},
        Case{v1::MOMENTUM_NESTEROV, 0, v1::GAP_PENALTY_CONSTANT},
        Case{v1::MOMENTUM_DELAYED_NESTEROV, 3, v1::GAP_PENALTY_NONE}}) {
    v1::JobConfig config = common::DefaultJobConfig(64, 1);
    config.set_alpha(0.7f);
    config.set_beta(0.5f);
    config.set_momentum(c.momentum);
    config.set_momentum_period(c.period);
    config.set_gap_penalty(c.penalty);
    config.set_penalty_lambda(2.0f);
    CO2_ASSERT_OK(common::ValidateJobConfig(config));
    const server::OuterConfig outer = server::OuterConfigOf(config);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint64_t round = 0; round < 6; ++round) {
      SCOPED_TRACE(absl::StrCat(v1::Momentum_Name(c.momentum), " ",
                                v1::GapPenalty_Name(c.penalty), " round ",
                                round));
      std::vector<float> d(64), m0(64), gap(64, 0.0f);
      for (size_t j = 0; j < 64; ++j) {
        d[j] = normal(rng);
        m0[j] = normal(rng);
      }
      constexpr float kH = 0x1p-6f;
      std::vector<float> d_h = d;
      for (float& v : d_h) v += kH;
      std::vector<float> m1 = m0, m2 = m0, u1(64), u2(64);
      server::OuterStep(outer, round, d, gap, absl::MakeSpan(m1),
                        absl::MakeSpan(u1));
      server::OuterStep(outer, round, d_h, gap, absl::MakeSpan(m2),
                        absl::MakeSpan(u2));
      const float want = client::EagerScale(config, round);
      for (size_t j = 0; j < 64; ++j) {
        ASSERT_NEAR((u1[j] - u2[j]) / kH, want, 1e-3f) << "element " << j;
      }
    }
  }
}

struct Trainer {
  absl::Status status;
  std::vector<float> anchor;
  uint64_t rounds_checked = 0;
  double largest_offset = 0;  // max |x − A| at a round's start
};

// Worker `worker` through AnchorExchange with eager updates, one step per
// round (its progress is Delta(worker, round, ·)). After every boundary the
// start point must be A + e with e = −k·share·(Δ_r − Δ_{r−1}), Δ_r what it
// pushed: (A + e_r) − x, as the exchange computes it.
void Train(const E2eSpec& spec, const Cluster& cluster,
           const v1::JobConfig& config, int worker, double share,
           Barrier& joined, Trainer& out) {
  std::vector<float> x = InitialAnchor(spec.params);
  const client::ClientOptions options =
      WorkerOptions(cluster.addresses(), "eager", config, worker);
  auto connected =
      ConnectWithEveryone(options, absl::MakeSpan(x), joined, kTimeout);
  if (!connected.ok()) {
    out.status = connected.status();
    return;
  }
  client::AnchorExchangeOptions eo = ExchangeOptions(spec, worker, kTimeout);
  eo.eager_share = share;
  auto exchange = client::AnchorExchange::Create(eo, *std::move(connected), x);
  if (!exchange.ok()) {
    out.status = exchange.status();
    return;
  }
  const size_t n = spec.params;
  std::vector<float> start = x, last_delta(n, 0.0f), delta(n);
  for (uint64_t round = 0; round < spec.rounds; ++round) {
    for (size_t j = 0; j < n; ++j) x[j] = start[j] - Delta(worker, round, j);
    for (size_t j = 0; j < n; ++j) delta[j] = start[j] - x[j];
    client::ExchangeTimes times;
    out.status = (*exchange)->Boundary(round, 1, absl::MakeSpan(x), times);
    if (!out.status.ok()) return;
    const float k = client::EagerScale(config, round == 0 ? 0 : round - 1) *
                    static_cast<float>(share);
    const std::vector<float>& a = (*exchange)->anchor();
    for (size_t j = 0; j < n; ++j) {
      const float e = -k * (delta[j] - last_delta[j]);
      if (x[j] != a[j] + e) {
        out.status = absl::InternalError(
            absl::StrCat("round ", round, " starts at ", x[j], " in element ",
                         j, ", not A + e = ", a[j], " + ", e));
        return;
      }
      out.largest_offset = std::max<double>(out.largest_offset, std::fabs(e));
    }
    start = x;
    last_delta = delta;
    ++out.rounds_checked;
  }
  const std::optional<uint64_t> owed =
      client::OwedUpdate((*exchange)->staleness(), spec.rounds, spec.rounds);
  client::ExchangeTimes times;
  if (owed) out.status = (*exchange)->Drain(*owed, absl::MakeSpan(x), times);
  if (out.status.ok()) {
    out.status = (*exchange)->VerifyAnchor(spec.rounds + 1);
  }
  out.anchor = x;
  (*exchange)->Leave();
}

TEST(EagerE2eTest, EachRoundStartsAtTheAnchorPlusTheEagerOffset) {
  E2eSpec spec;
  spec.params = common::kChunkElements + 77;
  spec.shards = 2;
  spec.workers = 2;
  spec.rounds = 6;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_momentum(v1::MOMENTUM_NESTEROV);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  Barrier joined(spec.workers);
  std::vector<Trainer> trainers(spec.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < spec.workers; ++w) {
    threads.emplace_back([&, w] {
      Train(spec, cluster, config, w, 1.0 / spec.workers, joined, trainers[w]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < spec.workers; ++w) {
    SCOPED_TRACE(absl::StrCat("worker ", w));
    CO2_ASSERT_OK(trainers[w].status);
    EXPECT_EQ(trainers[w].rounds_checked, spec.rounds);
    EXPECT_GT(trainers[w].largest_offset, 0.0) << "no eager offset was taken";
    // The final model is the shards' anchor, the same on every worker.
    EXPECT_EQ(trainers[w].anchor, trainers[0].anchor);
  }
}

TEST(EagerE2eTest, IsRefusedForASynchronousJob) {
  E2eSpec spec;
  spec.params = 1000;
  spec.shards = 1;
  spec.workers = 1;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_max_staleness(0);
  Cluster cluster(spec.shards);
  std::vector<float> x = InitialAnchor(spec.params);
  auto connected = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "sync", config, 0), absl::MakeSpan(x));
  CO2_ASSERT_OK(connected);
  client::AnchorExchangeOptions eo;
  eo.eager_share = 1.0;
  auto exchange = client::AnchorExchange::Create(eo, *std::move(connected), x);
  EXPECT_EQ(exchange.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(exchange.status().message().find("eager updates need a "
                                             "one-round-stale job"),
            std::string::npos)
      << exchange.status();
}

}  // namespace
}  // namespace co2::testing
