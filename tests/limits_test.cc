// Limits and bad input: every limit (message size, jobs, workers per job,
// parameters per job) is enforced with RESOURCE_EXHAUSTED and a message
// naming the value and the limit; NaN/Inf contributions are rejected and
// counted, and a worker that keeps sending them is evicted. Over real gRPC
// against a real shard, plus JobShard directly for the counting rules.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/job/job_shard.h"
#include "server/service/aggregator_server.h"
#include "tests/status_matchers.h"

namespace co2 {
namespace {

using grpc::StatusCode;

constexpr size_t kParams = 1000;  // one shard of one chunk

v1::JobConfig Config(uint64_t params = kParams) {
  v1::JobConfig c = common::DefaultJobConfig(params, 1);
  c.set_min_workers(1);
  return c;
}

std::string Fp32(float value, size_t n = kParams) {
  std::vector<float> v(n, value);
  std::string bytes(n * sizeof(float), '\0');
  common::Encode(common::Codec::kFp32, v,
                 absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

std::string WithNan(size_t at) {
  std::string bytes = Fp32(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + at * sizeof(float), &nan, sizeof(float));
  return bytes;
}

v1::Contribution Chunk(uint64_t round, std::string payload) {
  v1::Contribution c;
  c.set_round(round);
  c.set_chunk_index(0);
  c.set_codec(v1::CODEC_FP32);
  c.set_weight(1.0);
  c.set_payload(std::move(payload));
  return c;
}

void ExpectStatus(const grpc::Status& s, StatusCode code,
                  const std::vector<std::string>& parts) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  for (const std::string& part : parts) {
    EXPECT_NE(s.error_message().find(part), std::string::npos)
        << "message: " << s.error_message() << "\nexpected to contain: "
        << part;
  }
}

class LimitsTest : public ::testing::Test {
 protected:
  void Start(const server::AggregatorServerOptions& base) {
    server::AggregatorServerOptions options = base;
    options.address = "127.0.0.1:0";
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);  // the client may send anything
    stub_ = v1::Aggregator::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()),
        grpc::InsecureChannelCredentials(), args));
  }

  grpc::Status Join(const std::string& job, const std::string& worker,
                    const v1::JobConfig& config = Config()) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::JoinRequest request;
    request.set_job(job);
    request.set_worker_id(worker);
    *request.mutable_config() = config;
    request.set_uplink_codec(v1::CODEC_FP32);
    v1::JoinResponse response;
    return stub_->Join(&context, request, &response);
  }

  grpc::Status Seed(const std::string& job, const std::string& worker) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::SeedResponse response;
    auto writer = stub_->Seed(&context, &response);
    v1::AnchorChunk chunk;
    chunk.set_job(job);
    chunk.set_worker_id(worker);
    chunk.set_payload(Fp32(0));
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Heartbeat(const std::string& job, const std::string& worker) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::HeartbeatRequest request;
    request.set_job(job);
    request.set_worker_id(worker);
    v1::HeartbeatResponse response;
    return stub_->Heartbeat(&context, request, &response);
  }

  // Opens an Exchange stream, sends one contribution, and returns how the
  // stream ended (after the round's update, if one comes).
  grpc::Status Exchange(const std::string& job, const std::string& worker,
                        const v1::Contribution& contribution,
                        bool wait_for_update = false) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto stream = stub_->Exchange(&context);
    v1::ExchangeRequest open;
    open.mutable_open()->set_job(job);
    open.mutable_open()->set_worker_id(worker);
    stream->Write(open);
    v1::ExchangeRequest request;
    *request.mutable_contribution() = contribution;
    stream->Write(request);
    v1::OuterUpdate update;
    if (wait_for_update) stream->Read(&update);
    stream->WritesDone();
    while (stream->Read(&update)) {
    }
    return stream->Finish();
  }

  server::JobShard* Job(const std::string& name) {
    auto job = server_->registry()->Find(name);
    CO2_EXPECT_OK(job);
    return job.ok() ? job->get() : nullptr;
  }

  std::unique_ptr<server::AggregatorServer> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(LimitsTest, OversizedMessagesAreRefusedByGrpc) {
  server::AggregatorServerOptions options;
  options.max_message_bytes = 64 << 10;
  Start(options);
  // A job id of 100 KiB never reaches the handler.
  ExpectStatus(Join(std::string(100 << 10, 'j'), "w"),
               StatusCode::RESOURCE_EXHAUSTED, {"larger than max"});
  // Nor does a contribution chunk bigger than the limit.
  const v1::JobConfig big = Config(1 << 16);
  CO2_ASSERT_OK(Join("j", "w", big));
  ExpectStatus(Exchange("j", "w", Chunk(0, Fp32(1, 1 << 16))),
               StatusCode::RESOURCE_EXHAUSTED, {"larger than max"});
  // Messages under the limit still work.
  CO2_EXPECT_OK(Join("j", "w2", big));
}

