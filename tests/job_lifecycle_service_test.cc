// A job's life on a real shard over real gRPC: a job finishes when its last
// round closed and its workers left, then refuses fresh Joins (a restarted
// member may still rejoin), leaves the metrics, leaves memory after its
// retention and stays refused across a restart; an abandoned job resumes
// from its checkpoint; co2-admin's service lists and deletes jobs.
#include <stdlib.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/service/aggregator_server.h"
#include "server/service/shard_metrics.h"
#include "tests/job_shard_fixture.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace co2 {
namespace {

using ::co2::testing::TempDir;

using grpc::StatusCode;
using server::shard_test::Contribution;
using server::shard_test::Fp32;

constexpr uint64_t kRounds = 2;

v1::JobConfig Config() {
  v1::JobConfig c = common::DefaultJobConfig(server::shard_test::kParams, 1);
  c.set_rounds(kRounds);
  return c;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

void ExpectStatus(const grpc::Status& s, StatusCode code,
                  const std::string& part) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(part), std::string::npos)
      << "message: " << s.error_message() << "\nexpected to contain: " << part;
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(10); }

class JobLifecycleServiceTest : public ::testing::Test {
 protected:
  void Start(absl::Duration retention) {
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.registry.checkpoint_dir = dir_;
    options.registry.retention = retention;
    options.registry.max_poll_interval = absl::Milliseconds(10);
    options.registry.shard.lease = absl::Seconds(2);
    options.registry.shard.abandon_after = absl::Milliseconds(300);
    options.registry.shard.observer = metrics_.get();
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Aggregator::NewStub(channel);
    admin_ = v1::AggregatorAdmin::NewStub(channel);
  }

  // Stops the shard and starts another on the same checkpoint directory.
  void Restart(absl::Duration retention) {
    stub_.reset();
    admin_.reset();
    server_.reset();
    Start(retention);
  }

  grpc::Status Join(const std::string& worker, bool rejoin = false,
                    v1::JoinResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    v1::JoinRequest request;
    request.set_job("job");
    request.set_worker_id(worker);
    *request.mutable_config() = Config();
    request.set_uplink_codec(v1::CODEC_FP32);
    request.set_rejoin(rejoin);
    v1::JoinResponse ignored;
    return stub_->Join(&context, request, response ? response : &ignored);
  }

  // Join, retried while the shard restores the job from its checkpoint.
  grpc::Status JoinRetrying(const std::string& worker, bool rejoin,
                            v1::JoinResponse* response) {
    grpc::Status status;
    testing::WaitFor(
        [&] {
          status = Join(worker, rejoin, response);
          return status.error_code() != StatusCode::UNAVAILABLE;
        },
        absl::Seconds(10));
    return status;
  }

