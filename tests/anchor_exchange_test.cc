#include "client/anchor_exchange.h"

#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "server/job/round_state.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

// The heal reasons are read from the shards' own refusals: a stale round and
// a worker that is no longer a member come from RoundState itself.
TEST(HealReasonTest, NamesTheShardsRefusalsThatFetchingTheAnchorMends) {
  common::FakeClock clock;
  server::RoundOptions options;
  options.shard_elements = 4;
  server::RoundState state(options, &clock);
  state.AddWorker("a", 0);
  const std::string zeros(16, '\0');
  CO2_ASSERT_OK(state.AddChunk("a", 0, 0, common::Codec::kFp32, zeros, 1));
  ASSERT_TRUE(state.TryClose().has_value());
  CO2_ASSERT_OK(state.AddChunk("a", 1, 0, common::Codec::kFp32, zeros, 1));
  ASSERT_TRUE(state.TryClose().has_value());
  const absl::Status stale =
      state.AddChunk("a", 0, 0, common::Codec::kFp32, zeros, 1).status();
  ASSERT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_STREQ(HealReasonOf(stale), "stale");
  const absl::Status dropped =
      state.AddChunk("b", 2, 0, common::Codec::kFp32, zeros, 1).status();
  ASSERT_EQ(dropped.code(), absl::StatusCode::kNotFound) << dropped;
  EXPECT_STREQ(HealReasonOf(dropped), "dropped");

  // The shard's Subscribe and the worker's stream, when the updates it
  // needs are gone (job_shard.cc, shard_stream.cc).
  EXPECT_STREQ(HealReasonOf(absl::FailedPreconditionError(
                   "replay_from_round 3 is older than the oldest update "
                   "shard 0 holds for job \"j\" (round 7; open round 9)")),
               "behind");
  EXPECT_STREQ(HealReasonOf(absl::FailedPreconditionError(
                   "shard 1 is at open round 9 and can replay updates from "
                   "round 7, but this worker needs the update of round 3: it "
                   "cannot follow the shard (...)")),
               "behind");

  // Refusals that a fetch cannot mend.
  EXPECT_EQ(HealReasonOf(absl::FailedPreconditionError(
                "worker \"a\" was evicted from job \"j\"")),
            nullptr);
  EXPECT_EQ(HealReasonOf(absl::InvalidArgumentError("element 3 is not finite")),
            nullptr);
  EXPECT_EQ(HealReasonOf(absl::DeadlineExceededError("no update")), nullptr);
  EXPECT_EQ(HealReasonOf(absl::OkStatus()), nullptr);
}

}  // namespace
}  // namespace co2::client
