// Every bad request gets its documented status code and a message naming the
// bad value, over real gRPC against a real shard; garbage never crashes it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/service/aggregator_server.h"
#include "tests/expect_status.h"
#include "tests/status_matchers.h"

namespace co2 {
namespace {

using grpc::StatusCode;
using testing::ExpectStatus;

constexpr size_t kParams = 1000;  // one shard of one chunk

class AggregatorErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    // These tests send many bad chunks from one worker; eviction after
    // repeated bad chunks has its own test (limits_test).
    options.registry.shard.max_rejected_chunks = 0;
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    stub_ = v1::Aggregator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
  }

  v1::JobConfig Config() {
    v1::JobConfig c = common::DefaultJobConfig(kParams, 1);
    c.set_min_workers(1);
    return c;
  }

  grpc::Status Join(const std::string& job, const std::string& worker,
                    const v1::JobConfig& config,
                    v1::Codec codec = v1::CODEC_FP32,
                    v1::JoinResponse* out = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::JoinRequest request;
    request.set_job(job);
    request.set_worker_id(worker);
    *request.mutable_config() = config;
    request.set_uplink_codec(codec);
    v1::JoinResponse response;
    return stub_->Join(&context, request, out ? out : &response);
  }

  grpc::Status Seed(const std::string& job, const std::string& worker) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::SeedResponse response;
    auto writer = stub_->Seed(&context, &response);
    v1::AnchorChunk chunk;
    chunk.set_job(job);
    chunk.set_worker_id(worker);
    chunk.set_payload(std::string(kParams * sizeof(float), '\0'));
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  static std::string Fp32(float value, size_t n = kParams) {
    std::vector<float> v(n, value);
    std::string bytes(n * sizeof(float), '\0');
    common::Encode(common::Codec::kFp32, v, absl::MakeSpan(bytes.data(), bytes.size()));
    return bytes;
  }

  static v1::ExchangeRequest Contribution(uint64_t round, std::string payload,
                                          uint32_t chunk = 0,
                                          v1::Codec codec = v1::CODEC_FP32) {
    v1::ExchangeRequest request;
    v1::Contribution* c = request.mutable_contribution();
    c->set_round(round);
    c->set_chunk_index(chunk);
    c->set_codec(codec);
    c->set_weight(1.0);
    c->set_payload(std::move(payload));
    return request;
  }

  // Opens an Exchange stream replaying from `replay_from`, sends `requests`,
  // and returns how it ended. In lockstep, waits for the update of each
  // request's round before sending the next, counting them in *updates.
  grpc::Status Exchange(const std::string& job, const std::string& worker,
                        const std::vector<v1::ExchangeRequest>& requests,
                        bool send_open = true, int* updates = nullptr,
                        bool lockstep = false, uint64_t replay_from = 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto stream = stub_->Exchange(&context);
    if (send_open) {
      v1::ExchangeRequest open;
      open.mutable_open()->set_job(job);
      open.mutable_open()->set_worker_id(worker);
      open.mutable_open()->set_replay_from_round(replay_from);
      stream->Write(open);
    }
    v1::OuterUpdate update;
    int received = 0;
    for (const auto& r : requests) {
      stream->Write(r);
      while (lockstep && stream->Read(&update)) {
        if (update.chunk_index() + 1 == update.num_chunks()) {
          ++received;
          break;
        }
      }
    }
    stream->WritesDone();
    while (stream->Read(&update)) {
    }
    if (updates) *updates = received;
    return stream->Finish();
  }