  grpc::Status Seed(const std::string& worker) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    v1::SeedResponse response;
    auto writer = stub_->Seed(&context, &response);
    v1::AnchorChunk chunk;
    chunk.set_job("job");
    chunk.set_worker_id(worker);
    chunk.set_payload(Fp32(1));
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  // One Exchange stream: contributes rounds [first, last], reading each
  // round's update when `read_updates`, and returns how the stream ended.
  grpc::Status Exchange(const std::string& worker, uint64_t first,
                        uint64_t last, bool read_updates) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    auto stream = stub_->Exchange(&context);
    v1::ExchangeRequest open;
    open.mutable_open()->set_job("job");
    open.mutable_open()->set_worker_id(worker);
    open.mutable_open()->set_replay_from_round(first);
    stream->Write(open);
    v1::OuterUpdate update;
    for (uint64_t round = first; round <= last; ++round) {
      v1::ExchangeRequest request;
      *request.mutable_contribution() = Contribution(round, 0.5f);
      stream->Write(request);
      if (read_updates &&
          (!stream->Read(&update) || update.round() != round)) {
        break;
      }
    }
    stream->WritesDone();
    while (!read_updates && stream->Read(&update)) {
    }
    return stream->Finish();
  }
  // Rounds [first, last], each update read.
  grpc::Status Train(const std::string& worker, uint64_t first, uint64_t last) {
    return Exchange(worker, first, last, /*read_updates=*/true);
  }
  // One contribution to `round`; the stream's end.
  grpc::Status Contribute(const std::string& worker, uint64_t round) {
    return Exchange(worker, round, round, /*read_updates=*/false);
  }

  grpc::Status Leave(const std::string& worker) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    v1::LeaveRequest request;
    request.set_job("job");
    request.set_worker_id(worker);
    v1::LeaveResponse response;
    return stub_->Leave(&context, request, &response);
  }

  std::vector<v1::JobSummary> List() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    v1::ListJobsResponse response;
    const grpc::Status s =
        admin_->ListJobs(&context, v1::ListJobsRequest(), &response);
    CO2_EXPECT_OK(s);
    return {response.jobs().begin(), response.jobs().end()};
  }

  // Waits until the shard lists the job in `state` (and `in_memory`).
  bool WaitForState(v1::JobState state, bool in_memory) {
    return testing::WaitFor(
        [&] {
          const std::vector<v1::JobSummary> jobs = List();
          return jobs.size() == 1 && jobs[0].state() == state &&
                 jobs[0].in_memory() == in_memory;
        },
        absl::Seconds(10));
  }

  grpc::Status Delete(const std::string& job, v1::DeleteJobResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Deadline()));
    v1::DeleteJobRequest request;
    request.set_job(job);
    return admin_->DeleteJob(&context, request, response);
  }

  // Whether any co2_aggregator_* series is labelled co2_job="job".
  bool JobInMetrics() {
    for (const prometheus::MetricFamily& family : registry_.Collect()) {
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.name == "co2_job" && label.value == "job") return true;
        }
      }
    }
    return false;
  }

  // One worker trains the whole job and leaves.
  void RunWholeJob() {
    CO2_ASSERT_OK(Join("w0"));
    CO2_ASSERT_OK(Seed("w0"));
    CO2_ASSERT_OK(Train("w0", 0, kRounds - 1));
    CO2_ASSERT_OK(Leave("w0"));
  }

  const TempDir temp_dir_{"co2-lifecycle"};
  const std::string dir_ = temp_dir_.path();
  const std::string checkpoint_ = dir_ + "/job.shard-0-of-1.ckpt";
  prometheus::Registry registry_;
  std::unique_ptr<server::ShardMetrics> metrics_ =
      std::make_unique<server::ShardMetrics>(registry_, 0);
  std::unique_ptr<server::AggregatorServer> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
  std::unique_ptr<v1::AggregatorAdmin::Stub> admin_;
};

TEST_F(JobLifecycleServiceTest, FinishedJobRefusesFreshJoinsAndLeavesMetrics) {
  Start(/*retention=*/absl::Hours(1));
  CO2_ASSERT_OK(Join("w0"));
  CO2_ASSERT_OK(Seed("w0"));
  ASSERT_TRUE(testing::WaitFor([&] { return JobInMetrics(); }, absl::Seconds(10)));
  CO2_ASSERT_OK(Train("w0", 0, kRounds - 1));
  // Every round closed, but a worker is live: still open.
  EXPECT_TRUE(WaitForState(v1::JOB_STATE_OPEN, true));
  ExpectStatus(Contribute("w0", kRounds), StatusCode::INVALID_ARGUMENT,
               "past the job's last round 1 (JobConfig.rounds = 2)");
  CO2_ASSERT_OK(Leave("w0"));
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_FINISHED, true));
  EXPECT_FALSE(JobInMetrics());

  // The same job again, as a new run: refused, saying why and what to do.
  ExpectStatus(Join("w0"), StatusCode::FAILED_PRECONDITION,
               "job \"job\" is finished: all its 2 rounds closed (the final "
               "round is 1)");
  // A member restarted without its state ends on the final anchor.
  v1::JoinResponse joined;
  CO2_ASSERT_OK(Join("w0", /*rejoin=*/true, &joined));
  EXPECT_EQ(joined.open_round(), kRounds);
  EXPECT_FALSE(joined.must_seed());
  CO2_ASSERT_OK(Leave("w0"));
  EXPECT_EQ(List()[0].state(), v1::JOB_STATE_FINISHED);
  EXPECT_FALSE(JobInMetrics());
}

