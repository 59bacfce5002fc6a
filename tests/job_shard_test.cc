#include "server/job_shard.h"

#include <memory>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/job_config.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

constexpr size_t kParams = 1000;

class RecordingSink : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks> update) override {
    rounds.push_back((*update)[0]->round());
  }
  std::vector<uint64_t> rounds;
};

v1::JobConfig Config(uint32_t min_workers = 1) {
  v1::JobConfig c = common::DefaultJobConfig(kParams, 1);
  c.set_alpha(1.0f);
  c.set_beta(0.0f);
  c.set_gap_penalty(v1::GAP_PENALTY_NONE);
  c.set_clip(v1::CLIP_NONE);
  c.set_min_workers(min_workers);
  c.set_round_timeout_ms(1000);
  return c;
}

std::string Fp32(float value) {
  std::vector<float> v(kParams, value);
  std::string bytes(kParams * sizeof(float), '\0');
  common::Encode(common::Codec::kFp32, v, absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

v1::Contribution Contribution(uint64_t round, float value, double weight = 1) {
  v1::Contribution c;
  c.set_round(round);
  c.set_chunk_index(0);
  c.set_codec(v1::CODEC_FP32);
  c.set_weight(weight);
  c.set_payload(Fp32(value));
  return c;
}

class JobShardTest : public testing::Test {
 protected:
  void SetUp() override {
    auto created = JobShard::Create("job", Config(2), JobShardOptions{}, &clock_);
    ASSERT_TRUE(created.ok()) << created.status();
    shard_ = *std::move(created);
  }
  void JoinAndSeed(const std::vector<std::string>& workers) {
    for (const auto& w : workers) {
      ASSERT_TRUE(shard_->Join(w, Config(2), common::Codec::kFp32).ok());
    }
    ASSERT_TRUE(shard_->SeedChunk(workers[0], 0, Fp32(10)).ok());
  }
  common::FakeClock clock_;
  std::unique_ptr<JobShard> shard_;
};

TEST_F(JobShardTest, LocalSgdAnchorIsTheMeanOfTheWorkers) {
  // α = 1, β = 0, no penalty, no clip: U = −mean Δ, so A moves by −mean Δ.
  JoinAndSeed({"a", "b"});
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_TRUE(shard_->Subscribe(sink, 0).empty());
  for (uint64_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(shard_->Contribute("a", Contribution(r, 1.0f)).ok());
    EXPECT_EQ(shard_->Poll(), 0) << "round " << r << " closed without b";
    ASSERT_TRUE(shard_->Contribute("b", Contribution(r, 3.0f)).ok());
    EXPECT_EQ(shard_->Poll(), 1) << "round " << r;
  }
  EXPECT_EQ(sink->rounds, (std::vector<uint64_t>{0, 1, 2}));
  uint64_t round = 0;
  std::vector<float> anchor = shard_->AnchorForTesting(&round);
  EXPECT_EQ(round, 4u);  // 3 rounds closed + staleness 1
  for (float a : anchor) ASSERT_EQ(a, 10.0f - 3 * 2.0f);
}

TEST_F(JobShardTest, ClosesAtTheDeadlineWithQuorumAndExpiresLeases) {
  JoinAndSeed({"a", "b"});
  ASSERT_TRUE(shard_->Contribute("a", Contribution(0, 1.0f)).ok());
  EXPECT_EQ(shard_->Poll(), 0);
  clock_.Advance(absl::Seconds(2));  // past the round deadline
  EXPECT_EQ(shard_->Poll(), 0) << "1 contribution is below min_workers 2";
  EXPECT_EQ(shard_->stats().quorum_misses, 1u);
  clock_.Advance(absl::Seconds(30));  // past both leases
  shard_->Poll();
  EXPECT_EQ(shard_->stats().live_workers, 0u);
  EXPECT_EQ(shard_->Heartbeat("a").code(), absl::StatusCode::kNotFound);
}

TEST_F(JobShardTest, LateJoinerStartsAtTheFetchedAnchorRound) {
  JoinAndSeed({"a", "b"});
  for (uint64_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(shard_->Contribute("a", Contribution(r, 1.0f)).ok());
    ASSERT_TRUE(shard_->Contribute("b", Contribution(r, 1.0f)).ok());
    ASSERT_EQ(shard_->Poll(), 1);
  }
  ASSERT_TRUE(shard_->Join("c", Config(2), common::Codec::kFp32).ok());
  auto snapshot = shard_->Fetch("c");
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->anchor_round, 3u);
  // Round 2 closes without c, which enters at round 3.
  ASSERT_TRUE(shard_->Contribute("a", Contribution(2, 1.0f)).ok());
  ASSERT_TRUE(shard_->Contribute("b", Contribution(2, 1.0f)).ok());
  EXPECT_EQ(shard_->Poll(), 1);
  ASSERT_TRUE(shard_->Contribute("a", Contribution(3, 1.0f)).ok());
  ASSERT_TRUE(shard_->Contribute("b", Contribution(3, 1.0f)).ok());
  EXPECT_EQ(shard_->Poll(), 0) << "round 3 needs c";
}

TEST_F(JobShardTest, RejectsBadInputWithoutTouchingTheAnchor) {
  JoinAndSeed({"a", "b"});
  v1::Contribution nan = Contribution(0, NAN);
  EXPECT_EQ(shard_->Contribute("a", nan).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->Contribute("zed", Contribution(0, 1)).code(),
            absl::StatusCode::kNotFound);
  v1::JobConfig other = Config(2);
  other.set_alpha(0.5f);
  EXPECT_EQ(shard_->Join("c", other, common::Codec::kFp32).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard_->Contribute("a", Contribution(0, 1.0f)).ok());
  ASSERT_TRUE(shard_->Contribute("b", Contribution(0, 1.0f)).ok());
  EXPECT_EQ(shard_->Poll(), 1);
  uint64_t round = 0;
  for (float a : shard_->AnchorForTesting(&round)) ASSERT_EQ(a, 9.0f);
}

}  // namespace
}  // namespace co2::server
