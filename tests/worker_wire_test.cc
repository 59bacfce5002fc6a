#include "client/worker_wire.h"

#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tests/byte_pieces.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using testing::BufferBytes;
using testing::InSlices;

TEST(WorkerWireTest, MethodNameIsTheServicesBidiStream) {
  const google::protobuf::MethodDescriptor* method =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          "co2.v1.Aggregator.Exchange");
  ASSERT_NE(method, nullptr);
  EXPECT_TRUE(method->client_streaming());
  EXPECT_TRUE(method->server_streaming());
  EXPECT_EQ(std::string(ExchangeMethod::kName),
            "/" + method->service()->full_name() + "/" + method->name());
  EXPECT_EQ(method->input_type(), v1::ExchangeRequest::descriptor());
  EXPECT_EQ(method->output_type(), v1::OuterUpdate::descriptor());
}

class ContributionSizeTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ContributionSizeTest, IsTheMessagesEncodingAndSharesThePayload) {
  auto payload = std::make_shared<std::string>(GetParam(), '\0');
  for (size_t i = 0; i < payload->size(); ++i) (*payload)[i] = char(i * 13);
  ContributionHeader header;
  header.round = 77;
  header.chunk_index = 5;
  header.codec = v1::CODEC_BF16;
  header.weight = 384.25;
  v1::ExchangeRequest want;
  v1::Contribution* c = want.mutable_contribution();
  c->set_round(77);
  c->set_chunk_index(5);
  c->set_codec(v1::CODEC_BF16);
  c->set_weight(384.25);
  c->set_payload(*payload);
  const char* data = payload->data();
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(
      BufferBytes(SerializeContribution(header, std::move(payload)), &slices),
      want.SerializeAsString());
  if (GetParam() > 0) {
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), data);
  }
}

// Payload sizes where the payload's and the contribution's length varints
// change width.
INSTANTIATE_TEST_SUITE_P(Sizes, ContributionSizeTest,
                         ::testing::Values(0, 1, 100, 127, 128, 16360, 16400,
                                           1 << 20));

TEST(WorkerWireTest, OpenIsTheMessagesEncoding) {
  v1::ExchangeOpen open;
  open.set_job("job");
  open.set_worker_id("w7");
  open.set_replay_from_round(12);
  v1::ExchangeRequest want;
  *want.mutable_open() = open;
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(SerializeOpen(open), &slices),
            want.SerializeAsString());
}

TEST(WorkerWireTest, UpdatePayloadStaysInTheReceivedSlices) {
  v1::OuterUpdate update;
  update.set_round(41);
  update.set_anchor_round(43);
  update.set_chunk_index(2);
  update.set_num_chunks(3);
  update.set_codec(v1::CODEC_FP32);
  update.set_contributors(4);
  std::string payload(90001, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 3);
  update.set_payload(payload);
  v1::HeldOutContribution* held = update.add_held_out();
  held->set_worker_id("worker-2");
  held->set_reason("its norm 4e6 is 1e6 x the chunk's median 4");
  const std::string bytes = update.SerializeAsString();
  // The held-out entry, after the payload, is cut across slices too.
  grpc::ByteBuffer buffer =
      InSlices(bytes, {1, 2, 9, 17, 4000, 65536, bytes.size() - 20});
  absl::StatusOr<ReceivedUpdate> parsed = ParseOuterUpdate(&buffer);
  CO2_ASSERT_OK(parsed);
  EXPECT_EQ(buffer.Length(), 0u);
  // Moved, as the stream moves it into its receive buffer.
  const ReceivedUpdate got = *std::move(parsed);
  EXPECT_EQ(got.round, 41u);
  EXPECT_EQ(got.chunk_index, 2u);
  EXPECT_EQ(got.codec, v1::CODEC_FP32);
  EXPECT_GT(got.payload.size(), 1u);
  EXPECT_EQ(testing::Joined(got.payload), payload);
  ASSERT_EQ(got.held_out.size(), 1u);
  EXPECT_EQ(got.held_out[0].worker_id(), "worker-2");
  EXPECT_EQ(got.held_out[0].reason(), held->reason());
}

TEST(WorkerWireTest, Int8PayloadInSeveralSlicesStaysInThem) {
  v1::OuterUpdate update;
  update.set_round(1);
  update.set_codec(v1::CODEC_INT8);
  update.set_payload(std::string(5000, 'i'));
  const std::string bytes = update.SerializeAsString();
  grpc::ByteBuffer buffer = InSlices(bytes, {10, 2000});
  absl::StatusOr<ReceivedUpdate> parsed = ParseOuterUpdate(&buffer);
  CO2_ASSERT_OK(parsed);
  const ReceivedUpdate got = *std::move(parsed);
  // Both cuts fall inside the payload.
  ASSERT_EQ(got.payload.size(), 3u);
  EXPECT_EQ(testing::Joined(got.payload), std::string(5000, 'i'));
  ASSERT_FALSE(got.slices.empty());
  EXPECT_EQ(got.payload.back().data(),
            reinterpret_cast<const char*>(got.slices.back().begin()))
      << "copied";
}

TEST(WorkerWireTest, RejectsMalformedUpdates) {
  v1::OuterUpdate update;
  update.set_round(9);
  update.set_payload(std::string(300, 'u'));
  const std::string bytes = update.SerializeAsString();
  grpc::ByteBuffer truncated = InSlices(bytes.substr(0, bytes.size() - 1), {4});
  absl::StatusOr<ReceivedUpdate> parsed = ParseOuterUpdate(&truncated);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("malformed OuterUpdate"),
            std::string::npos)
      << parsed.status();
  grpc::ByteBuffer garbage = InSlices(std::string("\x07\x01", 2), {});
  EXPECT_EQ(ParseOuterUpdate(&garbage).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::client
