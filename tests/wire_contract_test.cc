// What a client written from proto/co2/v1/aggregator.proto alone relies on,
// over real gRPC against a real shard: a Seed is all or nothing, a Fetch
// before the anchor says whether to retry, and a body that is not the
// request's encoding is INVALID_ARGUMENT on every RPC.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/job/job_registry.h"
#include "server/job/job_shard.h"
#include "server/service/aggregator_server.h"
#include "tests/expect_status.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace co2 {
namespace {

using grpc::StatusCode;
using testing::ExpectStatus;
using testing::WaitFor;

// Two chunks on one shard.
constexpr size_t kParams = common::kChunkElements + 1000;

class WireContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Aggregator::NewStub(channel_);
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  }

  v1::JoinResponse Join(const std::string& worker) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::JoinRequest request;
    request.set_job("j");
    request.set_worker_id(worker);
    *request.mutable_config() = common::DefaultJobConfig(kParams, 1);
    request.mutable_config()->set_min_workers(1);
    request.set_uplink_codec(v1::CODEC_FP32);
    v1::JoinResponse response;
    const grpc::Status status = stub_->Join(&context, request, &response);
    CO2_EXPECT_OK(status);
    return response;
  }

  // Chunk `c` of `anchor` (kParams values).
  static v1::AnchorChunk Chunk(uint32_t c, const std::vector<float>& anchor) {
    v1::AnchorChunk chunk;
    chunk.set_job("j");
    chunk.set_worker_id("a");
    chunk.set_chunk_index(c);
    const common::Range r = common::ChunkRange(kParams, c);
    chunk.set_payload(std::string(
        reinterpret_cast<const char*>(anchor.data() + r.begin),
        r.size() * sizeof(float)));
    return chunk;
  }
  // Chunk `c` of an anchor whose every element is `value`.
  static v1::AnchorChunk Chunk(uint32_t c, float value) {
    return Chunk(c, std::vector<float>(kParams, value));
  }

  // The shard's anchor buffer for job "j" (what a seed wrote so far).
  std::vector<float> ShardAnchor() {
    auto job = server_->registry()->Find("j");
    if (!job.ok()) return {};
    uint64_t round = 0;
    return (*job)->AnchorForTesting(&round);
  }

  // A Seed stream of `chunks`, half-closed after them; how it ended.
  grpc::Status Seed(const std::vector<v1::AnchorChunk>& chunks) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SeedResponse response;
    auto writer = stub_->Seed(&context, &response);
    for (const v1::AnchorChunk& chunk : chunks) writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  // Fetches as `worker`: how it ended, and the anchor's values.
  grpc::Status Fetch(const std::string& worker, std::vector<float>* anchor) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::FetchRequest request;
    request.set_job("j");
    request.set_worker_id(worker);
    auto reader = stub_->Fetch(&context, request);
    v1::AnchorChunk chunk;
    anchor->clear();
    while (reader->Read(&chunk)) {
      const size_t n = chunk.payload().size() / sizeof(float);
      const size_t at = anchor->size();
      anchor->resize(at + n);
      std::memcpy(anchor->data() + at, chunk.payload().data(),
                  n * sizeof(float));
    }
    return reader->Finish();
  }

  // Calls `method` with one message of raw `body`, half-closing after it,
  // whatever its kind (unary or streaming); how it ended.
  grpc::Status CallWithBody(const std::string& method, const std::string& body) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::CompletionQueue cq;
    void* tag = nullptr;
    bool ok = false;
    auto call = stub.PrepareCall(&context, method, &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    grpc::Slice slice(body);
    grpc::ByteBuffer buffer(&slice, 1);
    call->WriteLast(buffer, grpc::WriteOptions(), reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    grpc::ByteBuffer response;
    do {
      call->Read(&response, reinterpret_cast<void*>(3));
      cq.Next(&tag, &ok);
    } while (ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  std::unique_ptr<server::AggregatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(WireContractTest, ASeedCutOffPartWayLeavesNothingAndItsRetrySucceeds) {
  ASSERT_TRUE(Join("a").must_seed());
  Join("b");
  // Ended after chunk 0 of 2.
  ExpectStatus(Seed({Chunk(0, 1.0f)}), StatusCode::INVALID_ARGUMENT,
               "seed ended after 1 chunks of 2");
  // Chunk 1 alone does not complete the anchor from the broken seed's chunk 0.
  ExpectStatus(Seed({Chunk(1, 1.0f)}), StatusCode::INVALID_ARGUMENT,
               "chunk_index 1 out of order: expected 0");
  // A malformed second chunk.
  v1::AnchorChunk short_chunk = Chunk(1, 1.0f);
  short_chunk.mutable_payload()->resize(12);
  ExpectStatus(Seed({Chunk(0, 1.0f), short_chunk}),
               StatusCode::INVALID_ARGUMENT, "12");
  // Cancelled by the client after chunk 0, once the shard holds that chunk:
  // the shard, not only the client, saw a seed cut off part-way.
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SeedResponse response;
    auto writer = stub_->Seed(&context, &response);
    ASSERT_TRUE(writer->Write(Chunk(0, 3.0f)));
    const common::Range first = common::ChunkRange(kParams, 0);
    ASSERT_TRUE(WaitFor(
        [&] {
          const std::vector<float> held = ShardAnchor();
          return held.size() == kParams &&
                 std::all_of(held.begin() + first.begin,
                             held.begin() + first.end,
                             [](float v) { return v == 3.0f; });
        },
        absl::Seconds(10)))
        << "the shard never held chunk 0 of the seed";
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), StatusCode::CANCELLED);
  }
  // Nothing of it counts: chunk 1 does not complete it, and there is no
  // anchor to fetch.
  ExpectStatus(Seed({Chunk(1, 3.0f)}), StatusCode::INVALID_ARGUMENT,
               "chunk_index 1 out of order: expected 0");
  std::vector<float> anchor;
  ExpectStatus(Fetch("b", &anchor), StatusCode::UNAVAILABLE, "no anchor");
  // The seeder's retry, the whole seed, succeeds; the anchor is its bytes,
  // each element in its place, and nothing of the broken seeds.
  std::vector<float> retry(kParams);
  for (size_t i = 0; i < kParams; ++i) retry[i] = 2.0f + 0.001f * i;
  const grpc::Status seeded = Seed({Chunk(0, retry), Chunk(1, retry)});
  CO2_ASSERT_OK(seeded);
  const grpc::Status fetched = Fetch("b", &anchor);
  CO2_ASSERT_OK(fetched);
  ASSERT_EQ(anchor.size(), kParams);
  EXPECT_EQ(std::memcmp(anchor.data(), retry.data(), kParams * sizeof(float)),
            0);
  EXPECT_EQ(ShardAnchor(), retry);
}

