#include "server/job/round_deadline.h"

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

RoundDeadlineOptions Adaptive() {
  RoundDeadlineOptions o;
  o.adaptive = true;
  o.factor = 4.0;
  o.quantile = 0.95;
  o.window = 20;
  o.min_samples = 5;
  o.floor = absl::Seconds(2);
  return o;
}

TEST(RoundDeadlineTest, FixedIsAlwaysTheRoundTimeout) {
  RoundDeadline fixed(RoundDeadlineOptions{}, absl::Seconds(60));
  for (int i = 0; i < 50; ++i) fixed.Observe(absl::Milliseconds(100));
  EXPECT_EQ(fixed.Current(), absl::Seconds(60));
}

TEST(RoundDeadlineTest, AdaptsOnlyAfterMinSamples) {
  RoundDeadline d(Adaptive(), absl::Seconds(60));
  for (int i = 0; i < 4; ++i) {
    d.Observe(absl::Seconds(1));
    EXPECT_EQ(d.Current(), absl::Seconds(60)) << i;
  }
  d.Observe(absl::Seconds(1));
  EXPECT_EQ(d.Current(), absl::Seconds(4));  // 4 × 1 s
}

// The 95th percentile of 20 rounds is the 19th smallest: one outlier does
// not move it, two do.
TEST(RoundDeadlineTest, FollowsTheQuantileOfTheWindow) {
  RoundDeadline d(Adaptive(), absl::Seconds(60));
  for (int i = 0; i < 19; ++i) d.Observe(absl::Seconds(1));
  d.Observe(absl::Seconds(10));
  EXPECT_EQ(d.Current(), absl::Seconds(4));
  d.Observe(absl::Seconds(3));                // the window drops the oldest 1 s
  EXPECT_EQ(d.Current(), absl::Seconds(12));  // 4 × 3 s
}

// Slow rounds that leave the window no longer count: with 20 rounds
// remembered, 20 slow ones followed by fast ones keep the deadline up while
// two slow ones are among the last 20 (the 19th smallest is slow), and it
// falls to the fast rounds' once only one is left.
TEST(RoundDeadlineTest, TheWindowDropsItsOldestRounds) {
  RoundDeadline d(Adaptive(), absl::Seconds(60));
  for (int i = 0; i < 20; ++i) d.Observe(absl::Seconds(10));
  EXPECT_EQ(d.Current(), absl::Seconds(40));
  for (int i = 0; i < 18; ++i) {
    d.Observe(absl::Seconds(1));
    EXPECT_EQ(d.Current(), absl::Seconds(40)) << i + 1 << " fast rounds";
  }
  d.Observe(absl::Seconds(1));  // 19 fast, 1 slow in the window
  EXPECT_EQ(d.Current(), absl::Seconds(4));
  d.Observe(absl::Seconds(1));  // 20 fast
  EXPECT_EQ(d.Current(), absl::Seconds(4));
}

TEST(RoundDeadlineTest, ClampedToFloorAndTimeout) {
  RoundDeadline fast(Adaptive(), absl::Seconds(60));
  for (int i = 0; i < 20; ++i) fast.Observe(absl::Milliseconds(50));
  EXPECT_EQ(fast.Current(), absl::Seconds(2));  // 0.2 s, raised to the floor
  RoundDeadline slow(Adaptive(), absl::Seconds(60));
  for (int i = 0; i < 20; ++i) slow.Observe(absl::Seconds(30));
  EXPECT_EQ(slow.Current(), absl::Seconds(60));  // 120 s, cut to the timeout
  // A timeout below the floor wins.
  RoundDeadline short_timeout(Adaptive(), absl::Seconds(1));
  for (int i = 0; i < 20; ++i) short_timeout.Observe(absl::Milliseconds(10));
  EXPECT_EQ(short_timeout.Current(), absl::Seconds(1));
}

TEST(RoundDeadlineTest, BadOptionsAreNamed) {
  RoundDeadlineOptions o = Adaptive();
  CO2_EXPECT_OK(ValidateRoundDeadlineOptions(o));
  o.factor = 0.5;
  EXPECT_NE(ValidateRoundDeadlineOptions(o).message().find("factor"),
            std::string::npos);
  o = Adaptive();
  o.quantile = 0;
  EXPECT_NE(ValidateRoundDeadlineOptions(o).message().find("quantile"),
            std::string::npos);
  o = Adaptive();
  o.min_samples = 21;
  EXPECT_NE(ValidateRoundDeadlineOptions(o).message().find("min_samples"),
            std::string::npos);
  o = Adaptive();
  o.floor = absl::ZeroDuration();
  EXPECT_NE(ValidateRoundDeadlineOptions(o).message().find("floor"),
            std::string::npos);
}

}  // namespace
}  // namespace co2::server
