#include "common/job_config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::common {
namespace {

TEST(JobConfigTest, DefaultIsValid) {
  CO2_EXPECT_OK(ValidateJobConfig(DefaultJobConfig(70000, 2)));
}

struct BadField {
  std::string name;
  std::function<void(v1::JobConfig*)> break_it;
  std::string expected;  // part of the message
};

class JobConfigBadFieldTest : public ::testing::TestWithParam<BadField> {};

TEST_P(JobConfigBadFieldTest, IsRejectedNamingTheField) {
  v1::JobConfig config = DefaultJobConfig(70000, 2);
  GetParam().break_it(&config);
  const absl::Status s = ValidateJobConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(GetParam().expected), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, JobConfigBadFieldTest,
    ::testing::Values(
        BadField{"version", [](auto* c) { c->set_protocol_version(7); },
                 "protocol_version must be 2, got 7"},
        BadField{"params", [](auto* c) { c->set_num_parameters(0); },
                 "num_parameters"},
        BadField{"alpha", [](auto* c) { c->set_alpha(-1); },
                 "alpha must be finite and > 0, got -1"},
        BadField{"beta", [](auto* c) { c->set_beta(1.0f); },
                 "beta must be in [0, 1), got 1"},
        BadField{"lambda",
                 [](auto* c) {
                   c->set_gap_penalty(v1::GAP_PENALTY_CONSTANT);
                   c->set_penalty_lambda(0.5f);
                 },
                 "penalty_lambda must be finite and >= 1, got 0.5"},
        BadField{"clip",
                 [](auto* c) {
                   c->set_clip(v1::CLIP_ADAPTIVE);
                   c->set_clip_value(0);
                 },
                 "clip_value"},
        BadField{"codec", [](auto* c) { c->set_downlink_codec(v1::Codec(9)); },
                 "downlink_codec must be FP32, BF16 or INT8, got 9"},
        BadField{"staleness", [](auto* c) { c->set_max_staleness(2); },
                 "max_staleness must be 0 or 1, got 2"},
        BadField{"penalty",
                 [](auto* c) { c->set_gap_penalty(v1::GapPenalty(0)); },
                 "gap_penalty"},
        // Non-finite values are refused in fields the config does not use.
        BadField{"unused_lambda_nan",
                 [](auto* c) {
                   c->set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
                   c->set_penalty_lambda(std::nanf(""));
                 },
                 "penalty_lambda must be finite (even when unused), got nan"},
        BadField{"unused_clip_inf",
                 [](auto* c) {
                   c->set_clip(v1::CLIP_NONE);
                   c->set_clip_value(std::numeric_limits<float>::infinity());
                 },
                 "clip_value must be finite (even when unused), got inf"},
        BadField{"beta_nan", [](auto* c) { c->set_beta(std::nanf("")); },
                 "beta must be finite"},
        BadField{"outlier_ratio_nan",
                 [](auto* c) { c->set_outlier_ratio(std::nanf("")); },
                 "outlier_ratio must be finite (even when unused), got nan"},
        BadField{"outlier_ratio_negative",
                 [](auto* c) { c->set_outlier_ratio(-2.5f); },
                 "outlier_ratio must be >= 0 (0: off), got -2.5"},
        BadField{"momentum", [](auto* c) { c->set_momentum(v1::Momentum(9)); },
                 "momentum must be HEAVY_BALL, NESTEROV or DELAYED_NESTEROV, "
                 "got 9"},
        BadField{
            "no_period",
            [](auto* c) { c->set_momentum(v1::MOMENTUM_DELAYED_NESTEROV); },
            "momentum_period must be >= 1 with DELAYED_NESTEROV"},
        BadField{"unused_period",
                 [](auto* c) {
                   c->set_momentum(v1::MOMENTUM_NESTEROV);
                   c->set_momentum_period(4);
                 },
                 "momentum_period must be 0 unless momentum is "
                 "DELAYED_NESTEROV, got 4"}),
    [](const auto& info) { return info.param.name; });

TEST(JobConfigTest, EveryShardNeedsABlock) {
  // 65536 + 1 parameters make two blocks: two shards, not three.
  CO2_EXPECT_OK(ValidateJobConfig(DefaultJobConfig(65537, 2)));
  const absl::Status three = ValidateJobConfig(DefaultJobConfig(65537, 3));
  EXPECT_EQ(three.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.message().find("num_shards 3 is more than the 2 block(s)"),
            std::string::npos)
      << three;
  EXPECT_FALSE(ValidateJobConfig(DefaultJobConfig(1000, 2)).ok());
  CO2_EXPECT_OK(ValidateJobConfig(DefaultJobConfig(1000, 1)));
}

TEST(JobConfigTest, MismatchNamesTheField) {
  v1::JobConfig job = DefaultJobConfig(70000, 2);
  v1::JobConfig other = job;
  CO2_EXPECT_OK(CheckSameJobConfig(job, other));
  other.set_beta(0.9f);
  const absl::Status s = CheckSameJobConfig(job, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("beta"), std::string::npos) << s;
}

TEST(JobConfigTest, ParsesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(*ParseGapPenalty("gap_aware"), v1::GAP_PENALTY_GAP_AWARE);
  EXPECT_EQ(*ParseClip("value"), v1::CLIP_VALUE);
  EXPECT_EQ(*ParseMomentum("nesterov"), v1::MOMENTUM_NESTEROV);
  EXPECT_EQ(*ParseMomentum("delayed_nesterov"), v1::MOMENTUM_DELAYED_NESTEROV);
  const absl::Status s = ParseClip("sometimes").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"sometimes\""), std::string::npos) << s;
}

}  // namespace
}  // namespace co2::common
