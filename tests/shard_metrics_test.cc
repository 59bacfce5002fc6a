// ShardMetrics driven by a real JobShard (fake clock, no gRPC): each metric
// that co2-aggregator exports moves as the shard's work says it must.
#include "server/service/shard_metrics.h"

#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job/job_shard.h"
#include "tests/job_shard_fixture.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

using shard_test::Config;
using shard_test::Contribution;
using shard_test::Fp32;
using shard_test::kParams;
using shard_test::RecordingSink;

constexpr size_t kBytes = kParams * sizeof(float);
using Labels = std::map<std::string, std::string>;

// The series `name` whose labels are exactly `labels` plus shard="0".
const prometheus::ClientMetric* Find(const prometheus::Registry& registry,
                                     const std::string& name, Labels labels) {
  static std::vector<prometheus::MetricFamily> families;
  families = registry.Collect();
  labels["shard"] = "0";
  for (const auto& family : families) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      Labels have;
      for (const auto& l : metric.label) have[l.name] = l.value;
      if (have == labels) return &metric;
    }
  }
  return nullptr;
}

// A counter's or gauge's value; NaN when the series does not exist.
double Value(const prometheus::Registry& registry, const std::string& name,
             const Labels& labels) {
  const prometheus::ClientMetric* m = Find(registry, name, labels);
  if (m == nullptr) return std::numeric_limits<double>::quiet_NaN();
  return name.size() > 6 && name.substr(name.size() - 6) == "_total"
             ? m->counter.value
             : m->gauge.value;
}

class ShardMetricsTest : public ::testing::Test {
 public:
  // Job "job" reporting to metrics_, "a" and "b" joined, A_0 = 10; its
  // JobConfig.outlier_ratio `k` (the default's holds the first two
  // contributions of the first round until the round's median is known).
  void Create(uint32_t min_workers,
              float k = common::kDefaultOutlierRatio) {
    JobShardOptions options;
    options.observer = &metrics_;
    v1::JobConfig config = Config(min_workers);
    config.set_outlier_ratio(k);
    auto seeded =
        shard_test::SeededShard(config, options, &clock_, {"a", "b"});
    CO2_ASSERT_OK(seeded);
    shard_ = *std::move(seeded);
  }
  double Get(const std::string& name,
             const Labels& labels = {{"co2_job", "job"}}) {
    return Value(registry_, name, labels);
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_, 0};
  common::FakeClock clock_;
  std::unique_ptr<JobShard> shard_;
};

TEST_F(ShardMetricsTest, RoundsBytesAndTheOuterStep) {
  Create(2);
  auto sink1 = std::make_shared<RecordingSink>();
  auto sink2 = std::make_shared<RecordingSink>();
  CO2_EXPECT_OK(shard_->Subscribe(sink1, 0));
  CO2_EXPECT_OK(shard_->Subscribe(sink2, 0));
  for (uint64_t r = 0; r < 3; ++r) {
    clock_.Advance(absl::Seconds(3));
    CO2_ASSERT_OK(shard_->Contribute("a", Contribution(r, 1.0f)));
    CO2_ASSERT_OK(shard_->Contribute("b", Contribution(r, 3.0f)));
    ASSERT_EQ(shard_->Poll(), 1);
  }
  EXPECT_EQ(Get("co2_aggregator_rounds_completed_total"), 3);
  EXPECT_EQ(Get("co2_aggregator_contributions_total"), 6);
  EXPECT_EQ(Get("co2_aggregator_round_contributors"), 2);
  EXPECT_EQ(Get("co2_aggregator_contribution_chunks_total",
                {{"co2_job", "job"}, {"codec", "fp32"}}),
            6);
  EXPECT_EQ(Get("co2_aggregator_bytes_in_total",
                {{"co2_job", "job"}, {"codec", "fp32"}}),
            6 * kBytes);
  // Each round's update (fp32, kBytes) went to both streams.
  EXPECT_EQ(Get("co2_aggregator_bytes_out_total",
                {{"co2_job", "job"}, {"codec", "fp32"}}),
            3 * 2 * kBytes);
  EXPECT_EQ(Get("co2_aggregator_active_workers"), 2);
  EXPECT_EQ(Get("co2_aggregator_open_round"), 3);
  EXPECT_EQ(Get("co2_aggregator_open_round_age_seconds"), 0);
  // Every round opened 3 s (fake clock) before it closed.
  const prometheus::ClientMetric* duration = Find(
      registry_, "co2_aggregator_round_duration_seconds", {{"co2_job", "job"}});
  ASSERT_NE(duration, nullptr);
  EXPECT_EQ(duration->histogram.sample_count, 3u);
  EXPECT_DOUBLE_EQ(duration->histogram.sample_sum, 9.0);
  // β = 0, no penalty, no clip: m = D = mean(1, 3) = 2 on each element.
  EXPECT_EQ(Get("co2_aggregator_gap_penalty_mean"), 1);
  EXPECT_EQ(Get("co2_aggregator_clipped_fraction"), 0);
  EXPECT_NEAR(Get("co2_aggregator_outer_momentum_norm"),
              std::sqrt(4.0 * kParams), 1e-3);
  EXPECT_EQ(Get("co2_aggregator_quorum_misses_total"), 0);
  const double quorum_closes = Get("co2_aggregator_quorum_closes_total");
  EXPECT_TRUE(std::isnan(quorum_closes) || quorum_closes == 0) << quorum_closes;
  clock_.Advance(absl::Seconds(2));
  shard_->Poll();
  EXPECT_EQ(Get("co2_aggregator_open_round_age_seconds"), 2);
}

