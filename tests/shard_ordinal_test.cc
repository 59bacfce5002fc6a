#include "server/service/shard_ordinal.h"

#include "gtest/gtest.h"

namespace co2::server {
namespace {

TEST(ShardOrdinalTest, TakesTheStatefulSetOrdinal) {
  EXPECT_EQ(*OrdinalFromHostname("co2-aggregator-0"), 0);
  EXPECT_EQ(*OrdinalFromHostname("co2-aggregator-12"), 12);
  EXPECT_EQ(*OrdinalFromHostname("co2-aggregator-3.co2-aggregator.ml.svc"), 3);
}

TEST(ShardOrdinalTest, RefusesAHostnameWithoutOrdinal) {
  for (const char* bad : {"aggregator", "aggregator-", "aggregator-x1", "",
                          "a-1234567890", "-"}) {
    auto ordinal = OrdinalFromHostname(bad);
    ASSERT_FALSE(ordinal.ok()) << bad;
    EXPECT_EQ(ordinal.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ordinal.status().message().find(bad), absl::string_view::npos);
  }
}

TEST(ShardOrdinalTest, TheFlagWinsUnlessAskedForTheHostname) {
  EXPECT_EQ(*ResolveShardIndex(5, false), 5);
}

}  // namespace
}  // namespace co2::server
