#include "common/payload_pieces.h"

#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "tests/byte_pieces.h"

namespace co2::common {
namespace {

std::string Encoded(Codec codec, const std::vector<float>& values) {
  std::string bytes(EncodedSize(codec, values.size()), '\0');
  Encode(codec, values, absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

using testing::Cut;

class PayloadPiecesTest : public ::testing::TestWithParam<Codec> {};

TEST_P(PayloadPiecesTest, AccumulatesLikeOnePieceWherePiecesSplitElements) {
  const Codec codec = GetParam();
  std::vector<float> values(3000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * (i % 11) - 1;
  const std::string bytes = Encoded(codec, values);
  std::vector<float> want(values.size(), 1.0f), got(values.size(), 1.0f);
  AccumulateDecoded(codec, bytes, 0.5f, absl::MakeSpan(want));
  // Cuts inside elements, on element boundaries, and empty pieces.
  const std::vector<std::string_view> pieces =
      Cut(bytes, {1, 3, 3, 7, 100, 101, 2048, bytes.size() - 1});
  ASSERT_TRUE(ValidatePieces(codec, pieces, values.size()).ok());
  size_t covered = 0;
  ASSERT_TRUE(
      ForEachPart(codec, pieces, values.size(),
                  [&](std::string_view part, size_t first, size_t count) {
                    EXPECT_EQ(first, covered);
                    EXPECT_EQ(part.size(), EncodedSize(codec, count));
                    covered += count;
                    return absl::OkStatus();
                  })
          .ok());
  AccumulatePieces(codec, pieces, 0.5f, absl::MakeSpan(got));
  EXPECT_EQ(covered, values.size());
  EXPECT_EQ(got, want);
}

TEST_P(PayloadPiecesTest, ValidateNamesTheElementsOfABadPart) {
  const Codec codec = GetParam();
  std::vector<float> values(64, 1.0f);
  std::string bytes = Encoded(codec, values);
  const size_t width = EncodedSize(codec, 1);
  bytes[10 * width + width - 1] = '\x7f';  // element 10: sign/exponent bits
  bytes[10 * width + width - 2] = static_cast<char>(0xff);
  const absl::Status s =
      ValidatePieces(codec, Cut(bytes, {5 * width, 20 * width + 1}), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("elements [5, 20)"), std::string::npos)
      << s.message();
}

INSTANTIATE_TEST_SUITE_P(WordCodecs, PayloadPiecesTest,
                         ::testing::Values(Codec::kFp32, Codec::kBf16));

TEST(PayloadPiecesTest, ValidateRejectsAWrongTotalSize) {
  const std::string bytes(4 * 10, '\0');
  const absl::Status s = ValidatePieces(Codec::kFp32, Cut(bytes, {6}), 11);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got 40"), std::string::npos) << s.message();
}

TEST(PayloadPiecesTest, OnlyInt8InSeveralPiecesNeedsGathering) {
  const std::string bytes = "abcdefgh";
  const std::vector<std::string_view> one = Cut(bytes, {});
  const std::vector<std::string_view> two = Cut(bytes, {4});
  EXPECT_TRUE(NeedsGather(Codec::kInt8, two));
  EXPECT_FALSE(NeedsGather(Codec::kInt8, one));
  EXPECT_FALSE(NeedsGather(Codec::kFp32, two));
  EXPECT_FALSE(NeedsGather(Codec::kBf16, two));
}

TEST(PayloadPiecesTest, GatherConcatenates) {
  const std::string bytes = "scales+values";
  EXPECT_EQ(Gather(Cut(bytes, {2, 6, 6})), bytes);
}

}  // namespace
}  // namespace co2::common
