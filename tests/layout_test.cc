#include "common/layout.h"

#include <tuple>

#include "gmock/gmock.h"

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::common {
namespace {

class ShardRangeTest
    : public ::testing::TestWithParam<std::tuple<size_t, size_t>> {};

TEST_P(ShardRangeTest, CoversEverythingOnceBlockAligned) {
  const auto [parameters, shards] = GetParam();
  size_t expected_begin = 0;
  size_t smallest = parameters, largest = 0;
  for (size_t i = 0; i < shards; ++i) {
    absl::StatusOr<Range> r = ShardRangeFor(parameters, shards, i);
    CO2_ASSERT_OK(r);
    EXPECT_EQ(r->begin, expected_begin) << "shard " << i;
    EXPECT_GE(r->end, r->begin);
    EXPECT_EQ(r->begin % kBlockElements, 0u) << "shard " << i;
    if (i + 1 < shards) {
      EXPECT_EQ(r->end % kBlockElements, 0u) << "shard " << i;
    }
    expected_begin = r->end;
    if (i + 1 < shards) {
      smallest = std::min(smallest, r->size() / kBlockElements);
      largest = std::max(largest, r->size() / kBlockElements);
    }
  }
  EXPECT_EQ(expected_begin, parameters);
  if (shards > 2) {
    EXPECT_LE(largest - smallest, 1u);  // balanced in blocks
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ShardRangeTest,
    ::testing::Combine(::testing::Values(1, 65535, 65536, 65537, 1000000,
                                         3 * 65536 + 5, 10 * 65536),
                       ::testing::Values(1, 2, 3, 7)));

TEST(ShardRangeTest, TwoShardsOfAMillion) {
  // 1,000,000 = 15 blocks + 16,960: shard 0 gets 8 blocks, shard 1 the rest.
  EXPECT_EQ(*ShardRangeFor(1000000, 2, 0), (Range{0, 8 * 65536}));
  EXPECT_EQ(*ShardRangeFor(1000000, 2, 1), (Range{8 * 65536, 1000000}));
}

TEST(ShardRangeTest, RejectsBadShardArguments) {
  EXPECT_EQ(ShardRangeFor(10, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = ShardRangeFor(10, 2, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shard index 2"), std::string::npos) << s;
}

TEST(ChunkTest, ChunksTileTheShard) {
  const size_t n = 2 * kChunkElements + 5;
  ASSERT_EQ(NumChunks(n), 3u);
  EXPECT_EQ(NumChunks(0), 0u);
  EXPECT_EQ(NumChunks(kChunkElements), 1u);
  EXPECT_EQ(ChunkRange(n, 0), (Range{0, kChunkElements}));
  EXPECT_EQ(ChunkRange(n, 2), (Range{2 * kChunkElements, n}));
}

// A node's ranks split its exchange by whole shards: their ranges tile
// [0, P) in rank order, each the union of its own shards' ranges, also at
// P = 10^11 and with S not a multiple of L.
class RankRangeTest : public ::testing::TestWithParam<
                          std::tuple<size_t, std::tuple<size_t, size_t>>> {};

TEST_P(RankRangeTest, RanksTileTheParametersByWholeShards) {
  const size_t p = std::get<0>(GetParam());
  const auto [shards, ranks] = std::get<1>(GetParam());
  size_t next_shard = 0;
  size_t next_element = 0;
  for (size_t k = 0; k < ranks; ++k) {
    SCOPED_TRACE(::testing::Message() << "P " << p << ", S " << shards << ", L "
                                    << ranks << ", rank " << k);
    const absl::StatusOr<Range> owned = OwnedShards(shards, ranks, k);
    CO2_ASSERT_OK(owned);
    EXPECT_EQ(owned->begin, next_shard);
    EXPECT_GE(owned->size(), shards / ranks);
    EXPECT_LE(owned->size(), shards / ranks + 1);
    next_shard = owned->end;
    const absl::StatusOr<Range> range = RankRange(p, shards, ranks, k);
    CO2_ASSERT_OK(range);
    EXPECT_EQ(range->begin, next_element);
    EXPECT_EQ(range->begin % kChunkElements, 0u);
    EXPECT_EQ(range->begin, ShardRangeFor(p, shards, owned->begin)->begin);
    EXPECT_EQ(range->end, ShardRangeFor(p, shards, owned->end - 1)->end);
    next_element = range->end;
  }
  EXPECT_EQ(next_shard, shards);
  EXPECT_EQ(next_element, p);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, RankRangeTest,
    ::testing::Combine(
        ::testing::Values(size_t{1}, size_t{65536}, size_t{1000003},
                        size_t{6} * 65536 * 7 + 4 * 65536 + 5,
                        size_t{100000000000}),
        ::testing::Values(std::make_tuple(size_t{2}, size_t{2}),
                        std::make_tuple(size_t{4}, size_t{2}),
                        std::make_tuple(size_t{8}, size_t{4}),
                        std::make_tuple(size_t{6}, size_t{2}),
                        std::make_tuple(size_t{3}, size_t{2}),
                        std::make_tuple(size_t{5}, size_t{1}))));

TEST(RankRangeTest, EqualSharesWhenShardsAreAMultipleOfRanks) {
  EXPECT_EQ(*OwnedShards(8, 4, 0), (Range{0, 2}));
  EXPECT_EQ(*OwnedShards(8, 4, 3), (Range{6, 8}));
  EXPECT_EQ(*OwnedShards(3, 2, 0), (Range{0, 2}));
  EXPECT_EQ(*OwnedShards(3, 2, 1), (Range{2, 3}));
  // 4 shards of 16 blocks: rank 1 of 2 exchanges blocks 8 .. 16.
  EXPECT_EQ(*RankRange(16 * kBlockElements, 4, 2, 1),
            (Range{8 * kBlockElements, 16 * kBlockElements}));
}

TEST(RankRangeTest, RefusesFewerShardsThanRanksByName) {
  const absl::StatusOr<Range> few = OwnedShards(2, 4, 0);
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(few.status().message(),
              ::testing::HasSubstr("a node of 4 local ranks cannot split 2 "
                                 "shards among them"));
  EXPECT_EQ(RankRange(1 << 20, 2, 4, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OwnedShards(4, 0, 0).status().message(),
              ::testing::HasSubstr("local_ranks must be at least 1"));
  EXPECT_THAT(OwnedShards(4, 2, 2).status().message(),
              ::testing::HasSubstr("local rank 2 out of range for 2"));
}

}  // namespace
}  // namespace co2::common