TEST_F(ShardMetricsTest, RejectionsAreCountedByReason) {
  Create(2);
  auto reason = [&](const std::string& r) {
    return Get("co2_aggregator_rejected_chunks_total",
               {{"co2_job", "job"}, {"reason", r}});
  };
  EXPECT_FALSE(shard_->Contribute("stranger", Contribution(0, 1.0f)).ok());
  EXPECT_EQ(reason("not_member"), 1);

  v1::Contribution nan = Contribution(0, std::nanf(""));
  EXPECT_EQ(shard_->Contribute("a", nan).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reason("non_finite"), 1);

  v1::Contribution bad_chunk = Contribution(0, 1.0f);
  bad_chunk.set_chunk_index(7);
  EXPECT_EQ(shard_->Contribute("a", bad_chunk).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reason("invalid_argument"), 1);

  EXPECT_FALSE(shard_->Contribute("a", Contribution(5, 1.0f)).ok());
  EXPECT_EQ(reason("ahead"), 1);

  for (uint64_t r = 0; r < 3; ++r) {
    CO2_ASSERT_OK(shard_->Contribute("a", Contribution(r, 1.0f)));
    CO2_ASSERT_OK(shard_->Contribute("b", Contribution(r, 1.0f)));
    ASSERT_EQ(shard_->Poll(), 1);
  }
  EXPECT_EQ(shard_->Contribute("a", Contribution(0, 1.0f)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(reason("stale"), 1);
  // Nothing rejected was counted as received.
  EXPECT_EQ(Get("co2_aggregator_contribution_chunks_total",
                {{"co2_job", "job"}, {"codec", "fp32"}}),
            6);
}

TEST_F(ShardMetricsTest, EvictedWorkersChunksHaveTheirOwnReason) {
  Create(2);
  auto reason = [&](const std::string& r) {
    return Get("co2_aggregator_rejected_chunks_total",
               {{"co2_job", "job"}, {"reason", r}});
  };
  // max_rejected_chunks (3) NaN chunks in a row evict "a".
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(shard_->Contribute("a", Contribution(0, std::nanf(""))).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(reason("non_finite"), 3);
  EXPECT_EQ(shard_->Contribute("a", Contribution(0, 1.0f)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reason("evicted"), 1);
  EXPECT_TRUE(std::isnan(reason("ahead"))) << "an eviction counted as ahead";
}

// Finite values that the round's fp32 sum cannot take (3e38 + 3e38) are
// refused before they reach it and counted like NaN (without the outlier
// rule, which would hold them and check them when they are added).
TEST_F(ShardMetricsTest, OverflowingChunksAreRejectedLikeNaN) {
  Create(2, /*k=*/0);
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 3e38f)));
  for (int i = 0; i < 3; ++i) {
    const absl::Status s = shard_->Contribute("b", Contribution(0, 3e38f));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("worker \"b\" round 0 chunk 0"),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(Get("co2_aggregator_rejected_chunks_total",
                {{"co2_job", "job"}, {"reason", "non_finite"}}),
            3);
  EXPECT_EQ(shard_->stats().rejected_chunks, 3u);
  EXPECT_EQ(shard_->stats().evicted_workers, 1u) << "b kept sending them";
  // The round closes with a alone, its anchor finite.
  EXPECT_EQ(shard_->Poll(), 1);
  uint64_t round = 0;
  for (float v : shard_->AnchorForTesting(&round)) {
    ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(ShardMetricsReseedTest, ReseedsAreCountedByReason) {
  prometheus::Registry registry;
  ShardMetrics metrics(registry, 0);
  common::FakeClock clock;
  JobShardOptions options;
  options.observer = &metrics;
  auto shard = *JobShard::Create("job", Config(1), options, &clock);
  ASSERT_TRUE(
      shard->Join("a", Config(1), common::Codec::kFp32, 3)->must_reseed);
  CO2_ASSERT_OK(shard->SeedChunk("a", 0, 4, Fp32(1)));
  EXPECT_EQ(Value(registry, "co2_aggregator_reseeds_total",
                  {{"co2_job", "job"}, {"reason", "missing"}}),
            1);
}

// A shard whose checkpoint directory is a full tmpfs: the update is held,
// every retry counts as no_space, the workers' reason says why, and once
// space is freed the update goes out and the reason clears.
TEST(ShardMetricsCheckpointTest, AFullDiskIsCountedAsNoSpaceUntilFreed) {
  const co2::testing::TempDir temp_dir("co2-full");
  const std::string& dir = temp_dir.path();
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  }
  prometheus::Registry registry;
  ShardMetrics metrics(registry, 0);
  for (const char* reason : {"no_space", "io_error", "permission", "other"}) {
    EXPECT_EQ(Value(registry, "co2_aggregator_checkpoint_failures_total",
                    {{"reason", reason}}),
              0)
        << reason << " exists from the start";
  }
  common::FakeClock clock;
  CheckpointStore store(dir);
  JobShardOptions options;
  options.checkpoints = &store;
  options.observer = &metrics;
  auto shard = *JobShard::Create("job", Config(1), options, &clock);
  CO2_ASSERT_OK(shard->Join("a", Config(1), common::Codec::kFp32));
  CO2_ASSERT_OK(shard->SeedChunk("a", 0, 0, Fp32(1)));
  EXPECT_EQ(shard->Poll(), 0);  // the seeded anchor's checkpoint
  auto sink = std::make_shared<RecordingSink>();
  CO2_ASSERT_OK(shard->Subscribe(sink, 0));
  // Fill the disk: write until ENOSPC.
  const std::string filler = dir + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(4096, 'x');
    while (out.write(block.data(), block.size())) {
    }
  }
  CO2_ASSERT_OK(shard->Contribute("a", Contribution(0, 1)));
  for (int retry = 0; retry < 3; ++retry) {
    EXPECT_EQ(shard->Poll(), 0);
    clock.Advance(absl::Seconds(1));
  }
  EXPECT_TRUE(sink->rounds.empty()) << "released before it was durable";
  EXPECT_EQ(Value(registry, "co2_aggregator_checkpoint_failures_total",
                  {{"reason", "no_space"}}),
            3);
  EXPECT_EQ(Value(registry, "co2_aggregator_checkpoint_failures_total",
                  {{"reason", "other"}}),
            0);
  EXPECT_EQ(shard->UpdateHeld(),
            "checkpoint failing: No space left on device");
  ASSERT_EQ(std::remove(filler.c_str()), 0);
  EXPECT_EQ(shard->Poll(), 1);
  EXPECT_EQ(sink->rounds, (std::vector<uint64_t>{0}));
  EXPECT_EQ(shard->UpdateHeld(), "");
  EXPECT_EQ(Value(registry, "co2_aggregator_checkpoint_failures_total",
                  {{"reason", "no_space"}}),
            3);
  shard.reset();
  umount(dir.c_str());
}

TEST_F(ShardMetricsTest, DuplicatesLateChunksAndQuorumCloses) {
  Create(1);
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));  // resend
  EXPECT_EQ(Get("co2_aggregator_duplicate_chunks_total"), 1);
  EXPECT_EQ(shard_->Poll(), 0) << "b is live: round 0 waits for it";
  clock_.Advance(absl::Seconds(2));  // past the deadline; quorum is 1
  EXPECT_EQ(shard_->Poll(), 1);
  EXPECT_EQ(Get("co2_aggregator_quorum_closes_total"), 1);
  EXPECT_EQ(Get("co2_aggregator_round_contributors"), 1);
  // b's round-0 chunk arrives after round 0 closed: folded into round 1.
  CO2_ASSERT_OK(shard_->Contribute("b", Contribution(0, 1.0f)));
  EXPECT_EQ(Get("co2_aggregator_late_chunks_total"), 1);
}

