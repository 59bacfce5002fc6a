// RoundState with the outlier rule (RoundOptions::outlier_ratio, k): which
// contributions are held out of a chunk's mean, and that the others' mean is
// exactly what it would be without them.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job/round_state.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

using ::testing::HasSubstr;

// A shard of 16 elements: one chunk, and norms that are exact in double
// (a constant v gives ||Δ|| = 4·|v|).
constexpr size_t kElements = 16;

class RoundOutliersTest : public ::testing::Test {
 protected:
  void Init(double k, bool exact_sums = false) {
    RoundOptions options;
    options.shard_elements = kElements;
    options.outlier_ratio = k;
    options.exact_sums = exact_sums;
    state_ = std::make_unique<RoundState>(options, &clock_);
  }
  void Join(int workers) {
    for (int i = 0; i < workers; ++i) state_->AddWorker(Name(i), 0);
  }
  static std::string Name(int i) { return absl::StrCat("w", i); }
  // Worker `i` sends round `round` with every element `value`.
  void Send(int i, uint64_t round, float value, double weight = 1) {
    const std::vector<float> v(kElements, value);
    std::string bytes(kElements * sizeof(float), '\0');
    common::Encode(common::Codec::kFp32, v,
                   absl::MakeSpan(bytes.data(), bytes.size()));
    const auto added = state_->AddChunk(Name(i), round, 0,
                                        common::Codec::kFp32, bytes, weight);
    CO2_ASSERT_OK(added);
  }
  // Closes the round; every element of its mean must be `expected` (within
  // `tolerance`: 0 is exactly).
  ClosedRound CloseWithMean(float expected, float tolerance = 0) {
    std::optional<ClosedRound> closed = state_->TryClose();
    EXPECT_TRUE(closed.has_value());
    if (!closed.has_value()) return {};
    if (tolerance == 0) {
      EXPECT_EQ(closed->mean[0], std::vector<float>(kElements, expected));
    } else {
      for (const float m : closed->mean[0]) EXPECT_NEAR(m, expected, tolerance);
    }
    return *std::move(closed);
  }

  common::FakeClock clock_;
  std::unique_ptr<RoundState> state_;
};

TEST_F(RoundOutliersTest, FewerThanThreeContributionsHoldNothingOut) {
  // With two, the larger norm is under 2 × their median: a k below 2 is
  // what would hold it out.
  Init(1.5);
  Join(2);
  Send(0, 0, 1.0f);
  Send(1, 0, 1e6f);
  const ClosedRound closed = CloseWithMean((1.0f + 1e6f) / 2);
  EXPECT_TRUE(closed.held_out.empty());
  EXPECT_EQ(closed.contributors, 2u);
}

// Parameters: exact sums; where the outlier arrives (0: first, 3: last);
// the round (1: the estimate at arrival is the last round's median).
class HeldOutTest
    : public RoundOutliersTest,
      public ::testing::WithParamInterface<std::tuple<bool, int, int>> {};

TEST_P(HeldOutTest, AnOutlierIsHeldOutAndTheOthersMeanIsExact) {
  const auto [exact, position, rounds] = GetParam();
  Init(10, exact);
  Join(4);
  for (int r = 0; r <= rounds; ++r) {
    const std::vector<float> values = {1.0f, 2.0f, 3.0f};
    int next = 0;
    for (int i = 0; i < 4; ++i) {
      if (i == position) {
        Send(i, r, -1e6f);
      } else {
        Send(i, r, values[next++]);
      }
    }
    const ClosedRound closed = CloseWithMean(2.0f);
    ASSERT_EQ(closed.held_out.size(), 1u) << "round " << r;
    const HeldOut& out = closed.held_out[0];
    EXPECT_EQ(out.worker, Name(position));
    EXPECT_EQ(out.chunk_index, 0u);
    EXPECT_NEAR(out.norm, 4e6, 1);  // squares summed in float
    EXPECT_EQ(out.median, 4 * 2.5);  // norms 4, 8, 12, 4e6
    EXPECT_THAT(out.reason, HasSubstr("x the chunk's median 10 "));
    EXPECT_EQ(closed.contributors, 4u) << "every contribution was complete";
  }
}

INSTANTIATE_TEST_SUITE_P(SumsOrdersRounds, HeldOutTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(0, 3),
                                            ::testing::Values(0, 1)));

TEST_F(RoundOutliersTest, ExactlyAtTheThresholdIsAveragedIn) {
  Init(10);
  Join(4);
  // Norms 4, 4, 4 and 40: 40 = 10 × the median 4, not more.
  Send(0, 0, 1.0f);
  Send(1, 0, 1.0f);
  Send(2, 0, 10.0f);
  Send(3, 0, 1.0f);
  ClosedRound closed = CloseWithMean(13.0f / 4);
  EXPECT_TRUE(closed.held_out.empty());
  // Just above it is held out.
  Send(0, 1, 1.0f);
  Send(1, 1, 1.0f);
  Send(2, 1, 10.001f);
  Send(3, 1, 1.0f);
  closed = CloseWithMean(1.0f);
  ASSERT_EQ(closed.held_out.size(), 1u);
  EXPECT_EQ(closed.held_out[0].worker, "w2");
}

TEST_F(RoundOutliersTest, NormsAreWeighedAsTheMeanWeighsThem) {
  Init(10);
  Join(4);
  // Weighted norms 4, 4, 4 and 4·50·0.1 = 20: in; the mean weighs it 0.1.
  Send(0, 0, 1.0f);
  Send(1, 0, 1.0f);
  Send(2, 0, 50.0f, 0.1);
  Send(3, 0, 1.0f);
  ClosedRound closed = CloseWithMean((3.0f + 5.0f) / 3.1f, 1e-6f);
  EXPECT_TRUE(closed.held_out.empty());
  // Values within 10 × the others', but weight 100: 4·2·100 = 800 > 40.
  Send(0, 1, 1.0f);
  Send(1, 1, 1.0f);
  Send(2, 1, 2.0f, 100);
  Send(3, 1, 1.0f);
  closed = CloseWithMean(1.0f);
  ASSERT_EQ(closed.held_out.size(), 1u);
  EXPECT_EQ(closed.held_out[0].worker, "w2");
  EXPECT_EQ(closed.held_out[0].norm, 800);
}

TEST_F(RoundOutliersTest, ZeroTurnsTheRuleOff) {
  Init(0);
  Join(4);
  for (int i = 0; i < 3; ++i) Send(i, 0, 1.0f);
  Send(3, 0, 1e6f);
  const ClosedRound closed = CloseWithMean((3.0f + 1e6f) / 4);
  EXPECT_TRUE(closed.held_out.empty());
}

TEST_F(RoundOutliersTest, AChunkTakenAheadCountsOnlyItsContributorsInTheMean) {
  Init(10);
  Join(4);
  for (int i = 0; i < 3; ++i) Send(i, 0, 2.0f);
  Send(3, 0, 1e6f);
  std::vector<CompleteChunk> taken = state_->TakeCompleteChunks();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].contributors, 3u);
  EXPECT_EQ(taken[0].mean, std::vector<float>(kElements, 2.0f));
  ASSERT_EQ(taken[0].held_out.size(), 1u);
  EXPECT_EQ(taken[0].held_out[0].worker, "w3");
}

}  // namespace
}  // namespace co2::server
