// FetchAnchor and SeedAnchor against a scripted in-process shard (a real
// gRPC server whose Fetch and Seed this test writes): what a worker does
// with a whole anchor, a short stream, a chunk that fails validation.
#include "client/shard_calls.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::HasSubstr;

// Two chunks and a bit: chunk 2 is short.
const size_t kElements = 2 * common::kChunkElements + 5;

// Answers Fetch with chunks of `anchor` as it is told; records a Seed.
class ScriptedShard final : public v1::Aggregator::Service {
 public:
  std::vector<float> anchor = std::vector<float>(kElements, 0.5f);
  std::vector<uint32_t> send_chunks = {0, 1, 2};
  std::vector<float> seeded = std::vector<float>(kElements, 0.0f);

  grpc::Status Fetch(grpc::ServerContext*, const v1::FetchRequest*,
                     grpc::ServerWriter<v1::AnchorChunk>* writer) override {
    for (uint32_t c : send_chunks) {
      v1::AnchorChunk chunk;
      chunk.set_anchor_round(7);
      chunk.set_chunk_index(c);
      if (c >= common::NumChunks(kElements)) {  // a chunk that cannot exist
        chunk.set_payload(std::string(sizeof(float), '\0'));
        writer->Write(chunk);
        continue;
      }
      const common::Range r = common::ChunkRange(kElements, c);
      chunk.mutable_payload()->resize(r.size() * sizeof(float));
      common::Encode(common::Codec::kFp32,
                     absl::MakeConstSpan(anchor).subspan(r.begin, r.size()),
                     absl::MakeSpan(chunk.mutable_payload()->data(),
                                    chunk.payload().size()));
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }

  grpc::Status Seed(grpc::ServerContext*,
                    grpc::ServerReader<v1::AnchorChunk>* reader,
                    v1::SeedResponse* response) override {
    v1::AnchorChunk chunk;
    while (reader->Read(&chunk)) {
      const common::Range r =
          common::ChunkRange(kElements, chunk.chunk_index());
      common::Decode(common::Codec::kFp32, chunk.payload(),
                     absl::MakeSpan(seeded).subspan(r.begin, r.size()));
      response->set_anchor_round(chunk.anchor_round());
    }
    return grpc::Status::OK;
  }
};

class ShardCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&shard_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Aggregator::NewStub(MakeShardChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(),
        absl::Milliseconds(50), absl::Milliseconds(500)));
  }
  void TearDown() override { server_->Shutdown(); }

  absl::StatusOr<uint64_t> Fetch(std::vector<float>& out) {
    return FetchAnchor(stub_.get(), "job", "w0", absl::MakeSpan(out),
                       absl::Now() + absl::Seconds(10));
  }

  ScriptedShard shard_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(ShardCallsTest, FetchWritesEveryChunkAndReturnsTheRound) {
  for (size_t i = 0; i < kElements; ++i) shard_.anchor[i] = 0.25f * i;
  shard_.send_chunks = {2, 0, 1};  // any order
  std::vector<float> out(kElements, -1.0f);
  const absl::StatusOr<uint64_t> round = Fetch(out);
  CO2_ASSERT_OK(round);
  EXPECT_EQ(*round, 7u);
  EXPECT_EQ(out, shard_.anchor);
}

TEST_F(ShardCallsTest, FetchThatEndsEarlyIsDataLoss) {
  shard_.send_chunks = {0, 2, 0};  // chunk 1 never comes; 0 twice
  std::vector<float> out(kElements);
  const absl::StatusOr<uint64_t> round = Fetch(out);
  ASSERT_EQ(round.status().code(), absl::StatusCode::kDataLoss)
      << round.status();
  EXPECT_THAT(round.status().message(), HasSubstr("2 of 3 anchor chunks"));
}

TEST_F(ShardCallsTest, FetchRejectsANonFiniteChunk) {
  shard_.anchor[common::kChunkElements + 3] = std::nanf("");
  std::vector<float> out(kElements);
  const absl::StatusOr<uint64_t> round = Fetch(out);
  ASSERT_FALSE(round.ok());
  EXPECT_EQ(round.status().code(), absl::StatusCode::kInvalidArgument)
      << round.status();
}

TEST_F(ShardCallsTest, FetchRejectsAChunkIndexOutOfRange) {
  shard_.send_chunks = {0, 3};
  std::vector<float> out(kElements);
  const absl::StatusOr<uint64_t> round = Fetch(out);
  ASSERT_EQ(round.status().code(), absl::StatusCode::kInternal)
      << round.status();
  EXPECT_THAT(round.status().message(), HasSubstr("fetch chunk 3 out of 3"));
}

TEST_F(ShardCallsTest, SeedSendsTheWholeRange) {
  std::vector<float> anchor(kElements);
  for (size_t i = 0; i < kElements; ++i) anchor[i] = 1.0f + i;
  const absl::StatusOr<uint64_t> round =
      SeedAnchor(stub_.get(), "job", "w0", /*anchor_round=*/4, anchor,
                 absl::Now() + absl::Seconds(10));
  CO2_ASSERT_OK(round);
  EXPECT_EQ(*round, 4u);
  EXPECT_EQ(shard_.seeded, anchor);
}

}  // namespace
}  // namespace co2::client
