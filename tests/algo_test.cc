#include "client/algo.h"

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

constexpr Algo kAll[] = {Algo::kCo2, Algo::kDdp, Algo::kLocalSgd, Algo::kSlowMo,
                         Algo::kDiLoCo};

TEST(AlgoTest, NamesRoundTrip) {
  for (Algo algo : kAll) {
    const absl::StatusOr<Algo> parsed = ParseAlgo(AlgoName(algo));
    CO2_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, algo);
  }
  const absl::Status bad = ParseAlgo("sgd").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("diloco"), std::string::npos) << bad;
}

TEST(AlgoTest, OnlyCo2RunsOneRoundStale) {
  for (Algo algo : kAll) {
    EXPECT_EQ(StalenessOf(algo), algo == Algo::kCo2 ? 1u : 0u)
        << AlgoName(algo);
  }
}

TEST(AlgoTest, OnlyNonDeterministicCo2AppliesOnArrival) {
  EXPECT_EQ(*ParseApplyAt("boundary"), ApplyAt::kBoundary);
  EXPECT_EQ(*ParseApplyAt("arrival"), ApplyAt::kArrival);
  for (ApplyAt apply : {ApplyAt::kBoundary, ApplyAt::kArrival}) {
    EXPECT_EQ(*ParseApplyAt(ApplyAtName(apply)), apply);
  }
  const absl::Status bad = ParseApplyAt("eager").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'eager'"), std::string::npos) << bad;
  for (Algo algo : kAll) {
    for (const bool deterministic : {false, true}) {
      SCOPED_TRACE(absl::StrCat(AlgoName(algo), " deterministic ",
                                deterministic));
      CO2_EXPECT_OK(CheckApplyAt(algo, ApplyAt::kBoundary, deterministic));
      const absl::Status arrival =
          CheckApplyAt(algo, ApplyAt::kArrival, deterministic);
      const ApplyAt unset = DefaultApplyAt(algo, deterministic);
      CO2_EXPECT_OK(CheckApplyAt(algo, unset, deterministic));
      if (algo == Algo::kCo2 && !deterministic) {
        CO2_EXPECT_OK(arrival);
        EXPECT_EQ(unset, ApplyAt::kArrival);
        continue;
      }
      EXPECT_EQ(unset, ApplyAt::kBoundary);
      EXPECT_EQ(arrival.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(arrival.message().find(algo == Algo::kCo2
                                           ? "not for a deterministic job"
                                           : AlgoName(algo)),
                std::string::npos)
          << arrival;
    }
  }
}

// apply_by_step bounds an arrival's step: 0, or a step inside the round.
TEST(AlgoTest, ApplyByStepIsAStepInsideTheRoundAndOnlyForArrival) {
  for (ApplyAt apply : {ApplyAt::kBoundary, ApplyAt::kArrival}) {
    CO2_EXPECT_OK(CheckApplyBy(apply, 0, 16));
  }
  for (int by : {1, 8, 15}) {
    CO2_EXPECT_OK(CheckApplyBy(ApplyAt::kArrival, by, 16)) << by;
  }
  for (int by : {-1, 16, 17}) {
    const absl::Status s = CheckApplyBy(ApplyAt::kArrival, by, 16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << by;
    EXPECT_NE(s.message().find(absl::StrCat("is ", by, ": must be between 1 "
                                            "and tau - 1 = 15")),
              std::string::npos)
        << s;
  }
  const absl::Status boundary = CheckApplyBy(ApplyAt::kBoundary, 4, 16);
  EXPECT_EQ(boundary.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(boundary.message().find("with apply=boundary"), std::string::npos)
      << boundary;
}

// co2 without eager updates carries its progress unless told otherwise;
// eager updates take its place, and the synchronous algorithms have no
// stale average to stand in for.
TEST(AlgoTest, OnlyCo2WithoutEagerUpdatesCarriesProgressByDefault) {
  for (Algo algo : kAll) {
    SCOPED_TRACE(AlgoName(algo));
    EXPECT_EQ(DefaultCarryProgress(algo, false), algo == Algo::kCo2);
    EXPECT_FALSE(DefaultCarryProgress(algo, true));
  }
  EXPECT_EQ(OuterDefaultsOf(Algo::kCo2).alpha, 1.0f);
  EXPECT_EQ(OuterDefaultsOf(Algo::kCo2).beta, 0.0f);
}

// What each algorithm fixes, from a config that sets everything otherwise.
TEST(AlgoTest, ApplyAlgoFixesWhatTheAlgorithmIs) {
  v1::JobConfig user = common::DefaultJobConfig(1000, 1);
  user.set_alpha(0.3f);
  user.set_beta(0.6f);
  user.set_momentum(v1::MOMENTUM_HEAVY_BALL);
  user.set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
  user.set_clip(v1::CLIP_ADAPTIVE);
  user.set_max_staleness(3);

  v1::JobConfig co2 = user;
  ApplyAlgo(Algo::kCo2, co2);
  EXPECT_EQ(co2.max_staleness(), 1u);
  EXPECT_EQ(co2.gap_penalty(), v1::GAP_PENALTY_GAP_AWARE);
  EXPECT_EQ(co2.clip(), v1::CLIP_ADAPTIVE);

  v1::JobConfig localsgd = user;
  ApplyAlgo(Algo::kLocalSgd, localsgd);
  EXPECT_EQ(localsgd.max_staleness(), 0u);
  EXPECT_EQ(localsgd.alpha(), 1.0f);
  EXPECT_EQ(localsgd.beta(), 0.0f);
  EXPECT_EQ(localsgd.gap_penalty(), v1::GAP_PENALTY_NONE);
  EXPECT_EQ(localsgd.clip(), v1::CLIP_NONE);

  v1::JobConfig diloco = user;
  ApplyAlgo(Algo::kDiLoCo, diloco);
  EXPECT_EQ(diloco.max_staleness(), 0u);
  EXPECT_EQ(diloco.momentum(), v1::MOMENTUM_NESTEROV);
  EXPECT_EQ(diloco.alpha(), 0.3f);  // the user's outer settings stay
  EXPECT_EQ(diloco.beta(), 0.6f);
  EXPECT_EQ(diloco.gap_penalty(), v1::GAP_PENALTY_NONE);
  EXPECT_EQ(diloco.clip(), v1::CLIP_NONE);
  CO2_EXPECT_OK(common::ValidateJobConfig(diloco));
}

TEST(AlgoTest, DiLoCoDefaultsAreThePublishedOnes) {
  EXPECT_EQ(OuterDefaultsOf(Algo::kDiLoCo).alpha, 0.7f);
  EXPECT_EQ(OuterDefaultsOf(Algo::kDiLoCo).beta, 0.9f);
  const v1::JobConfig defaults = common::DefaultJobConfig(1000, 1);
  for (Algo algo : {Algo::kCo2, Algo::kLocalSgd, Algo::kSlowMo}) {
    EXPECT_EQ(OuterDefaultsOf(algo).alpha, defaults.alpha()) << AlgoName(algo);
    EXPECT_EQ(OuterDefaultsOf(algo).beta, defaults.beta()) << AlgoName(algo);
  }
}

}  // namespace
}  // namespace co2::client
