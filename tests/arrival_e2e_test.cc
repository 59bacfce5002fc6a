// Apply on arrival (AnchorExchange::ApplyArrived, ApplyDue, ApplyOwed): over
// real gRPC against in-process shards, workers that apply the update a round
// owes between its inner steps keep the steps taken before it
// (x ← (x − A_old) + A_new), push the same progress as workers that apply it
// at the boundary (up to the rounding of that shift), and every worker ends
// on the shards' anchor bit for bit, on the reference trajectory. With
// carried progress a round starts from A + e, e = −k·Δ of the round before,
// and applying the update drops e: x ← (x − (A_old + e)) + A_new.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "client/anchor_exchange.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"

namespace co2::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int kTau = 3;

struct Trainer {
  absl::Status status;
  std::vector<float> anchor;
  uint64_t applied_early = 0;  // rounds whose update ApplyArrived applied
  uint64_t carried = 0;        // boundaries whose start offset was checked
  double largest_offset = 0;   // max |e| at a round's start
};

// With carried progress, after the boundary of `round` that pushed from
// `start` (A + e as the push saw it) and x = `before`: e = −k·Δ_r with
// Δ_r = start − before and k = EagerScale(config, round), and x = A + e.
absl::Status CheckCarried(const client::AnchorExchange& ex,
                          const v1::JobConfig& config, uint64_t round,
                          const std::vector<float>& start,
                          const std::vector<float>& before,
                          const std::vector<float>& x, Trainer& out) {
  const float k = client::EagerScale(config, round);
  const std::vector<float>& a = ex.anchor();
  const absl::Span<const float> e = ex.start_offset();
  if (e.size() != x.size()) {
    return absl::InternalError(absl::StrCat("the start offset holds ",
                                            e.size(), " elements"));
  }
  for (size_t j = 0; j < x.size(); ++j) {
    const float want = -k * (start[j] - before[j]);
    if (e[j] != want || x[j] != a[j] + e[j]) {
      return absl::InternalError(absl::StrCat(
          "round ", round + 1, " element ", j, ": starts at ", x[j],
          " with offset ", e[j], ", not A + e = ", a[j], " + ", want));
    }
    out.largest_offset = std::max<double>(out.largest_offset, std::fabs(e[j]));
  }
  ++out.carried;
  return absl::OkStatus();
}

