#include "server/job/contribution_payload.h"

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

constexpr size_t kElements = common::kChunkElements + 2048;  // 2 chunks
constexpr size_t kLastChunk = 2048;  // elements of chunk 1

std::string Encoded(common::Codec codec, const std::vector<float>& values) {
  std::string bytes(common::EncodedSize(codec, values.size()), '\0');
  common::Encode(codec, values, absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

ContributionView View(common::Codec codec, uint32_t chunk_index,
                      common::Pieces pieces) {
  ContributionView c;
  c.round = 3;
  c.chunk_index = chunk_index;
  c.codec = static_cast<int>(codec);
  c.weight = 1;
  c.payload = pieces;
  return c;
}

TEST(ContributionPayloadTest, RefusesAMalformedRequest) {
  const std::string bytes = Encoded(common::Codec::kFp32, {1, 2});
  const std::string_view piece = bytes;
  ContributionPayload payload;
  ContributionView unknown = View(common::Codec::kFp32, 0, {&piece, 1});
  unknown.codec = 99;
  EXPECT_EQ(payload.Read(unknown, kElements).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status out_of_range =
      payload.Read(View(common::Codec::kFp32, 2, {&piece, 1}), kElements);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.message(),
            "chunk_index 2 out of range: shard has 2 chunks");
}

TEST(ContributionPayloadTest, ReadsFp32PiecesInPlace) {
  const std::string bytes =
      Encoded(common::Codec::kFp32, std::vector<float>(kLastChunk, 0.5f));
  const std::string_view pieces[] = {std::string_view(bytes).substr(0, 100),
                                     std::string_view(bytes).substr(100)};
  ContributionPayload payload;
  CO2_ASSERT_OK(payload.Read(View(common::Codec::kFp32, 1, pieces), kElements));
  EXPECT_EQ(payload.codec(), common::Codec::kFp32);
  ASSERT_EQ(payload.pieces().size(), 2u);
  EXPECT_EQ(payload.pieces()[0].data(), bytes.data()) << "copied";
  EXPECT_EQ(payload.bytes(), bytes.size());
  CO2_EXPECT_OK(payload.valid());
}

TEST(ContributionPayloadTest, ReadsInt8PiecesInPlace) {
  std::vector<float> values(kLastChunk);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * (i % 50);
  const std::string bytes = Encoded(common::Codec::kInt8, values);
  // The first cut splits a block scale.
  const std::string_view pieces[] = {std::string_view(bytes).substr(0, 7),
                                     std::string_view(bytes).substr(7)};
  ContributionPayload payload;
  CO2_ASSERT_OK(payload.Read(View(common::Codec::kInt8, 1, pieces), kElements));
  ASSERT_EQ(payload.pieces().size(), 2u);
  EXPECT_EQ(payload.pieces()[1].data(), bytes.data() + 7) << "copied";
  EXPECT_EQ(payload.bytes(), bytes.size());
  CO2_EXPECT_OK(payload.valid());
}

TEST(ContributionPayloadTest, InvalidValuesAreReportedNotRefused) {
  std::vector<float> values(kLastChunk, 1.0f);
  values[17] = NAN;
  const std::string nan = Encoded(common::Codec::kFp32, values);
  const std::string_view piece = nan;
  ContributionPayload payload;
  CO2_ASSERT_OK(
      payload.Read(View(common::Codec::kFp32, 1, {&piece, 1}), kElements));
  EXPECT_EQ(payload.valid().code(), absl::StatusCode::kInvalidArgument);
  // Chunk 0 is a whole kChunkElements: these bytes are the wrong size.
  ContributionPayload short_payload;
  CO2_ASSERT_OK(short_payload.Read(View(common::Codec::kFp32, 0, {&piece, 1}),
                                   kElements));
  EXPECT_EQ(short_payload.valid().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::server