TEST_F(ShardMetricsTest, QuorumMissesAndLeases) {
  Create(2);
  shard_->Poll();
  EXPECT_EQ(Get("co2_aggregator_quorum_misses_total"), 0)
      << "the series exists before the first miss";
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));
  clock_.Advance(absl::Seconds(2));  // past the deadline, below quorum 2
  EXPECT_EQ(shard_->Poll(), 0);
  shard_->Poll();
  EXPECT_EQ(Get("co2_aggregator_quorum_misses_total"), 1)
      << "one round, counted once";
  EXPECT_EQ(Get("co2_aggregator_open_round_age_seconds"), 2);
  clock_.Advance(absl::Seconds(30));  // both leases expire
  shard_->Poll();
  EXPECT_EQ(Get("co2_aggregator_active_workers"), 0);
}

// An idle shard says it holds no job and no worker, from its start.
TEST_F(ShardMetricsTest, JobsAndWorkersAreGaugedFromTheStart) {
  EXPECT_EQ(Value(registry_, "co2_aggregator_jobs", {}), 0);
  EXPECT_EQ(Value(registry_, "co2_aggregator_workers", {}), 0);
  Create(2);
  shard_->Poll();
  EXPECT_EQ(Value(registry_, "co2_aggregator_jobs", {}), 1);
  EXPECT_EQ(Value(registry_, "co2_aggregator_workers", {}), 2);
  clock_.Advance(absl::Seconds(30));  // both leases expire
  shard_->Poll();
  EXPECT_EQ(Value(registry_, "co2_aggregator_workers", {}), 0);
}

