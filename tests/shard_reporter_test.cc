#include "server/job/shard_reporter.h"

#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

class RecordingObserver : public ShardObserver {
 public:
  void OnRoundClosed(const std::string& job,
                     const RoundClosedEvent& event) override {
    jobs.push_back(job);
    closed.push_back(event);
  }
  void OnPoll(const std::string& job, const ShardPollEvent& event) override {
    jobs.push_back(job);
    polls.push_back(event);
  }
  std::vector<std::string> jobs;
  std::vector<RoundClosedEvent> closed;
  std::vector<ShardPollEvent> polls;
};

ClosedRound Closed(uint64_t round, uint32_t contributors, bool quorum) {
  ClosedRound c;
  c.round = round;
  c.contributors = contributors;
  c.quorum_close = quorum;
  return c;
}

TEST(ShardReporterTest, RoundsLastFromOpeningToClose) {
  common::FakeClock clock;
  RecordingObserver observer;
  ShardReporter report("job", &observer, &clock);
  clock.Advance(absl::Seconds(5));
  report.RoundOpened();  // seeded: round 0 opens now
  clock.Advance(absl::Seconds(2));
  OuterStepStats step;
  step.clipped = 7;
  report.RoundClosed(Closed(0, 3, true), step, 100);
  clock.Advance(absl::Seconds(4));
  report.RoundClosed(Closed(1, 2, false), step, 100);
  ASSERT_EQ(observer.closed.size(), 2u);
  EXPECT_EQ(observer.closed[0].round, 0u);
  EXPECT_EQ(observer.closed[0].duration, absl::Seconds(2));
  EXPECT_EQ(observer.closed[0].contributors, 3u);
  EXPECT_TRUE(observer.closed[0].quorum_close);
  EXPECT_EQ(observer.closed[0].step.clipped, 7u);
  EXPECT_EQ(observer.closed[0].elements, 100u);
  EXPECT_EQ(observer.closed[1].duration, absl::Seconds(4));
  EXPECT_FALSE(observer.closed[1].quorum_close);
  EXPECT_EQ(observer.jobs, (std::vector<std::string>{"job", "job"}));
}

TEST(ShardReporterTest, PollsReportNewQuorumMissesAndTheOpenRoundsAge) {
  common::FakeClock clock;
  RecordingObserver observer;
  ShardReporter report("job", &observer, &clock);
  clock.Advance(absl::Seconds(3));
  report.Polled(2, 0, /*anchor_ready=*/false, 0, absl::Seconds(60));
  report.Polled(2, 0, /*anchor_ready=*/true, 2, absl::Seconds(60));
  report.Polled(1, 4, /*anchor_ready=*/true, 3, absl::Seconds(60));
  report.Polled(1, 4, /*anchor_ready=*/true, 3, absl::Seconds(60));
  ASSERT_EQ(observer.polls.size(), 4u);
  EXPECT_EQ(observer.polls[0].open_round_age, absl::ZeroDuration())
      << "no anchor: the round is not running";
  EXPECT_EQ(observer.polls[1].open_round_age, absl::Seconds(3))
      << "since the shard was created";
  EXPECT_EQ(observer.polls[1].new_quorum_misses, 2u);
  EXPECT_EQ(observer.polls[2].new_quorum_misses, 1u);
  EXPECT_EQ(observer.polls[3].new_quorum_misses, 0u);
  EXPECT_EQ(observer.polls[2].live_workers, 1u);
  EXPECT_EQ(observer.polls[2].open_round, 4u);
}

TEST(ShardReporterTest, WithoutAnObserverNothingIsCalled) {
  common::FakeClock clock;
  ShardReporter silent("job", nullptr, &clock);
  silent.RoundOpened();  // nothing to call: none of these may touch it
  silent.RoundClosed(Closed(0, 1, false), {}, 10);
  silent.Polled(1, 1, true, 5, absl::Seconds(60));
}

}  // namespace
}  // namespace co2::server
