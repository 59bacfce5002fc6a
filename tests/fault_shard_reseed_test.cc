// A shard restarts without the job's state in the middle of training: its
// checkpoint removed, or damaged. The workers rejoin, one of them re-seeds the
// shard from the anchor it holds, and training continues with the outer
// momentum restarted from zero (docs/reliability.md). Every worker ends with
// the shards' anchor bit for bit, rounds stay contiguous, and the shard reports
// the re-seed with its reason; a damaged file is set aside, not deleted.
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/aggregator_client.h"
#include "gtest/gtest.h"
#include "server/job/shard_observer.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace co2::testing {
namespace {

using ::co2::testing::TempDir;

constexpr char kJob[] = "reseed";

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* entry = readdir(d)) names.push_back(entry->d_name);
  closedir(d);
  return names;
}

class RecordingObserver : public server::ShardObserver {
 public:
  void OnReseeded(const std::string& job,
                  server::ReseedReason reason) override {
    absl::MutexLock lock(&mu_);
    reseeds_.push_back(
        absl::StrCat(job, ":", server::ReseedReasonName(reason)));
  }
  std::vector<std::string> reseeds() {
    absl::MutexLock lock(&mu_);
    return reseeds_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> reseeds_ ABSL_GUARDED_BY(mu_);
};

enum class Loss { kMissing, kCorrupt };

class FaultShardReseedTest
    : public ::testing::TestWithParam<std::tuple<Loss, uint64_t>> {};

TEST_P(FaultShardReseedTest, TrainingContinuesFromAWorkersAnchor) {
  // Not a structured binding: the lambdas below capture both, which clang
  // (the tsan preset's compiler) allows only from C++20.
  const Loss loss = std::get<0>(GetParam());
  const uint64_t crash_after = std::get<1>(GetParam());
  E2eSpec spec;
  spec.params = 300000;
  spec.workers = 3;
  spec.rounds = 10;
  const TempDir temp_dir("co2-fault");
  const std::string dir = temp_dir.path();
  RecordingObserver observer;
  Cluster cluster(spec.shards, dir, &observer);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  const std::string file = absl::StrCat(kJob, ".shard-1-of-2.ckpt");

  // Every worker is at the same point (after its boundary of crash_after)
  // when shard 1 goes down, so all of them hold the same anchor.
  Barrier barrier(spec.workers);
  bool restarted = false;
  absl::Status restart_status;
  bool damaged = false;
  std::vector<WorkerResult> results = RunWorkers(
      spec, cluster.addresses(), kJob, config,
      [](int) { return common::Codec::kFp32; },
      [&](int /*worker*/, uint64_t round) {
        if (round != crash_after) return;
        const bool released = barrier.ArriveAndWait(
            [&] {
              restarted = true;
              restart_status = cluster.Restart(1, [&](const std::string& d) {
                const std::string path = absl::StrCat(d, "/", file);
                if (loss == Loss::kMissing) {
                  damaged = unlink(path.c_str()) == 0;
                  return;
                }
                std::fstream f(path,
                               std::ios::in | std::ios::out | std::ios::binary);
                f.seekp(200);
                f.put('\x5a');
                damaged = f.good();
              });
            },
            absl::Seconds(120));
        EXPECT_TRUE(released)
            << "the workers never all reached round " << crash_after;
      });
  ASSERT_TRUE(restarted);
  CO2_ASSERT_OK(restart_status);
  ASSERT_TRUE(damaged) << "shard 1 had no checkpoint file to remove or damage";
  for (const WorkerResult& r : results) CO2_ASSERT_OK(r.status);

  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor(kJob, &round);
  ASSERT_EQ(shards.size(), spec.params);
  EXPECT_EQ(round, spec.rounds + 1) << "rounds are not contiguous";
  for (const WorkerResult& r : results) {
    EXPECT_EQ(std::memcmp(r.anchor.data(), shards.data(),
                          shards.size() * sizeof(float)),
              0)
        << "a worker's anchor differs from the shards'";
  }
  // The outer momentum restarted from zero, so the trajectory is not the
  // undisturbed one: shard 1 really lost its state. After round 0 the lost
  // state may be none at all: the re-seed can reopen round 0, whose
  // momentum and gap were zero anyway, and then the trajectories are equal.
  if (crash_after > 0) {
    const std::vector<float> reference = ReferenceAnchor(spec, config);
    EXPECT_NE(std::memcmp(shards.data(), reference.data(),
                          shards.size() * sizeof(float)),
              0);
  }

  const std::string reason = loss == Loss::kMissing ? "missing" : "corrupt";
  EXPECT_EQ(observer.reseeds(),
            std::vector<std::string>{absl::StrCat(kJob, ":", reason)});
  auto job = cluster.registry(1)->Find(kJob);
  CO2_ASSERT_OK(job);
  EXPECT_EQ((*job)->stats().reseeds, 1u);
  auto untouched = cluster.registry(0)->Find(kJob);
  CO2_ASSERT_OK(untouched);
  EXPECT_EQ((*untouched)->stats().reseeds, 0u);

  const std::vector<absl::Status>& errors =
      cluster.registry(1)->restore_errors();
  int set_aside = 0;
  for (const std::string& name : FilesIn(dir)) {
    if (absl::StartsWith(name, file + ".corrupt-")) ++set_aside;
  }
  if (loss == Loss::kCorrupt) {
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].code(), absl::StatusCode::kDataLoss) << errors[0];
    EXPECT_EQ(set_aside, 1) << "the damaged checkpoint was not kept aside";
  } else {
    EXPECT_TRUE(errors.empty());
    EXPECT_EQ(set_aside, 0);
  }
  // The re-seeded shard checkpoints again under the job's own name.
  EXPECT_EQ(access(absl::StrCat(dir, "/", file).c_str(), F_OK), 0);
}

