#include "common/payload_pieces.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/kernel_isa.h"
#include "gtest/gtest.h"
#include "tests/byte_pieces.h"
#include "tests/status_matchers.h"

namespace co2::common {
namespace {

std::string Encoded(Codec codec, const std::vector<float>& values) {
  std::string bytes(EncodedSize(codec, values.size()), '\0');
  Encode(codec, values, absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

using testing::Cut;

bool Within(std::string_view part, std::string_view whole) {
  return part.data() >= whole.data() &&
         part.data() + part.size() <= whole.data() + whole.size();
}

class PayloadPiecesTest : public ::testing::TestWithParam<Codec> {};

// Every codec, every kernel variant: cut inside elements (fp32, bf16) or
// inside the scale region (int8), on element and int8 block boundaries, and
// with empty pieces, the runs cover the elements in order, read the payload
// where it lies (but for a split element), and give the bits of the payload
// in one piece.
TEST_P(PayloadPiecesTest, ReadsInPlaceWithTheBitsOfOnePiece) {
  const Codec codec = GetParam();
  std::vector<float> values(3000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * (i % 11) - 1;
  const std::string bytes = Encoded(codec, values);
  const size_t scale_end = Int8ValuesOffset(values.size());  // 12
  std::vector<size_t> cuts = {1, 3, 3, 7, scale_end, 100, 101};
  cuts.insert(cuts.end(), {scale_end + 1024, 2048, bytes.size() - 1});
  std::sort(cuts.begin(), cuts.end());
  const std::vector<std::string_view> pieces = Cut(bytes, cuts);
  // Element 2100 (1.5) overflows once added with weight 1e38 to 3e38.
  std::vector<float> big(values.size(), 1.0f);
  big[2100] = 3e38f;
  for (KernelIsa isa : SupportedKernelIsas()) {
    SCOPED_TRACE(KernelIsaName(isa));
    ScopedKernelIsaForTesting pin(isa);
    CO2_ASSERT_OK(ValidatePieces(codec, pieces, values.size()));
    size_t covered = 0, in_place = 0;
    std::optional<size_t> overflow;
    auto check_run = [&](const EncodedRun& run) {
      EXPECT_EQ(run.codec, codec);
      EXPECT_EQ(run.first, covered);
      covered += run.count;
      if (Within(run.bytes, bytes)) in_place += run.count;
      const std::optional<size_t> bad = FirstNonFiniteSum(
          run, 1e38f, absl::MakeConstSpan(big).subspan(run.first, run.count));
      if (bad && !overflow) overflow = run.first + *bad;
      return absl::OkStatus();
    };
    CO2_ASSERT_OK(ForEachPart(codec, pieces, values.size(), check_run));
    EXPECT_EQ(covered, values.size());
    // Only elements split between pieces are copied: one per cut at most,
    // none for int8 (one byte each).
    EXPECT_GE(in_place, values.size() - (codec == Codec::kInt8 ? 0 : 7));
    EXPECT_EQ(overflow, FirstNonFiniteSum(codec, bytes, 1e38f, big));
    EXPECT_EQ(overflow, std::optional<size_t>(2100));
    std::vector<float> want(values.size(), 1.0f), got(values.size(), 1.0f);
    AccumulateDecoded(codec, bytes, 0.5f, absl::MakeSpan(want));
    AccumulatePieces(codec, pieces, 0.5f, absl::MakeSpan(got));
    EXPECT_EQ(got, want);
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, PayloadPiecesTest,
                         ::testing::Values(Codec::kFp32, Codec::kBf16,
                                           Codec::kInt8));

TEST(PayloadPiecesTest, ValidateNamesTheBadElementByItsIndexInThePayload) {
  for (Codec codec : {Codec::kFp32, Codec::kBf16}) {
    std::vector<float> values(64, 1.0f);
    std::string bytes = Encoded(codec, values);
    const size_t width = EncodedSize(codec, 1);
    bytes[10 * width + width - 1] = '\x7f';  // element 10: sign/exponent bits
    bytes[10 * width + width - 2] = static_cast<char>(0xff);
    const absl::Status s =
        ValidatePieces(codec, Cut(bytes, {5 * width, 20 * width + 1}), 64);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("payload element 10 is not finite"),
              std::string::npos)
        << s.message();
  }
}

TEST(PayloadPiecesTest, ValidateChecksAnInt8ScaleSplitBetweenPieces) {
  std::vector<float> values(3000, 1.0f);
  std::string bytes = Encoded(Codec::kInt8, values);
  const float nan = NAN;
  std::memcpy(bytes.data() + 2 * sizeof(float), &nan, sizeof nan);  // block 2
  const absl::Status s =
      ValidatePieces(Codec::kInt8, Cut(bytes, {9, 500}), values.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int8 scale of block 2"), std::string::npos)
      << s.message();
}

TEST(PayloadPiecesTest, ValidateRejectsAWrongTotalSize) {
  const std::string bytes(4 * 10, '\0');
  const absl::Status s = ValidatePieces(Codec::kFp32, Cut(bytes, {6}), 11);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got 40"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace co2::common
