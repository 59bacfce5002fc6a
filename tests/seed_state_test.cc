#include "server/job/seed_state.h"

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

// Whether an accepted chunk was the last; fails the test on an error.
bool Last(const absl::StatusOr<bool>& accepted) {
  CO2_EXPECT_OK(accepted);
  return accepted.value_or(false);
}

TEST(SeedStateTest, TheFirstWorkerSeedsAZeroInOrder) {
  SeedState seed;
  EXPECT_TRUE(seed.OfferSeed("a"));
  EXPECT_FALSE(seed.OfferSeed("b"));
  EXPECT_EQ(seed.seeder(), "a");
  EXPECT_EQ(seed.Accept("b", 0, 0, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(seed.Accept("a", 0, 4, 3).status().message(),
            "a seed is the anchor of round 0, got anchor_round 4");
  EXPECT_EQ(seed.Accept("a", 1, 0, 3).status().message(),
            "seed chunk_index 1 out of order: expected 0");
  EXPECT_FALSE(Last(seed.Accept("a", 0, 0, 3)));
  EXPECT_FALSE(Last(seed.Accept("a", 1, 0, 3)));
  EXPECT_EQ(seed.Accept("a", 1, 0, 3).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a chunk counts once";
  EXPECT_TRUE(Last(seed.Accept("a", 2, 0, 3)));
}

TEST(SeedStateTest, ASeederThatRejoinsOrLeavesStartsOver) {
  SeedState seed;
  ASSERT_TRUE(seed.OfferSeed("a"));
  ASSERT_FALSE(Last(seed.Accept("a", 0, 0, 2)));
  EXPECT_TRUE(seed.OfferSeed("a"));
  EXPECT_EQ(seed.Accept("a", 1, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  seed.Forget("b");
  EXPECT_EQ(seed.seeder(), "a");
  seed.Forget("a");
  EXPECT_EQ(seed.seeder(), "");
  EXPECT_TRUE(seed.OfferSeed("b"));
}

TEST(SeedStateTest, ASeedStreamIsAllOrNothing) {
  SeedState seed;
  ASSERT_TRUE(seed.OfferSeed("a"));
  uint64_t broken = 0;
  ASSERT_FALSE(Last(seed.Accept("a", 0, 0, 2, &broken)));
  EXPECT_NE(broken, 0u);
  seed.Abandon(broken);
  uint64_t retry = 0;
  EXPECT_EQ(seed.Accept("a", 1, 0, 2, &retry).status().message(),
            "seed chunk_index 1 out of order: expected 0")
      << "nothing of the abandoned stream counts";
  ASSERT_FALSE(Last(seed.Accept("a", 0, 0, 2, &retry)));
  // A stream overtaken by a newer one of the same worker no longer counts,
  // and its end does not undo the newer one.
  uint64_t old = 0;
  ASSERT_FALSE(Last(seed.Accept("a", 0, 0, 2, &old)));
  EXPECT_EQ(seed.Accept("a", 1, 0, 2, &retry).status().code(),
            absl::StatusCode::kAborted);
  seed.Abandon(retry);
  EXPECT_TRUE(Last(seed.Accept("a", 1, 0, 2, &old)));
}

TEST(SeedStateTest, AResumingWorkerReseedsAtOneRound) {
  SeedState seed;
  ASSERT_TRUE(seed.OfferSeed("fresh"));
  EXPECT_FALSE(seed.ReseedingByOther("w")) << "a fresh seed is replaced";
  seed.StartReseed("w");
  EXPECT_TRUE(seed.reseeding());
  EXPECT_EQ(seed.seeder(), "w");
  EXPECT_TRUE(seed.ReseedingByOther("v"));
  EXPECT_FALSE(seed.ReseedingByOther("w"));
  EXPECT_FALSE(seed.OfferSeed("fresh"));
  EXPECT_EQ(seed.Accept("fresh", 0, 0, 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Last(seed.Accept("w", 0, 6, 2)));
  EXPECT_EQ(seed.reseed_anchor_round(), 6u);
  EXPECT_EQ(seed.Accept("w", 1, 7, 2).status().message(),
            "re-seed chunk 1 has anchor_round 7, chunk 0 had 6");
  EXPECT_TRUE(Last(seed.Accept("w", 1, 6, 2)));
  seed.FinishReseed();
  EXPECT_FALSE(seed.reseeding());
  EXPECT_FALSE(seed.ReseedingByOther("v"));
}

}  // namespace
}  // namespace co2::server
