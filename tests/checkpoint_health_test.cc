#include "server/job/checkpoint_health.h"

#include <cerrno>
#include <optional>
#include <string>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/storage/durable_file.h"

namespace co2::server {
namespace {

using ::testing::HasSubstr;

const absl::Status kFull = ErrnoStatus("cannot write", "/ckpt/j.ckpt.tmp", ENOSPC);

// A failing disk retried every second for `seconds`: how many lines it logs.
int LinesOver(CheckpointHealth& health, common::FakeClock& clock, int seconds) {
  int lines = 0;
  for (int s = 0; s < seconds; ++s) {
    if (health.Failed("checkpoint of round 3", kFull, clock.Now())) ++lines;
    clock.Advance(absl::Seconds(1));
  }
  return lines;
}

TEST(CheckpointHealthTest, TheFirstFailureIsLoggedWithItsCause) {
  common::FakeClock clock;
  CheckpointHealth health(absl::Seconds(60));
  EXPECT_FALSE(health.failing());
  EXPECT_EQ(health.held(), "");
  const std::optional<std::string> line =
      health.Failed("checkpoint of round 3", kFull, clock.Now());
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line,
            "checkpoint of round 3 failed, update held: RESOURCE_EXHAUSTED: "
            "cannot write /ckpt/j.ckpt.tmp: No space left on device");
  EXPECT_TRUE(health.failing());
  EXPECT_EQ(health.held(), "checkpoint failing: No space left on device");
}

TEST(CheckpointHealthTest, RetriesLogOneLinePerIntervalWithTheirCount) {
  common::FakeClock clock;
  CheckpointHealth health(absl::Seconds(60));
  // Failures at 0..179 s: lines at 0, 60 and 120 s.
  EXPECT_EQ(LinesOver(health, clock, 180), 3);
  const std::optional<std::string> line =
      health.Failed("checkpoint of round 3", kFull, clock.Now());  // 180 s
  ASSERT_TRUE(line.has_value());
  EXPECT_THAT(*line, HasSubstr("No space left on device (60 failed write(s) "
                               "since 1m ago; failing for 3m)"));
}

TEST(CheckpointHealthTest, ASuccessIsLoggedOnceAndClearsTheReason) {
  common::FakeClock clock;
  CheckpointHealth health(absl::Seconds(60));
  EXPECT_EQ(health.Succeeded(clock.Now()), std::nullopt) << "nothing failed";
  LinesOver(health, clock, 90);
  clock.Advance(absl::Milliseconds(250));  // lines count whole seconds
  const std::optional<std::string> line = health.Succeeded(clock.Now());
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line,
            "checkpoint writes succeed again after 90 failed write(s) over "
            "1m30s; held updates go out");
  EXPECT_FALSE(health.failing());
  EXPECT_EQ(health.held(), "");
  EXPECT_EQ(health.Succeeded(clock.Now()), std::nullopt);
  // Failing again starts over: its first failure is logged at once.
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(LinesOver(health, clock, 1), 1);
}

TEST(CheckpointHealthTest, TheReasonFollowsTheLastFailure) {
  common::FakeClock clock;
  CheckpointHealth health(absl::Seconds(60));
  health.Failed("checkpoint of round 3", kFull, clock.Now());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(health.Failed("checkpoint of round 3",
                          ErrnoStatus("cannot fsync", "/ckpt/j", EIO),
                          clock.Now()),
            std::nullopt);
  EXPECT_EQ(health.held(), "checkpoint failing: Input/output error");
  EXPECT_EQ(CheckpointHealth(absl::Seconds(1)).held(), "");
  health.Failed("checkpoint of round 3", absl::DataLossError("unreadable"),
                clock.Now());
  EXPECT_EQ(health.held(), "checkpoint failing: unreadable");
}

}  // namespace
}  // namespace co2::server