// Worker `worker` through AnchorExchange, kTau inner steps per round: the
// first takes its whole progress, x −= Delta(worker, round); with `arrival`
// it then waits until the round's owed update is here (without applying it)
// and applies it with ApplyArrived: x must be (x − A_old) + A_new, bit for
// bit; the remaining steps change nothing. The boundary pushes A − x. With
// `carry` (carried progress) the round's start is A + e: the apply must
// give (x − (A_old + e)) + A_new and e = 0, the boundary CheckCarried.
void Train(const E2eSpec& spec, const Cluster& cluster,
           const v1::JobConfig& config, int worker, bool arrival, bool carry,
           Barrier& joined, Trainer& out) {
  std::vector<float> x = InitialAnchor(spec.params);
  auto connected = ConnectWithEveryone(
      WorkerOptions(cluster.addresses(), "arrival", config, worker),
      absl::MakeSpan(x), joined, kTimeout);
  if (!connected.ok()) {
    out.status = connected.status();
    return;
  }
  client::AnchorExchangeOptions eo = ExchangeOptions(spec, worker, kTimeout);
  eo.carry_progress = carry;
  auto exchange =
      client::AnchorExchange::Create(eo, *std::move(connected), x);
  if (!exchange.ok()) {
    out.status = exchange.status();
    return;
  }
  client::AnchorExchange& ex = **exchange;
  // e as a span: empty without carried progress.
  const auto offset = [&ex](size_t j) {
    return ex.start_offset().empty() ? 0.0f : ex.start_offset()[j];
  };
  const size_t n = spec.params;
  for (uint64_t round = 0; round < spec.rounds; ++round) {
    for (size_t j = 0; j < n; ++j) x[j] -= Delta(worker, round, j);
    const std::optional<uint64_t> owed =
        client::OwedUpdate(ex.staleness(), spec.rounds, round);
    client::ExchangeTimes times;
    if (arrival && owed) {
      const std::vector<float> before = x, anchor_before = ex.anchor();
      std::vector<float> offset_before(n);
      for (size_t j = 0; j < n; ++j) offset_before[j] = offset(j);
      out.status = ex.AwaitUpdate(*owed, times);
      if (!out.status.ok()) return;
      if (!ex.UpdateArrived(round)) {
        out.status = absl::InternalError(
            absl::StrCat("round ", round, ": the awaited update is not seen "
                         "as arrived"));
        return;
      }
      out.status = ex.ApplyArrived(round, absl::MakeSpan(x), times);
      if (!out.status.ok()) return;
      const std::vector<float>& a = ex.anchor();
      for (size_t j = 0; j < n; ++j) {
        const float kept = carry
                               ? (before[j] - (anchor_before[j] + offset_before[j])) + a[j]
                               : (before[j] - anchor_before[j]) + a[j];
        if (x[j] != kept || offset(j) != 0.0f) {
          out.status = absl::InternalError(absl::StrCat(
              "round ", round, " element ", j, ": x is ", x[j], " and e ",
              offset(j), " after the update, not (x − s) + A_new = ", kept,
              " and 0"));
          return;
        }
      }
      if (a == anchor_before) {
        out.status = absl::InternalError(
            absl::StrCat("round ", round, ": ApplyArrived left A as it was"));
        return;
      }
      if (ex.UpdateArrived(round)) {
        out.status = absl::InternalError(absl::StrCat(
            "round ", round, ": the update is still arrived after applying it"));
        return;
      }
      ++out.applied_early;
    }
    std::vector<float> start(n);
    for (size_t j = 0; j < n; ++j) start[j] = ex.anchor()[j] + offset(j);
    const std::vector<float> before = x;
    out.status = ex.Boundary(round, kTau, absl::MakeSpan(x), times);
    if (!out.status.ok()) return;
    if (carry) {
      out.status = CheckCarried(ex, config, round, start, before, x, out);
      if (!out.status.ok()) return;
    }
  }
  const std::optional<uint64_t> owed =
      client::OwedUpdate(ex.staleness(), spec.rounds, spec.rounds);
  client::ExchangeTimes times;
  if (owed) out.status = ex.Drain(*owed, absl::MakeSpan(x), times);
  if (out.status.ok()) out.status = ex.VerifyAnchor(spec.rounds + 1);
  out.anchor = x;
  ex.Leave();
}

struct Mode {
  bool arrival = false;
  bool carry = false;
};

