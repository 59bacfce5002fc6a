#include "server/job/shard_members.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

const absl::Time kStart = absl::UnixEpoch();
constexpr absl::Duration kLease = absl::Seconds(10);

TEST(ShardMembersTest, AddsUpToMaxWorkers) {
  ShardMembers members("job", 2, kLease, 3);
  bool added = false;
  CO2_ASSERT_OK(members.Add("a", &added));
  EXPECT_TRUE(added);
  added = false;
  auto again = members.Add("a", &added);
  CO2_ASSERT_OK(again);
  EXPECT_FALSE(added) << "a is already live";
  EXPECT_EQ(*again, members.Find("a"));
  CO2_ASSERT_OK(members.Add("b", &added));
  auto full = members.Add("c", &added);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.status().message(),
            "job \"job\" already has 2 workers (limit 2)");
  EXPECT_EQ(members.size(), 2u);
}

TEST(ShardMembersTest, LeasesExpireAndLeaveGoes) {
  ShardMembers members("job", 8, kLease, 3);
  bool added = false;
  for (const char* w : {"a", "b", "c"}) {
    members.Renew(**members.Add(w, &added), kStart);
  }
  members.Renew(*members.Find("b"), kStart + absl::Seconds(5));
  EXPECT_EQ(members.NextExpiry(), kStart + kLease);
  EXPECT_TRUE(members.Remove("c"));
  EXPECT_FALSE(members.Remove("c"));
  EXPECT_EQ(members.ExpireLeases(kStart + kLease - absl::Nanoseconds(1)),
            std::vector<std::string>{});
  EXPECT_EQ(members.ExpireLeases(kStart + kLease),
            std::vector<std::string>{"a"});
  EXPECT_EQ(members.Find("a"), nullptr);
  EXPECT_EQ(members.NextExpiry(), kStart + absl::Seconds(15));
  EXPECT_EQ(members.ExpireLeases(kStart + absl::Seconds(15)),
            std::vector<std::string>{"b"});
  EXPECT_EQ(members.NextExpiry(), absl::InfiniteFuture());
  EXPECT_EQ(members.NotMember("a").code(), absl::StatusCode::kNotFound);
}

TEST(ShardMembersTest, EvictsAfterMaxRejectedChunksInARow) {
  ShardMembers members("job", 8, kLease, 3);
  bool added = false;
  ShardMember* a = *members.Add("a", &added);
  const absl::Status invalid =
      absl::InvalidArgumentError("round 0 chunk 0: NaN");
  bool evicted = false;
  EXPECT_EQ(members.Reject("a", *a, invalid, &evicted), invalid);
  EXPECT_EQ(members.Reject("a", *a, invalid, &evicted), invalid);
  EXPECT_FALSE(evicted);
  a->consecutive_rejects = 0;  // a valid chunk came in between
  EXPECT_EQ(members.Reject("a", *a, invalid, &evicted), invalid);
  EXPECT_EQ(members.Reject("a", *a, invalid, &evicted), invalid);
  EXPECT_FALSE(evicted);
  const absl::Status third = members.Reject("a", *a, invalid, &evicted);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(third.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(third.message(),
            "round 0 chunk 0: NaN; worker \"a\" is evicted after 3 invalid "
            "chunks in a row");
  EXPECT_EQ(members.Find("a"), nullptr);
  EXPECT_TRUE(members.IsEvicted("a"));
  const absl::Status why = members.NotMember("a");
  EXPECT_EQ(why.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why.message(),
            "worker \"a\" was evicted from job \"job\": 3 invalid "
            "contribution chunks in a row (last: round 0 chunk 0: NaN); it "
            "cannot rejoin under this id");
  EXPECT_EQ(members.NotMember("z").message(),
            "worker \"z\" is not a live member of this job (join first)");
}

TEST(ShardMembersTest, ZeroMaxRejectedChunksNeverEvicts) {
  ShardMembers members("job", 8, kLease, 0);
  bool added = false;
  ShardMember* a = *members.Add("a", &added);
  bool evicted = false;
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(
        members.Reject("a", *a, absl::InvalidArgumentError("bad"), &evicted)
            .ok());
  }
  EXPECT_FALSE(evicted);
  EXPECT_EQ(a->consecutive_rejects, 10u);
  EXPECT_NE(members.Find("a"), nullptr);
}

TEST(ShardMembersTest, RemembersAtMostMaxWorkersEvictions) {
  ShardMembers members("job", 2, kLease, 1);
  bool added = false, evicted = false;
  for (const char* w : {"a", "b", "c"}) {
    ShardMember* m = *members.Add(w, &added);
    EXPECT_FALSE(
        members.Reject(w, *m, absl::InvalidArgumentError("bad"), &evicted)
            .ok());
  }
  int remembered = 0;
  for (const char* w : {"a", "b", "c"}) remembered += members.IsEvicted(w);
  EXPECT_EQ(remembered, 2);
  EXPECT_TRUE(members.IsEvicted("c")) << "the latest is kept";
}

TEST(ShardMembersTest, RestoreReplacesTheEntry) {
  ShardMembers members("job", 8, kLease, 3);
  members.Restore("a", common::Codec::kInt8, kStart);
  members.Restore("a", common::Codec::kBf16, kStart + kLease);
  ASSERT_NE(members.Find("a"), nullptr);
  EXPECT_EQ(members.Find("a")->uplink, common::Codec::kBf16);
  EXPECT_EQ(members.NextExpiry(), kStart + kLease);
  EXPECT_EQ(members.live().size(), 1u);
}

}  // namespace
}  // namespace co2::server