TEST_F(LimitsTest, JobsPerShardAreLimited) {
  server::AggregatorServerOptions options;
  options.registry.max_jobs = 2;
  Start(options);
  CO2_ASSERT_OK(Join("a", "w"));
  CO2_ASSERT_OK(Join("b", "w"));
  ExpectStatus(Join("c", "w"), StatusCode::RESOURCE_EXHAUSTED,
               {"cannot create job \"c\"", "2 jobs already", "limit 2"});
  CO2_EXPECT_OK(Join("a", "w2")) << "existing jobs stay usable";
}

TEST_F(LimitsTest, WorkersPerJobAreLimited) {
  server::AggregatorServerOptions options;
  options.registry.shard.max_workers = 2;
  Start(options);
  CO2_ASSERT_OK(Join("j", "w0"));
  CO2_ASSERT_OK(Join("j", "w1"));
  ExpectStatus(Join("j", "w2"), StatusCode::RESOURCE_EXHAUSTED,
               {"already has 2 workers", "limit 2"});
  CO2_EXPECT_OK(Join("j", "w1")) << "a member may rejoin";
  CO2_EXPECT_OK(Join("other", "w2")) << "the limit is per job";
}

TEST_F(LimitsTest, ParametersPerJobAreLimited) {
  server::AggregatorServerOptions options;
  options.registry.max_parameters = 1 << 20;
  Start(options);
  ExpectStatus(Join("j", "w", Config((1 << 20) + 1)),
               StatusCode::RESOURCE_EXHAUSTED,
               {"num_parameters is 1048577", "limit 1048576"});
  EXPECT_FALSE(server_->registry()->Find("j").ok()) << "nothing allocated";
  // The default limit keeps a single Join from asking for petabytes.
  CO2_EXPECT_OK(Join("j", "w", Config(1 << 20)));
}

TEST_F(LimitsTest, DefaultParameterLimitStopsAbsurdJobs) {
  Start({});
  ExpectStatus(Join("huge", "w", Config(uint64_t{1} << 50)),
               StatusCode::RESOURCE_EXHAUSTED, {"num_parameters"});
}

TEST_F(LimitsTest, NanContributionsAreCountedAndTheWorkerEvicted) {
  server::AggregatorServerOptions options;
  options.registry.shard.max_rejected_chunks = 3;
  Start(options);
  CO2_ASSERT_OK(Join("j", "bad"));
  CO2_ASSERT_OK(Join("j", "good"));
  CO2_ASSERT_OK(Seed("j", "bad"));
  ExpectStatus(Exchange("j", "bad", Chunk(0, WithNan(5))),
               StatusCode::INVALID_ARGUMENT, {"round 0 chunk 0", "5"});
  ExpectStatus(Exchange("j", "bad", Chunk(0, Fp32(INFINITY))),
               StatusCode::INVALID_ARGUMENT, {"inf"});
  EXPECT_EQ(Job("j")->stats().evicted_workers, 0u);
  ExpectStatus(Exchange("j", "bad", Chunk(0, WithNan(7))),
               StatusCode::INVALID_ARGUMENT, {"evicted after 3"});
  const server::JobShardStats stats = Job("j")->stats();
  EXPECT_EQ(stats.rejected_chunks, 3u);
  EXPECT_EQ(stats.evicted_workers, 1u);
  EXPECT_EQ(stats.live_workers, 1u);
  // Every later call says it was evicted and why; it may not rejoin.
  ExpectStatus(Heartbeat("j", "bad"), StatusCode::FAILED_PRECONDITION,
               {"worker \"bad\" was evicted", "3 invalid contribution chunks",
                "not finite"});
  ExpectStatus(Exchange("j", "bad", Chunk(0, Fp32(1))),
               StatusCode::FAILED_PRECONDITION, {"evicted"});
  ExpectStatus(Join("j", "bad"), StatusCode::FAILED_PRECONDITION,
               {"evicted", "cannot rejoin"});
  // The rounds go on without it: the good worker alone closes round 0, and
  // nothing of the bad one reached the anchor.
  CO2_ASSERT_OK(Exchange("j", "good", Chunk(0, Fp32(0.5f)), true));
  EXPECT_EQ(Job("j")->stats().rounds_closed, 1u);
}

