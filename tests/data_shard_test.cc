#include "client/training/data_shard.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::ElementsAre;

TEST(DataShardTest, ContiguousPartsAreBalancedAndTile) {
  // 10 over 4: sizes 3,3,2,2.
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int w = 0; w < 4; ++w) {
    auto part = ContiguousPart(10, w, 4);
    CO2_ASSERT_OK(part);
    EXPECT_EQ(part->begin, next);
    next = part->end;
    sizes.push_back(part->size());
  }
  EXPECT_EQ(next, 10);
  EXPECT_THAT(sizes, ElementsAre(3, 3, 2, 2));
}

TEST(DataShardTest, RejectsBadWorkerArguments) {
  EXPECT_EQ(ContiguousPart(10, 4, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContiguousPart(10, -1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContiguousPart(10, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContiguousPart(-1, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardIndices(3, 0, 4, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class ShardIndicesTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardIndicesTest, DisjointCompleteAndShuffled) {
  const int num_workers = GetParam();
  constexpr int64_t kN = 1001;
  std::vector<int64_t> all;
  for (int w = 0; w < num_workers; ++w) {
    auto shard = ShardIndices(kN, w, num_workers, /*seed=*/42);
    CO2_ASSERT_OK(shard);
    EXPECT_NEAR(static_cast<double>(shard->size()),
                static_cast<double>(kN) / num_workers, 1.0);
    all.insert(all.end(), shard->begin(), shard->end());
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(kN));
  // Before sorting: a shuffled order is not the identity.
  std::vector<int64_t> identity(kN);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(all, identity);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, identity);  // no overlap, nothing missing
}

INSTANTIATE_TEST_SUITE_P(Workers, ShardIndicesTest,
                         ::testing::Values(1, 2, 3, 7, 16));

TEST(DataShardTest, SameSeedSameShardOtherSeedOther) {
  auto a = ShardIndices(500, 1, 3, 7);
  auto b = ShardIndices(500, 1, 3, 7);
  auto c = ShardIndices(500, 1, 3, 8);
  CO2_ASSERT_OK(a);
  CO2_ASSERT_OK(b);
  CO2_ASSERT_OK(c);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(DataShardTest, ShuffleIsAPermutationAndFixedAcrossRuns) {
  std::vector<int64_t> v(8);
  std::iota(v.begin(), v.end(), int64_t{0});
  DeterministicShuffle(absl::MakeSpan(v), 123);
  std::vector<int64_t> again(8);
  std::iota(again.begin(), again.end(), int64_t{0});
  DeterministicShuffle(absl::MakeSpan(again), 123);
  EXPECT_EQ(v, again);
  EXPECT_EQ(std::set<int64_t>(v.begin(), v.end()).size(), 8u);
}

TEST(DataShardTest, UniformBelowStaysInRangeAndCoversIt) {
  std::mt19937_64 rng(5);
  std::vector<int> histogram(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const uint64_t x = UniformBelow(rng, 7);
    ASSERT_LT(x, 7u);
    ++histogram[x];
  }
  for (int count : histogram) EXPECT_NEAR(count, 1000, 150);
}

TEST(DataShardTest, MixSeedSeparatesStreams) {
  EXPECT_NE(MixSeed(1, 0), MixSeed(1, 1));
  EXPECT_NE(MixSeed(1, 0), MixSeed(2, 0));
  EXPECT_EQ(MixSeed(3, 4), MixSeed(3, 4));
}

}  // namespace
}  // namespace co2::client
