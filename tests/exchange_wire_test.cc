#include "server/service/exchange_wire.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/byte_pieces.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

using testing::BufferBytes;
using testing::InSlices;

TEST(ExchangeWireTest, SerializedUpdateIsTheMessageAndSharesItsPayload) {
  auto update = std::make_shared<v1::OuterUpdate>();
  update->set_round(7);
  update->set_anchor_round(9);
  update->set_chunk_index(3);
  update->set_num_chunks(4);
  update->set_codec(v1::CODEC_BF16);
  update->set_contributors(5);
  update->set_payload(std::string(300000, 'u'));
  update->set_anchor_digest(0x0123456789ABCDEFull);
  v1::HeldOutContribution* held = update->add_held_out();
  held->set_worker_id("w2");
  held->set_reason("its norm 4e6 is 1e6 x the chunk's median 4");
  const grpc::ByteBuffer buffer = SerializeUpdate(update);
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(buffer, &slices), update->SerializeAsString());
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()),
            update->payload().data());
}

TEST(ExchangeWireTest, KnowsEveryFieldOfOuterUpdate) {
  EXPECT_EQ(v1::OuterUpdate::descriptor()->field_count(), 9)
      << "SerializeUpdate copies OuterUpdate's fields one by one: add the "
         "new field there and to the test above";
}

TEST(ExchangeWireTest, UpdateWithoutPayloadIsOneSlice) {
  auto update = std::make_shared<v1::OuterUpdate>();
  update->set_round(1);
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(SerializeUpdate(update), &slices),
            update->SerializeAsString());
}

TEST(ExchangeWireTest, ContributionPayloadStaysInTheReceivedSlices) {
  v1::ExchangeRequest request;
  v1::Contribution* c = request.mutable_contribution();
  c->set_round(12);
  c->set_chunk_index(2);
  c->set_codec(v1::CODEC_FP32);
  c->set_weight(96.5);
  std::string payload(70001, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 7);
  c->set_payload(payload);
  const std::string bytes = request.SerializeAsString();
  grpc::ByteBuffer buffer = InSlices(bytes, {1, 3, 4, 5000, 5000, 65536});
  absl::StatusOr<ExchangeMessage> parsed = ParseExchangeRequest(&buffer);
  CO2_ASSERT_OK(parsed);
  EXPECT_FALSE(parsed->open.has_value());
  ASSERT_TRUE(parsed->contribution.has_value());
  const ContributionView& view = *parsed->contribution;
  EXPECT_EQ(view.round, 12u);
  EXPECT_EQ(view.chunk_index, 2u);
  EXPECT_EQ(view.codec, v1::CODEC_FP32);
  EXPECT_EQ(view.weight, 96.5);
  EXPECT_GT(view.payload.size(), 1u);
  EXPECT_EQ(testing::Joined(view.payload), payload);
  EXPECT_EQ(buffer.Length(), 0u);
}

TEST(ExchangeWireTest, ParsesOpen) {
  v1::ExchangeRequest request;
  request.mutable_open()->set_job("job");
  request.mutable_open()->set_worker_id("w");
  request.mutable_open()->set_replay_from_round(4);
  const std::string bytes = request.SerializeAsString();
  grpc::ByteBuffer buffer = InSlices(bytes, {2, 7});
  absl::StatusOr<ExchangeMessage> parsed = ParseExchangeRequest(&buffer);
  CO2_ASSERT_OK(parsed);
  ASSERT_TRUE(parsed->open.has_value());
  EXPECT_FALSE(parsed->contribution.has_value());
  EXPECT_EQ(parsed->open->job(), "job");
  EXPECT_EQ(parsed->open->worker_id(), "w");
  EXPECT_EQ(parsed->open->replay_from_round(), 4u);
}

TEST(ExchangeWireTest, RejectsTruncatedAndEmptyRequests) {
  v1::ExchangeRequest request;
  request.mutable_contribution()->set_payload(std::string(100, 'p'));
  const std::string bytes = request.SerializeAsString();
  grpc::ByteBuffer truncated =
      InSlices(bytes.substr(0, bytes.size() - 1), {10});
  EXPECT_EQ(ParseExchangeRequest(&truncated).status().code(),
            absl::StatusCode::kInvalidArgument);
  grpc::ByteBuffer empty = InSlices("", {});
  EXPECT_EQ(ParseExchangeRequest(&empty).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::server
