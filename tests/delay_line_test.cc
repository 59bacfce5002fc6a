#include "bench/linkem/delay_line.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::bench {
namespace {

constexpr int64_t kMs = 1000000;

TEST(DelayLineTest, HoldsEachPacketForTheDelayAndReleasesInOrder) {
  auto line = DelayLine::Create({25 * kMs, 0.0, 1});
  CO2_ASSERT_OK(line);
  EXPECT_TRUE(line->Arrive(7, 0));
  EXPECT_TRUE(line->Arrive(8, 10 * kMs));
  EXPECT_EQ(line->NextDue(), 25 * kMs);
  EXPECT_EQ(line->ReleaseDue(25 * kMs - 1), std::nullopt);
  EXPECT_EQ(line->ReleaseDue(25 * kMs), 7u);
  EXPECT_EQ(line->NextDue(), 35 * kMs);
  EXPECT_TRUE(line->Arrive(9, 30 * kMs));
  // Both due by 60 ms: one release names the last of them.
  EXPECT_EQ(line->ReleaseDue(60 * kMs), 9u);
  EXPECT_EQ(line->held(), 0u);
  EXPECT_EQ(line->NextDue(), std::nullopt);
  EXPECT_EQ(line->stats().released, 3u);
  EXPECT_EQ(line->stats().max_held, 2u);
}

TEST(DelayLineTest, DropsTheLossShareAndHoldsTheRest) {
  auto line = DelayLine::Create({kMs, 0.01, 3});
  CO2_ASSERT_OK(line);
  constexpr int kPackets = 200000;
  int held = 0;
  for (int i = 0; i < kPackets; ++i) held += line->Arrive(i, i);
  const uint64_t dropped = line->stats().dropped;
  EXPECT_EQ(dropped + held, static_cast<uint64_t>(kPackets));
  // Binomial(200000, 0.01): mean 2000, standard deviation 44.5.
  EXPECT_NEAR(static_cast<double>(dropped), 2000.0, 5 * 44.5);
  EXPECT_EQ(line->held(), static_cast<size_t>(held));
}

TEST(DelayLineTest, TheSameSeedDropsTheSamePackets) {
  auto a = DelayLine::Create({0, 0.3, 11});
  auto b = DelayLine::Create({0, 0.3, 11});
  CO2_ASSERT_OK(a);
  CO2_ASSERT_OK(b);
  for (uint32_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(a->Arrive(i, 0), b->Arrive(i, 0)) << "packet " << i;
  }
}

TEST(DelayLineTest, NoLossDropsNothing) {
  auto line = DelayLine::Create({0, 0.0, 1});
  CO2_ASSERT_OK(line);
  for (uint32_t i = 0; i < 10000; ++i) ASSERT_TRUE(line->Arrive(i, 0));
  EXPECT_EQ(line->ReleaseDue(0), 9999u);
}

TEST(DelayLineTest, RefusesANegativeDelayOrALossOutsideItsRange) {
  auto negative = DelayLine::Create({-1, 0.0, 1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), ::testing::HasSubstr("-1 ns"));
  for (double loss : {-0.1, 1.0, 2.0}) {
    auto line = DelayLine::Create({0, loss, 1});
    EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument)
        << "loss " << loss;
    EXPECT_THAT(line.status().message(), ::testing::HasSubstr("loss is"));
  }
}

}  // namespace
}  // namespace co2::bench