  std::unique_ptr<server::AggregatorServer> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(AggregatorErrorsTest, JoinValidatesEveryField) {
  ExpectStatus(Join("", "w", Config()), StatusCode::INVALID_ARGUMENT,
               "job is empty");
  ExpectStatus(Join("j", "", Config()), StatusCode::INVALID_ARGUMENT,
               "worker_id is empty");
  ExpectStatus(Join(std::string(500, 'x'), "w", Config()),
               StatusCode::INVALID_ARGUMENT, "500 bytes long");
  ExpectStatus(Join("j", "w", Config(), v1::Codec(42)),
               StatusCode::INVALID_ARGUMENT, "42");
  v1::JobConfig bad = Config();
  bad.set_beta(2.0f);
  ExpectStatus(Join("j", "w", bad), StatusCode::INVALID_ARGUMENT,
               "beta must be in [0, 1), got 2");
  v1::JobConfig shards = Config();
  shards.set_num_parameters(3 * 65536);  // enough blocks for 3 shards
  shards.set_num_shards(3);
  ExpectStatus(Join("j", "w", shards), StatusCode::INVALID_ARGUMENT,
               "num_shards is 3");
  v1::JobConfig blocks = Config();
  blocks.set_num_shards(2);  // 1000 parameters: one block
  ExpectStatus(Join("j", "w", blocks), StatusCode::INVALID_ARGUMENT,
               "every shard needs a block");
}

TEST_F(AggregatorErrorsTest, JoinWithAnotherConfigIsAPreconditionFailure) {
  CO2_ASSERT_OK(Join("j", "a", Config()));
  v1::JobConfig other = Config();
  other.set_alpha(0.25f);
  ExpectStatus(Join("j", "b", other), StatusCode::FAILED_PRECONDITION, "alpha");
}

TEST_F(AggregatorErrorsTest, UnknownJobOrWorkerIsNotFound) {
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  request.set_job("nope");
  request.set_worker_id("w");
  v1::HeartbeatResponse response;
  ExpectStatus(stub_->Heartbeat(&context, request, &response),
               StatusCode::NOT_FOUND, "unknown job \"nope\"");
  CO2_ASSERT_OK(Join("j", "a", Config()));
  ExpectStatus(Exchange("j", "stranger", {}), StatusCode::NOT_FOUND,
               "worker \"stranger\"");
}

TEST_F(AggregatorErrorsTest, SeedAndFetchFollowTheSeederProtocol) {
  v1::JoinResponse first, second;
  CO2_ASSERT_OK(Join("j", "a", Config(), v1::CODEC_FP32, &first));
  CO2_ASSERT_OK(Join("j", "b", Config(), v1::CODEC_FP32, &second));
  EXPECT_TRUE(first.must_seed());
  EXPECT_FALSE(second.must_seed());
  {
    grpc::ClientContext context;
    v1::FetchRequest request;
    request.set_job("j");
    request.set_worker_id("b");
    auto reader = stub_->Fetch(&context, request);
    v1::AnchorChunk chunk;
    while (reader->Read(&chunk)) {
    }
    ExpectStatus(reader->Finish(), StatusCode::UNAVAILABLE, "no anchor on shard 0 yet");
  }
  ExpectStatus(Seed("j", "b"), StatusCode::FAILED_PRECONDITION,
               "was not asked to seed");
  CO2_ASSERT_OK(Seed("j", "a"));
  ExpectStatus(Seed("j", "a"), StatusCode::FAILED_PRECONDITION,
               "already has an anchor");
}

TEST_F(AggregatorErrorsTest, ContributionsAreValidated) {
  CO2_ASSERT_OK(Join("j", "a", Config()));
  CO2_ASSERT_OK(Seed("j", "a"));
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1))}, false),
               StatusCode::INVALID_ARGUMENT, "first message");
  ExpectStatus(Exchange("j", "a", {v1::ExchangeRequest()}),
               StatusCode::INVALID_ARGUMENT, "open or contribution");
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1, kParams - 1))}),
               StatusCode::INVALID_ARGUMENT, "3996");
  std::string nan = Fp32(1);
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + 17 * sizeof(float), &q, sizeof(float));
  ExpectStatus(Exchange("j", "a", {Contribution(0, nan)}),
               StatusCode::INVALID_ARGUMENT, "17");
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(INFINITY))}),
               StatusCode::INVALID_ARGUMENT, "inf");
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1), 3)}),
               StatusCode::INVALID_ARGUMENT, "chunk_index 3 out of range");
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1), 0, v1::CODEC_BF16)}),
               StatusCode::INVALID_ARGUMENT, "differs from the codec");
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1), 0, v1::Codec(7))}),
               StatusCode::INVALID_ARGUMENT, "7");
  v1::ExchangeRequest negative = Contribution(0, Fp32(1));
  negative.mutable_contribution()->set_weight(-2);
  ExpectStatus(Exchange("j", "a", {negative}), StatusCode::INVALID_ARGUMENT,
               "weight");
  // Nothing above reached the anchor: no round closed.
  auto job = server_->registry()->Find("j");
  CO2_ASSERT_OK(job);
  EXPECT_EQ((*job)->stats().rounds_closed, 0u);
}

TEST_F(AggregatorErrorsTest, StaleRoundsAreAbortedAndFutureOnesRefused) {
  CO2_ASSERT_OK(Join("j", "a", Config()));
  CO2_ASSERT_OK(Seed("j", "a"));
  int updates = 0;
  const grpc::Status lockstep = Exchange(
      "j", "a",
      {Contribution(0, Fp32(1)), Contribution(1, Fp32(1)),
       Contribution(2, Fp32(1))},
      true, &updates, /*lockstep=*/true);
  CO2_ASSERT_OK(lockstep)
      << "rounds closed: "
      << (*server_->registry()->Find("j"))->stats().rounds_closed;
  EXPECT_EQ(updates, 3);
  // Streams that need no replay open at the open round.
  ExpectStatus(Exchange("j", "a", {Contribution(0, Fp32(1))}, true, nullptr,
                        false, 3),
               StatusCode::ABORTED, "round 0 is stale: open round is 3");
  ExpectStatus(Exchange("j", "a", {Contribution(9, Fp32(1))}, true, nullptr,
                        false, 3),
               StatusCode::FAILED_PRECONDITION, "round 9 is ahead");
  // A resend of the last closed round is folded, not an error.
  CO2_EXPECT_OK(
      Exchange("j", "a", {Contribution(2, Fp32(1))}, true, nullptr, false, 3));
  // The shard keeps the updates of rounds 1 and 2; round 0's is gone.
  ExpectStatus(Exchange("j", "a", {}, true, nullptr, false, 1),
               StatusCode::OK, "");
  ExpectStatus(Exchange("j", "a", {}), StatusCode::FAILED_PRECONDITION,
               "replay_from_round 0 is older than the oldest update shard 0 "
               "holds for job \"j\" (round 1; open round 3)");
}

TEST_F(AggregatorErrorsTest, GarbageBytesDoNotHurtTheServer) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string garbage = attempt == 0 ? "GET / HTTP/1.1\r\n\r\n"
                                       : std::string(4096, char(0x5a + attempt));
    (void)!write(fd, garbage.data(), garbage.size());
    close(fd);
  }
  CO2_EXPECT_OK(Join("j", "a", Config()));
}

}  // namespace
}  // namespace co2