TEST_F(JobLifecycleServiceTest, FinishedJobLeavesMemoryAndStaysRefused) {
  Start(/*retention=*/absl::ZeroDuration());
  RunWholeJob();
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_FINISHED, /*in_memory=*/false));
  EXPECT_TRUE(Exists(checkpoint_)) << "the final checkpoint stays";
  ExpectStatus(Join("w1"), StatusCode::FAILED_PRECONDITION, "is finished");

  // A restarted shard does not bring it back to life.
  Restart(/*retention=*/absl::Hours(1));
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_FINISHED, /*in_memory=*/false));
  ExpectStatus(Join("w1"), StatusCode::FAILED_PRECONDITION, "is finished");
  // A rejoining member gets it back from disk, at its final round.
  v1::JoinResponse joined;
  CO2_ASSERT_OK(JoinRetrying("w0", /*rejoin=*/true, &joined));
  EXPECT_EQ(joined.open_round(), kRounds);
  EXPECT_TRUE(WaitForState(v1::JOB_STATE_FINISHED, /*in_memory=*/true));
}

TEST_F(JobLifecycleServiceTest, AbandonedJobResumesFromItsCheckpoint) {
  Start(/*retention=*/absl::ZeroDuration());
  CO2_ASSERT_OK(Join("w0"));
  CO2_ASSERT_OK(Seed("w0"));
  CO2_ASSERT_OK(Train("w0", 0, 0));
  // The worker goes silent: its lease runs out, then the job is abandoned
  // and leaves memory and the metrics.
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_ABANDONED, /*in_memory=*/false));
  EXPECT_FALSE(JobInMetrics());
  EXPECT_EQ(List()[0].open_round(), 1u);
  // A worker joining it again continues at round 1, not from scratch.
  v1::JoinResponse joined;
  CO2_ASSERT_OK(JoinRetrying("w1", /*rejoin=*/false, &joined));
  EXPECT_EQ(joined.open_round(), 1u);
  EXPECT_FALSE(joined.must_seed());
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_OPEN, /*in_memory=*/true));
  EXPECT_TRUE(testing::WaitFor([&] { return JobInMetrics(); }, absl::Seconds(10)));
}

TEST_F(JobLifecycleServiceTest, AdminDeletesAJobAndFreesItsName) {
  Start(/*retention=*/absl::Hours(1));
  CO2_ASSERT_OK(Join("w0"));
  v1::DeleteJobResponse deleted;
  ExpectStatus(Delete("job", &deleted), StatusCode::FAILED_PRECONDITION,
               "open with 1 live worker(s) (w0)");
  ExpectStatus(Delete("other", &deleted), StatusCode::NOT_FOUND,
               "no job \"other\"");
  CO2_ASSERT_OK(Seed("w0"));
  CO2_ASSERT_OK(Train("w0", 0, kRounds - 1));
  CO2_ASSERT_OK(Leave("w0"));
  ASSERT_TRUE(WaitForState(v1::JOB_STATE_FINISHED, true));
  ASSERT_TRUE(Exists(checkpoint_));

  CO2_ASSERT_OK(Delete("job", &deleted));
  ASSERT_EQ(deleted.removed_files_size(), 1);
  EXPECT_EQ(deleted.removed_files(0), checkpoint_);
  EXPECT_FALSE(Exists(checkpoint_));
  EXPECT_TRUE(List().empty());
  // The name is free: a new job starts from round 0 and is seeded again.
  v1::JoinResponse joined;
  CO2_ASSERT_OK(Join("w0", false, &joined));
  EXPECT_EQ(joined.open_round(), 0u);
  EXPECT_TRUE(joined.must_seed());
}

}  // namespace
}  // namespace co2
