// JobLifecycle: the rule that makes a job finished or abandoned, with
// explicit times (no clock, no sleeps).
#include "server/job/job_lifecycle.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);
const absl::Duration kAbandon = absl::Minutes(10);

TEST(JobLifecycleTest, FinishedOnceTheLastRoundClosedAndEveryWorkerLeft) {
  JobLifecycle life(/*rounds=*/5, kAbandon, kStart);
  EXPECT_FALSE(life.Update(4, 2, kStart + absl::Seconds(1)));
  EXPECT_FALSE(life.Update(5, 1, kStart + absl::Seconds(2)))
      << "a worker is still live";
  EXPECT_TRUE(life.Update(5, 0, kStart + absl::Seconds(3)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(life.since(), kStart + absl::Seconds(3));
  // Final: a rejoining member does not reopen it.
  EXPECT_FALSE(life.Update(5, 1, kStart + absl::Seconds(4)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_FINISHED);
}

// With its last round not closed, a job that no worker is live in waits
// (and is abandoned after abandon_after), it is not finished: the workers
// may be restarting, and the last round's update is still owed.
TEST(JobLifecycleTest, TheLastRoundStillOpenWithNoWorkerIsNotFinished) {
  JobLifecycle life(/*rounds=*/5, kAbandon, kStart);
  EXPECT_FALSE(life.Update(4, 0, kStart + absl::Seconds(1)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_OPEN);
  EXPECT_EQ(life.NextDeadline(), kStart + absl::Seconds(1) + kAbandon);
  EXPECT_FALSE(life.Update(4, 0, kStart + absl::Seconds(2)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_OPEN);
  EXPECT_TRUE(life.Update(4, 0, kStart + absl::Seconds(1) + kAbandon));
  EXPECT_EQ(life.state(), v1::JOB_STATE_ABANDONED);
  // Its last round closed later (a worker came back and left again): the
  // job is finished then.
  EXPECT_TRUE(life.Update(4, 1, kStart + absl::Minutes(20)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_OPEN);
  EXPECT_TRUE(life.Update(5, 0, kStart + absl::Minutes(21)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_FINISHED);
}

TEST(JobLifecycleTest, FinishedJobTakesOnlyARejoin) {
  JobLifecycle life(/*rounds=*/5, kAbandon, kStart, v1::JOB_STATE_FINISHED);
  const absl::Status fresh = life.AdmitJoin("run-1", false, kStart);
  EXPECT_EQ(fresh.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fresh.message().find("\"run-1\" is finished"), std::string::npos)
      << fresh;
  EXPECT_NE(fresh.message().find("the final round is 4"), std::string::npos)
      << fresh;
  EXPECT_NE(fresh.message().find("another name"), std::string::npos) << fresh;
  CO2_EXPECT_OK(life.AdmitJoin("run-1", true, kStart));
  EXPECT_EQ(life.state(), v1::JOB_STATE_FINISHED);
}

TEST(JobLifecycleTest, AbandonedAfterNoWorkerForAbandonAfter) {
  JobLifecycle life(/*rounds=*/5, kAbandon, kStart);
  EXPECT_EQ(life.NextDeadline(), absl::InfiniteFuture());
  EXPECT_FALSE(life.Update(2, 0, kStart + absl::Minutes(1)));
  EXPECT_EQ(life.NextDeadline(), kStart + absl::Minutes(11));
  EXPECT_FALSE(
      life.Update(2, 0, kStart + absl::Minutes(11) - absl::Seconds(1)));
  // A worker in between starts the wait over.
  EXPECT_FALSE(life.Update(2, 1, kStart + absl::Minutes(5)));
  EXPECT_EQ(life.NextDeadline(), absl::InfiniteFuture());
  EXPECT_FALSE(life.Update(2, 0, kStart + absl::Minutes(6)));
  EXPECT_FALSE(
      life.Update(2, 0, kStart + absl::Minutes(16) - absl::Seconds(1)));
  EXPECT_TRUE(life.Update(2, 0, kStart + absl::Minutes(16)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_ABANDONED);
  EXPECT_EQ(life.NextDeadline(), absl::InfiniteFuture());
}

TEST(JobLifecycleTest, AJoinResumesAnAbandonedJob) {
  JobLifecycle life(/*rounds=*/0, kAbandon, kStart, v1::JOB_STATE_ABANDONED);
  CO2_EXPECT_OK(life.AdmitJoin("run-1", false, kStart + absl::Seconds(5)));
  EXPECT_EQ(life.state(), v1::JOB_STATE_OPEN);
  EXPECT_EQ(life.since(), kStart + absl::Seconds(5));
  // A job restored as abandoned with a live member is open again too.
  JobLifecycle restored(0, kAbandon, kStart, v1::JOB_STATE_ABANDONED);
  EXPECT_TRUE(restored.Update(3, 1, kStart));
  EXPECT_EQ(restored.state(), v1::JOB_STATE_OPEN);
}

TEST(JobLifecycleTest, WithoutRoundsAJobNeverFinishesByItself) {
  JobLifecycle life(/*rounds=*/0, kAbandon, kStart,
                    v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(life.state(), v1::JOB_STATE_OPEN);
  EXPECT_FALSE(life.Update(1000, 0, kStart));
  EXPECT_TRUE(life.Update(1000, 0, kStart + kAbandon));
  EXPECT_EQ(life.state(), v1::JOB_STATE_ABANDONED);
}

}  // namespace
}  // namespace co2::server