// Counting rules, without gRPC: only consecutive rejects evict.
TEST(StreamWindowOptionsTest, ANegativeWindowOrATooSmallBudgetIsRefused) {
  server::AggregatorServerOptions options;
  options.address = "127.0.0.1:0";
  options.stream_window_bytes = -1;
  auto refused = server::AggregatorServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--stream_window_bytes is -1"),
            std::string::npos)
      << refused.status();
  options.stream_window_bytes = 0;
  options.stream_memory_bytes = 1 << 20;
  refused = server::AggregatorServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "--stream_memory_bytes is 1048576: must be at least 16777216"),
            std::string::npos)
      << refused.status();
  options.stream_memory_bytes = int64_t{16} << 20;
  CO2_EXPECT_OK(server::AggregatorServer::Start(options));
}

TEST(RejectCountingTest, AValidChunkResetsTheCount) {
  common::FakeClock clock;
  server::JobShardOptions options;
  options.max_rejected_chunks = 3;
  v1::JobConfig config = Config();
  config.set_min_workers(2);
  auto created = server::JobShard::Create("j", config, options, &clock);
  CO2_ASSERT_OK(created);
  server::JobShard& job = **created;
  CO2_ASSERT_OK(job.Join("w", config, common::Codec::kFp32));
  CO2_ASSERT_OK(job.Join("other", config, common::Codec::kFp32));
  CO2_ASSERT_OK(job.SeedChunk("w", 0, 0, Fp32(0)));
  EXPECT_FALSE(job.Contribute("w", Chunk(0, WithNan(0))).ok());
  EXPECT_FALSE(job.Contribute("w", Chunk(0, WithNan(1))).ok());
  CO2_EXPECT_OK(job.Contribute("w", Chunk(0, Fp32(1))));
  EXPECT_FALSE(job.Contribute("w", Chunk(1, WithNan(2))).ok());
  EXPECT_FALSE(job.Contribute("w", Chunk(1, WithNan(3))).ok());
  CO2_EXPECT_OK(job.Heartbeat("w")) << "4 rejects, never 3 in a row";
  EXPECT_EQ(job.stats().rejected_chunks, 4u);
  EXPECT_EQ(job.stats().evicted_workers, 0u);
  // A wrong-size payload counts as a reject too.
  const absl::Status short_chunk =
      job.Contribute("w", Chunk(1, Fp32(1, kParams - 1)));
  EXPECT_EQ(short_chunk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_chunk.message().find("evicted"), std::string::npos)
      << short_chunk;
  EXPECT_EQ(job.Heartbeat("w").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.stats().live_workers, 1u);
}

TEST(RejectCountingTest, ZeroDisablesEviction) {
  common::FakeClock clock;
  server::JobShardOptions options;
  options.max_rejected_chunks = 0;
  auto created = server::JobShard::Create("j", Config(), options, &clock);
  CO2_ASSERT_OK(created);
  CO2_ASSERT_OK((*created)->Join("w", Config(), common::Codec::kFp32));
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE((*created)->Contribute("w", Chunk(0, WithNan(i))).ok());
  }
  CO2_EXPECT_OK((*created)->Heartbeat("w"));
  EXPECT_EQ((*created)->stats().rejected_chunks, 10u);
}

}  // namespace
}  // namespace co2