// The shard dies after the worker was told that the update of round 0 is
// ready but before it applied it: the re-seed carries A_1 + U_0 = A_2, the
// shard opens round 1, and the worker's own A_2 (after it applies U_0) equals
// the shard's bit for bit.
TEST(FaultShardReseedClientTest, AnUpdateTheWorkerWasToldOfIsKept) {
  E2eSpec spec;
  spec.params = 5000;
  spec.shards = 1;
  spec.workers = 1;
  const TempDir temp_dir("co2-fault");
  const std::string dir = temp_dir.path();
  absl::Notification reseeded;
  class NotifyingObserver : public server::ShardObserver {
   public:
    explicit NotifyingObserver(absl::Notification* done) : done_(done) {}
    void OnReseeded(const std::string&, server::ReseedReason) override {
      done_->Notify();
    }

   private:
    absl::Notification* const done_;
  } observer(&reseeded);
  Cluster cluster(1, dir, &observer);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  std::vector<float> anchor = InitialAnchor(spec.params);
  auto connected = client::AggregatorClient::Connect(
      WorkerOptions(cluster.addresses(), kJob, config, 0),
      absl::MakeSpan(anchor));
  CO2_ASSERT_OK(connected);
  client::AggregatorClient& c = **connected;
  CO2_ASSERT_OK(c.TrackAnchor(anchor));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<float> delta(spec.params);
  auto push = [&](uint64_t round) {
    for (size_t j = 0; j < spec.params; ++j) delta[j] = Delta(0, round, j);
    return c.Push(round, delta, Weight(0), deadline);
  };
  CO2_ASSERT_OK(push(0));
  CO2_ASSERT_OK(c.WaitForUpdate(0, deadline));
  auto remove_checkpoint = [](const std::string& d) {
    unlink(absl::StrCat(d, "/", kJob, ".shard-0-of-1.ckpt").c_str());
  };
  CO2_ASSERT_OK(cluster.Restart(0, remove_checkpoint));
  CO2_ASSERT_OK(push(1));
  ASSERT_TRUE(reseeded.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::StatusOr<uint64_t> applied = c.ApplyUpdate(0, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(applied);
  EXPECT_EQ(*applied, 2u);
  uint64_t round = 0;
  std::vector<float> shard = cluster.Anchor(kJob, &round);
  EXPECT_EQ(round, 2u) << "the re-seed did not carry the kept update";
  ASSERT_EQ(shard.size(), anchor.size());
  EXPECT_EQ(
      std::memcmp(shard.data(), anchor.data(), anchor.size() * sizeof(float)),
      0);
  // Training goes on from there.
  CO2_ASSERT_OK(c.WaitForUpdate(1, deadline));
  applied = c.ApplyUpdate(1, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(applied);
  EXPECT_EQ(*applied, 3u);
  // The update is sent once its chunk is journaled, which can be before the
  // shard counts its round closed: wait for the close (failed 1 in 9 suite
  // runs under load without this wait).
  EXPECT_TRUE(WaitFor(
      [&] {
        shard = cluster.Anchor(kJob, &round);
        return round >= 3;
      },
      absl::Seconds(20)));
  EXPECT_EQ(round, 3u);
  EXPECT_EQ(
      std::memcmp(shard.data(), anchor.data(), anchor.size() * sizeof(float)),
      0);
  CO2_EXPECT_OK(c.Leave(absl::Now() + absl::Seconds(10)));
}

INSTANTIATE_TEST_SUITE_P(
    LossAndRound, FaultShardReseedTest,
    ::testing::Combine(::testing::Values(Loss::kMissing, Loss::kCorrupt),
                       ::testing::Values(0, 5)),
    [](const ::testing::TestParamInfo<std::tuple<Loss, uint64_t>>& info) {
      return absl::StrCat(
          std::get<0>(info.param) == Loss::kMissing ? "Missing" : "Corrupt",
          "AfterRound", std::get<1>(info.param));
    });

}  // namespace
}  // namespace co2::testing
