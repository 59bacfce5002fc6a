#include "common/wire_frames.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "co2/v1/aggregator.pb.h"
#include "gtest/gtest.h"
#include "tests/byte_pieces.h"

namespace co2::common {
namespace {

using testing::BufferBytes;
using testing::Cut;

TEST(WireFramesTest, LengthDelimitedHeaderIsProtobufs) {
  // Lengths on both sides of each varint byte boundary (protobuf leaves an
  // empty bytes field out, so no 0).
  for (size_t size : {1, 127, 128, 16383, 16384, 2097152}) {
    v1::OuterUpdate message;
    message.set_payload(std::string(size, 'x'));
    const std::string want = message.SerializeAsString();
    std::string head;
    AppendLengthDelimitedHeader(v1::OuterUpdate::kPayloadFieldNumber, size,
                                &head);
    EXPECT_EQ(head.size(), LengthDelimitedHeaderSize(
                               v1::OuterUpdate::kPayloadFieldNumber, size));
    EXPECT_EQ(head + std::string(size, 'x'), want) << "size " << size;
  }
}

TEST(WireFramesTest, FrameAliasesThePayloadAndHoldsItsOwner) {
  auto payload = std::make_shared<std::string>(70000, 'p');
  std::weak_ptr<std::string> watch = payload;
  v1::OuterUpdate fields;
  fields.set_round(3);
  v1::OuterUpdate whole = fields;
  whole.set_payload(*payload);
  const std::string_view bytes = *payload;
  std::vector<grpc::Slice> slices;
  {
    grpc::ByteBuffer buffer = FrameWithPayload(
        fields.SerializeAsString(), v1::OuterUpdate::kPayloadFieldNumber, bytes,
        std::move(payload));
    EXPECT_EQ(BufferBytes(buffer, &slices), whole.SerializeAsString());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), bytes.data());
  }
  // The buffer is gone, but a slice still refers to the payload.
  EXPECT_FALSE(watch.expired());
  slices.clear();
  EXPECT_TRUE(watch.expired());
}

TEST(WireFramesTest, EmptyPayloadIsLeftOut) {
  auto payload = std::make_shared<std::string>();
  v1::OuterUpdate fields;
  fields.set_round(5);
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(BufferBytes(FrameWithPayload(fields.SerializeAsString(),
                                         v1::OuterUpdate::kPayloadFieldNumber,
                                         "", payload),
                        &slices),
            fields.SerializeAsString());
  EXPECT_EQ(slices.size(), 1u);
}

TEST(WireFramesTest, TakeSlicesEmptiesTheBufferAndViewsItsBytes) {
  grpc::Slice in[2] = {grpc::Slice(std::string("abc")),
                       grpc::Slice(std::string(100, 'd'))};
  grpc::ByteBuffer buffer(in, 2);
  std::vector<grpc::Slice> slices;
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(TakeSlices(&buffer, &slices, &pieces));
  EXPECT_EQ(buffer.Length(), 0u);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0], "abc");
  EXPECT_EQ(pieces[1], std::string(100, 'd'));
  // Moving the slices keeps the views valid, inline slices included.
  std::vector<grpc::Slice> moved = std::move(slices);
  EXPECT_EQ(pieces[0].data(), reinterpret_cast<const char*>(moved[0].begin()));
}

TEST(WireFramesTest, ReaderReadsEveryWireTypeAcrossPieces) {
  v1::Contribution c;
  c.set_round(uint64_t{1} << 40);
  c.set_chunk_index(300);
  c.set_weight(-2.5);
  c.set_payload(std::string(200, 'q'));
  const std::string bytes = c.SerializeAsString();
  // Cuts inside the round varint, the double and the payload's length.
  WireReader reader(Cut(bytes, {2, 4, 10, 13, 14, 100}));
  int field = 0, type = 0;
  uint64_t value = 0;
  ASSERT_TRUE(reader.ReadTag(&field, &type));
  EXPECT_EQ(field, v1::Contribution::kRoundFieldNumber);
  ASSERT_TRUE(reader.ReadVarint(&value));
  EXPECT_EQ(value, uint64_t{1} << 40);
  ASSERT_TRUE(reader.ReadTag(&field, &type));
  EXPECT_EQ(field, v1::Contribution::kChunkIndexFieldNumber);
  ASSERT_TRUE(reader.Skip(type));
  ASSERT_TRUE(reader.ReadTag(&field, &type));
  EXPECT_EQ(field, v1::Contribution::kWeightFieldNumber);
  ASSERT_TRUE(reader.ReadFixed64(&value));
  double weight = 0;
  std::memcpy(&weight, &value, sizeof weight);
  EXPECT_EQ(weight, -2.5);
  ASSERT_TRUE(reader.ReadTag(&field, &type));
  EXPECT_EQ(field, v1::Contribution::kPayloadFieldNumber);
  std::vector<std::string_view> payload;
  ASSERT_TRUE(reader.ReadLengthDelimited(&payload));
  EXPECT_GT(payload.size(), 1u);
  std::string joined;
  for (std::string_view p : payload) joined.append(p);
  EXPECT_EQ(joined, std::string(200, 'q'));
  EXPECT_TRUE(reader.done());
}

TEST(WireFramesTest, ReaderRejectsTruncatedAndInvalidInput) {
  v1::Contribution c;
  c.set_payload(std::string(50, 'q'));
  const std::string bytes = c.SerializeAsString();
  const std::string cut_short = bytes.substr(0, bytes.size() - 1);
  WireReader truncated(Cut(cut_short, {3}));
  int field = 0, type = 0;
  ASSERT_TRUE(truncated.ReadTag(&field, &type));
  std::vector<std::string_view> payload;
  EXPECT_FALSE(truncated.ReadLengthDelimited(&payload));

  const std::string zero_field("\x00\x01", 2);  // field 0 is not a field
  WireReader zero({zero_field});
  EXPECT_FALSE(zero.ReadTag(&field, &type));

  const std::string endless(11, '\xff');  // a varint longer than 64 bits
  WireReader overlong({endless});
  uint64_t value = 0;
  EXPECT_FALSE(overlong.ReadVarint(&value));

  WireReader group({std::string_view("\x0b", 1)});  // field 1, start group
  ASSERT_TRUE(group.ReadTag(&field, &type));
  EXPECT_FALSE(group.Skip(type));
}

}  // namespace
}  // namespace co2::common