TEST_F(ShardMetricsTest, EveryJobCounterExistsAtZeroFromTheFirstPoll) {
  Create(2);
  EXPECT_TRUE(std::isnan(Get("co2_aggregator_late_chunks_total")));
  shard_->Poll();
  for (const char* name : {"co2_aggregator_rounds_completed_total",
                           "co2_aggregator_contributions_total",
                           "co2_aggregator_late_chunks_total",
                           "co2_aggregator_duplicate_chunks_total",
                           "co2_aggregator_quorum_closes_total",
                           "co2_aggregator_quorum_misses_total"}) {
    EXPECT_EQ(Get(name), 0) << name;
  }
  for (const char* reason :
       {"invalid_argument", "non_finite", "stale", "ahead", "not_member",
        "evicted", "resource_exhausted", "other"}) {
    EXPECT_EQ(Get("co2_aggregator_rejected_chunks_total",
                  {{"co2_job", "job"}, {"reason", reason}}),
              0)
        << reason;
  }
}

TEST_F(ShardMetricsTest, CheckpointDurationIsRegisteredBeforeTheFirstWrite) {
  Create(2);
  shard_->Poll();
  const prometheus::ClientMetric* h =
      Find(registry_, "co2_aggregator_checkpoint_duration_seconds",
           {{"co2_job", "job"}});
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->histogram.sample_count, 0u);
  metrics_.ObserveCheckpointDuration("job", absl::Milliseconds(250));
  metrics_.OnCheckpointWritten("job", absl::Milliseconds(750));
  h = Find(registry_, "co2_aggregator_checkpoint_duration_seconds",
           {{"co2_job", "job"}});
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(h->histogram.sample_sum, 1.0);
}

TEST(RejectReasonTest, FollowsTheStatusCode) {
  EXPECT_EQ(RejectReasonOf(absl::AbortedError("old")), RejectReason::kStale);
  EXPECT_EQ(RejectReasonOf(absl::FailedPreconditionError("new")),
            RejectReason::kAhead);
  EXPECT_EQ(RejectReasonOf(absl::NotFoundError("who")),
            RejectReason::kNotMember);
  EXPECT_EQ(RejectReasonOf(absl::InvalidArgumentError("size")),
            RejectReason::kInvalidArgument);
  EXPECT_EQ(RejectReasonOf(absl::InvalidArgumentError(
                "fp32 payload element 3 is not finite: nan")),
            RejectReason::kNonFinite);
  EXPECT_EQ(RejectReasonOf(absl::ResourceExhaustedError("x")),
            RejectReason::kResourceExhausted);
  EXPECT_EQ(RejectReasonOf(absl::InternalError("x")), RejectReason::kOther);
  EXPECT_EQ(RejectReasonName(RejectReason::kNonFinite), "non_finite");
  EXPECT_EQ(RejectReasonName(RejectReason::kNotMember), "not_member");
  EXPECT_EQ(RejectReasonOf(absl::FailedPreconditionError(
                "worker \"w\" was evicted from job \"j\": 3 invalid chunks")),
            RejectReason::kEvicted);
  EXPECT_EQ(RejectReasonName(RejectReason::kEvicted), "evicted");
  EXPECT_EQ(ReseedReasonName(ReseedReason::kMissing), "missing");
  EXPECT_EQ(ReseedReasonName(ReseedReason::kCorrupt), "corrupt");
}

}  // namespace
}  // namespace co2::server
