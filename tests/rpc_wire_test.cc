#include "server/service/rpc_wire.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/byte_pieces.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

using testing::BufferBytes;
using testing::InSlices;

TEST(RpcWireTest, ARequestInSeveralSlicesParses) {
  v1::JoinRequest request;
  request.set_job("job");
  request.set_worker_id("w");
  request.set_resume_round(12);
  const std::string bytes = request.SerializeAsString();
  v1::JoinRequest parsed;
  CO2_ASSERT_OK(ParseRequest(InSlices(bytes, {1, 5}), &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
  EXPECT_TRUE(parsed.has_resume_round());
}

TEST(RpcWireTest, AMalformedBodyIsAnInvalidArgumentNamingTheType) {
  v1::HeartbeatRequest parsed;
  const absl::Status status =
      ParseRequest(InSlices(std::string("\x0a\x7f\x01", 3), {}), &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "malformed co2.v1.HeartbeatRequest: the 3-byte body is not its "
            "protobuf encoding");
}

TEST(RpcWireTest, SerializedMessageIsItsEncoding) {
  v1::HeartbeatResponse response;
  response.set_lease_ms(10000);
  response.set_open_round(3);
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(SerializeMessage(response), &slices),
            response.SerializeAsString());
}

TEST(RpcWireTest, AnAnchorChunkIsItsEncodingAndSharesThePayload) {
  auto snapshot = std::make_shared<AnchorSnapshot>();
  snapshot->anchor_round = 4;
  for (uint32_t c = 0; c < 2; ++c) {
    v1::AnchorChunk& chunk = snapshot->chunks.emplace_back();
    chunk.set_anchor_round(4);
    chunk.set_chunk_index(c);
    chunk.set_payload(std::string(1000 + c, static_cast<char>('a' + c)));
  }
  const std::shared_ptr<const AnchorSnapshot> shared = snapshot;
  const grpc::ByteBuffer buffer = SerializeAnchorChunk(shared, 1);
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(buffer, &slices),
            snapshot->chunks[1].SerializeAsString());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()),
            snapshot->chunks[1].payload().data());
}

TEST(RpcWireTest, KnowsEveryFieldOfAnchorChunk) {
  EXPECT_EQ(v1::AnchorChunk::descriptor()->field_count(), 5)
      << "SerializeAnchorChunk writes AnchorChunk's fields one by one: add "
         "the new field there and to the test above";
}

}  // namespace
}  // namespace co2::server