// Three workers in `modes` train 8 rounds against two in-process shards;
// the shards must end on the reference trajectory and every worker on
// their anchor. Returns the workers' results.
std::vector<Trainer> TrainOnTheReferenceTrajectory(
    const std::vector<Mode>& modes) {
  E2eSpec spec;
  spec.params = 2 * common::kChunkElements + 77;
  spec.shards = 2;
  spec.workers = static_cast<int>(modes.size());
  spec.rounds = 8;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  Barrier joined(spec.workers);
  std::vector<Trainer> trainers(spec.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < spec.workers; ++w) {
    threads.emplace_back([&, w] {
      Train(spec, cluster, config, w, modes[w].arrival, modes[w].carry,
            joined, trainers[w]);
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("arrival", &round);
  EXPECT_EQ(round, spec.rounds + 1);
  // The shifted x rounds, so Δ is the progress to within an ulp of A: the
  // trajectory is the reference's to rounding, far closer than one update
  // (a missed or doubled update would be ~1e-3 off).
  const std::vector<float> reference = ReferenceAnchor(spec, config);
  EXPECT_EQ(shards.size(), reference.size());
  double off = 0, moved = 0;
  for (size_t j = 0; j < shards.size() && j < reference.size(); ++j) {
    off = std::max<double>(off, std::fabs(shards[j] - reference[j]));
    moved += std::fabs(reference[j] - Initial(j));
  }
  EXPECT_LT(off, 1e-5) << "the shards left the reference trajectory";
  EXPECT_GT(moved, 1.0);
  for (int w = 0; w < spec.workers; ++w) {
    SCOPED_TRACE(absl::StrCat("worker ", w));
    CO2_EXPECT_OK(trainers[w].status);
    EXPECT_TRUE(trainers[w].anchor == shards)
        << "the final model is not the shards' anchor";
  }
  return trainers;
}

TEST(ArrivalE2eTest, WorkersApplyingOnArrivalEndOnTheReferenceAnchor) {
  // Workers 0 and 1 apply on arrival, worker 2 at the boundary.
  const std::vector<Trainer> trainers = TrainOnTheReferenceTrajectory(
      {Mode{/*arrival=*/true, /*carry=*/false}, Mode{true, false},
       Mode{false, false}});
  const std::vector<uint64_t> early = {7, 7, 0};
  for (size_t w = 0; w < trainers.size(); ++w) {
    EXPECT_EQ(trainers[w].applied_early, early[w]) << "worker " << w;
  }
}

// Carried progress, applied on arrival (worker 0) and at the boundary
// (worker 1), next to a worker without it (2): every round starts from
// A + e, the update drops e, and the shards stay on the reference
// trajectory, since each Δ is still the worker's own progress.
TEST(ArrivalE2eTest, CarriedProgressStartsEachRoundFromTheWorkersOwnStep) {
  const std::vector<Trainer> trainers = TrainOnTheReferenceTrajectory(
      {Mode{/*arrival=*/true, /*carry=*/true}, Mode{false, true},
       Mode{true, false}});
  const std::vector<uint64_t> early = {7, 0, 7}, carried = {8, 8, 0};
  for (size_t w = 0; w < trainers.size(); ++w) {
    SCOPED_TRACE(absl::StrCat("worker ", w));
    EXPECT_EQ(trainers[w].applied_early, early[w]);
    EXPECT_EQ(trainers[w].carried, carried[w]);
    EXPECT_EQ(trainers[w].largest_offset > 0.0, carried[w] > 0);
  }
}

// Create's status for the one worker of a fresh two-round job, synchronous
// (max_staleness 0) or not, with its options changed by `set`.
absl::Status CreateStatus(
    bool synchronous,
    const std::function<void(client::AnchorExchangeOptions&)>& set) {
  // params, shards, workers, rounds
  const E2eSpec spec{1000, 1, 1, 2};
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_rounds(spec.rounds);
  if (synchronous) config.set_max_staleness(0);
  Cluster cluster(spec.shards);
  std::vector<float> x = InitialAnchor(spec.params);
  auto connected = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "create", config, 0),
      absl::MakeSpan(x));
  if (!connected.ok()) return connected.status();
  client::AnchorExchangeOptions eo = ExchangeOptions(spec, 0, kTimeout);
  set(eo);
  return client::AnchorExchange::Create(eo, *std::move(connected), x)
      .status();
}

TEST(ArrivalE2eTest, CarriedProgressIsRefusedWithEagerUpdatesOrASynchronousJob) {
  for (const bool synchronous : {false, true}) {
    SCOPED_TRACE(synchronous ? "staleness 0" : "with eager updates");
    const absl::Status created =
        CreateStatus(synchronous, [&](client::AnchorExchangeOptions& eo) {
          eo.carry_progress = true;
          if (!synchronous) eo.eager_share = 1.0;
        });
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(created.message().find(
                  "carried progress needs a one-round-stale job"),
              std::string::npos)
        << created;
  }
}

TEST(ArrivalE2eTest, ABoundIsRefusedBelowOneOrInASynchronousJob) {
  for (const int by : {-1, 1}) {
    SCOPED_TRACE(absl::StrCat("apply_by_step ", by));
    const absl::Status created = CreateStatus(
        /*synchronous=*/by > 0,
        [&](client::AnchorExchangeOptions& eo) { eo.apply_by_step = by; });
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(created.message().find(absl::StrCat("apply_by_step is ", by)),
              std::string::npos)
        << created;
  }
}

// A worker bounding how late it applies an update (apply_by_step 2) owes one
// that cannot have arrived yet (worker 1 has not pushed the round it is made
// from): it is not due after step 1, it is after step 2, and ApplyOwed waits
// for it there, then applies it keeping the steps taken; both workers end
// on the same anchor.
TEST(ArrivalE2eTest, ApplyOwedWaitsFromTheBoundForAnUpdateNotYetArrived) {
  // params, shards, workers, rounds
  const E2eSpec spec{common::kChunkElements + 77, 1, 2, 2};
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  std::vector<std::vector<float>> x(2, InitialAnchor(spec.params));
  std::vector<std::unique_ptr<client::AnchorExchange>> ex;
  for (int w = 0; w < 2; ++w) {
    auto connected = client::AggregatorClient::Connect(
        WorkerOptions(cluster.addresses(), "await", config, w),
        absl::MakeSpan(x[w]));
    CO2_ASSERT_OK(connected);
    client::AnchorExchangeOptions eo = ExchangeOptions(spec, w, kTimeout);
    if (w == 0) eo.apply_by_step = 2;
    auto exchange =
        client::AnchorExchange::Create(eo, *std::move(connected), x[w]);
    CO2_ASSERT_OK(exchange);
    ex.push_back(*std::move(exchange));
  }
  const auto step = [&](int w, uint64_t round) {
    for (size_t j = 0; j < x[w].size(); ++j) x[w][j] -= Delta(w, round, j);
  };
  client::ExchangeTimes times;
  step(0, 0);
  CO2_ASSERT_OK(ex[0]->Boundary(0, kTau, absl::MakeSpan(x[0]), times));
  step(0, 1);
  ASSERT_FALSE(ex[0]->UpdateArrived(1));
  EXPECT_FALSE(ex[0]->ApplyDue(1, 1)) << "due before the bound, not back";
  ASSERT_TRUE(ex[0]->ApplyDue(1, 2));
  const std::vector<float> before = x[0], anchor_before = ex[0]->anchor();
  absl::Status applied;
  std::thread waiter([&] {
    applied = ex[0]->ApplyOwed(1, 2, absl::MakeSpan(x[0]), times);
  });
  step(1, 0);
  const absl::Status pushed =
      ex[1]->Boundary(0, kTau, absl::MakeSpan(x[1]), times);
  waiter.join();
  CO2_ASSERT_OK(pushed);
  CO2_ASSERT_OK(applied);
  const std::vector<float>& a = ex[0]->anchor();
  EXPECT_FALSE(a == anchor_before) << "ApplyOwed left A as it was";
  for (size_t j = 0; j < a.size(); ++j) {
    ASSERT_EQ(x[0][j], (before[j] - anchor_before[j]) + a[j])
        << "element " << j << ": the step taken before the update was lost";
  }
  EXPECT_FALSE(ex[0]->ApplyDue(1, 3));
  const absl::Status again =
      ex[0]->ApplyOwed(1, 3, absl::MakeSpan(x[0]), times);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  step(1, 1);
  for (int w = 0; w < 2; ++w) {
    CO2_ASSERT_OK(ex[w]->Boundary(1, kTau, absl::MakeSpan(x[w]), times));
  }
  const std::optional<uint64_t> last =
      client::OwedUpdate(ex[0]->staleness(), spec.rounds, spec.rounds);
  ASSERT_TRUE(last.has_value());
  for (int w = 0; w < 2; ++w) {
    CO2_ASSERT_OK(ex[w]->Drain(*last, absl::MakeSpan(x[w]), times));
  }
  EXPECT_TRUE(x[0] == x[1]) << "the workers end on different anchors";
  for (int w = 0; w < 2; ++w) ex[w]->Leave();
}

TEST(ArrivalE2eTest, NothingArrivedIsRefused) {
  E2eSpec spec;
  spec.params = 1000;
  spec.shards = 1;
  spec.workers = 1;
  spec.rounds = 2;
  v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  config.set_rounds(spec.rounds);
  Cluster cluster(spec.shards);
  std::vector<float> x = InitialAnchor(spec.params);
  auto connected = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), "early", config, 0), absl::MakeSpan(x));
  CO2_ASSERT_OK(connected);
  auto exchange = client::AnchorExchange::Create(
      ExchangeOptions(spec, 0, kTimeout), *std::move(connected), x);
  CO2_ASSERT_OK(exchange);
  // Round 0 owes no update.
  EXPECT_FALSE((*exchange)->UpdateArrived(0));
  client::ExchangeTimes times;
  const absl::Status refused =
      (*exchange)->ApplyArrived(0, absl::MakeSpan(x), times);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no arrived update"), std::string::npos)
      << refused;
  EXPECT_TRUE(x == InitialAnchor(spec.params)) << "a refused apply changed x";
}

}  // namespace
}  // namespace co2::testing
