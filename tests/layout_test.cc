#include "common/layout.h"

#include <tuple>

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
    if (i + 1 < shards) EXPECT_EQ(r->end % kBlockElements, 0u) << "shard " << i;
    expected_begin = r->end;
    if (i + 1 < shards) {
      smallest = std::min(smallest, r->size() / kBlockElements);
      largest = std::max(largest, r->size() / kBlockElements);
    }
  }
  EXPECT_EQ(expected_begin, parameters);
  if (shards > 2) EXPECT_LE(largest - smallest, 1u);  // balanced in blocks
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

}  // namespace
}  // namespace co2::common
