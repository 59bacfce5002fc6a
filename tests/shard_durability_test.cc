#include "server/job/shard_durability.h"

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);
const absl::Duration kRetry = absl::Seconds(1);

TEST(ShardDurabilityTest, WithoutCheckpointsEverythingIsDurableAtOnce) {
  ShardDurability durability(false, kRetry);
  durability.MarkDirty();
  EXPECT_FALSE(durability.Due(true, true, kNow));
  EXPECT_TRUE(durability.Clean(true));
  EXPECT_TRUE(durability.MayStream(0));
  std::optional<ShardDurability::Waiter> now =
      durability.Wait([](absl::Status) {});
  EXPECT_TRUE(now.has_value()) << "handed back to be told OK at once";
  EXPECT_TRUE(durability.Abandon().empty());
}

TEST(ShardDurabilityTest, ACheckpointIsDueForAnUpdateOrAChangeToAWholeAnchor) {
  ShardDurability durability(true, kRetry);
  EXPECT_FALSE(durability.Due(false, true, kNow));
  EXPECT_TRUE(durability.Due(true, false, kNow)) << "an update waits";
  durability.MarkDirty();
  EXPECT_FALSE(durability.Due(false, false, kNow))
      << "a changed state waits for the anchor to be whole";
  EXPECT_TRUE(durability.Due(false, true, kNow));
  EXPECT_FALSE(durability.Clean(false));
  durability.BeginWrite();
  EXPECT_FALSE(durability.Due(false, true, kNow));
  EXPECT_TRUE(durability.Clean(false));
  EXPECT_FALSE(durability.Clean(true));
  // A change while the write runs makes the state due again.
  durability.MarkDirty();
  durability.Written();
  EXPECT_TRUE(durability.Due(false, true, kNow));
}

TEST(ShardDurabilityTest, AFailedWriteIsRetriedAfterTheRetryTime) {
  ShardDurability durability(true, kRetry);
  durability.BeginWrite();
  durability.WriteFailed(kNow);
  EXPECT_FALSE(durability.Clean(false)) << "still due";
  EXPECT_FALSE(durability.Due(true, true, kNow + kRetry / 2));
  EXPECT_EQ(durability.RetryAt(true), kNow + kRetry);
  EXPECT_EQ(durability.RetryAt(false), absl::InfiniteFuture());
  EXPECT_TRUE(durability.Due(true, true, kNow + kRetry));
  EXPECT_TRUE(durability.Due(false, true, kNow + kRetry));
}

TEST(ShardDurabilityTest, WaitersAreHandedBackOnceWrittenOrAbandoned) {
  ShardDurability durability(true, kRetry);
  std::vector<int> told;
  EXPECT_FALSE(durability.Wait([&](absl::Status) { told.push_back(1); }));
  EXPECT_TRUE(durability.Due(false, true, kNow)) << "a waiter makes it due";
  durability.BeginWrite();
  durability.WriteFailed(kNow);
  std::vector<ShardDurability::Waiter> written = durability.Written();
  ASSERT_EQ(written.size(), 1u) << "kept through the failed write";
  written[0](absl::OkStatus());
  EXPECT_EQ(told, std::vector<int>{1});
  EXPECT_TRUE(durability.Written().empty());
  EXPECT_FALSE(durability.Wait([&](absl::Status) { told.push_back(2); }));
  std::vector<ShardDurability::Waiter> abandoned = durability.Abandon();
  ASSERT_EQ(abandoned.size(), 1u);
  EXPECT_TRUE(durability.Abandon().empty());
}

TEST(ShardDurabilityTest, ChunksStreamOnlyOnADurableAnchorAndAWorkingJournal) {
  ShardDurability durability(true, kRetry);
  EXPECT_FALSE(durability.MayStream(0)) << "nothing durable yet";
  durability.Written();
  EXPECT_TRUE(durability.MayStream(0));
  durability.JournalFailed(3);
  EXPECT_FALSE(durability.MayStream(3));
  EXPECT_TRUE(durability.MayStream(4)) << "the next round streams again";
  durability.AnchorReplaced();
  EXPECT_FALSE(durability.MayStream(4)) << "a re-seeded anchor is not durable";
  EXPECT_TRUE(durability.Due(false, true, kNow));
  durability.AnchorRestored();
  EXPECT_TRUE(durability.MayStream(4));
}

}  // namespace
}  // namespace co2::server