TEST_F(WireContractTest, AFetchBeforeTheAnchorSaysWhetherToRetry) {
  ASSERT_TRUE(Join("a").must_seed());
  ASSERT_FALSE(Join("b").must_seed());
  std::vector<float> anchor;
  // Another worker seeds it: retry.
  ExpectStatus(Fetch("b", &anchor), StatusCode::UNAVAILABLE,
               "being seeded by worker \"a\"); retry");
  // The seeder itself can only Seed: retrying the Fetch cannot help.
  ExpectStatus(Fetch("a", &anchor), StatusCode::FAILED_PRECONDITION,
               "worker \"a\" was told to seed job \"j\" on shard 0");
}

TEST_F(WireContractTest, AMalformedBodyIsAnInvalidArgumentOnEveryRpc) {
  Join("a");
  // A length-delimited field 1 that claims more bytes than follow.
  const std::string garbage("\x0a\x7f\x01\x02", 4);
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"Join", "JoinRequest"},           {"Seed", "AnchorChunk"},
      {"Fetch", "FetchRequest"},         {"Exchange", "ExchangeRequest"},
      {"Heartbeat", "HeartbeatRequest"}, {"Leave", "LeaveRequest"},
  };
  for (const auto& [method, message] : methods) {
    SCOPED_TRACE(method);
    const grpc::Status status =
        CallWithBody("/co2.v1.Aggregator/" + method, garbage);
    ExpectStatus(status, StatusCode::INVALID_ARGUMENT,
                 method == "Exchange" ? "malformed ExchangeRequest"
                                      : "malformed co2.v1." + message);
  }
  // The worker is still there: nothing above was taken for a request.
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::HeartbeatRequest beat;
  beat.set_job("j");
  beat.set_worker_id("a");
  v1::HeartbeatResponse renewed;
  CO2_EXPECT_OK(stub_->Heartbeat(&context, beat, &renewed));
}

}  // namespace
}  // namespace co2
