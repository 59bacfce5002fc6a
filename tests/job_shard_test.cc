#include "server/job/job_shard.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job/outer_optimizer.h"
#include "server/job/round_journal.h"
#include "server/storage/checkpoint_store.h"
#include "tests/job_shard_fixture.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

using ::co2::testing::TempDir;

using shard_test::Config;
using shard_test::Contribution;
using shard_test::Fp32;
using shard_test::kParams;
using shard_test::RecordingSink;

// Records every update chunk it is sent.
class UpdateRecorder : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks> update) override {
    for (const auto& chunk : *update) updates.push_back(chunk);
  }
  void Replay(const KeptUpdate&) override {}
  std::vector<std::shared_ptr<const v1::OuterUpdate>> updates;
};

class JobShardTest : public ::testing::Test {
 protected:
  // Job "job" with quorum 2, `workers` joined, A_0 = 10 seeded by the first.
  void JoinAndSeed(const std::vector<std::string>& workers) {
    auto seeded =
        shard_test::SeededShard(Config(2), JobShardOptions{}, &clock_, workers);
    CO2_ASSERT_OK(seeded);
    shard_ = *std::move(seeded);
  }
  common::FakeClock clock_;
  std::unique_ptr<JobShard> shard_;
};

TEST_F(JobShardTest, LocalSgdAnchorIsTheMeanOfTheWorkers) {
  // α = 1, β = 0, no penalty, no clip: U = −mean Δ, so A moves by −mean Δ.
  JoinAndSeed({"a", "b"});
  auto sink = std::make_shared<RecordingSink>();
  CO2_EXPECT_OK(shard_->Subscribe(sink, 0));
  EXPECT_TRUE(sink->replayed.empty());
  for (uint64_t r = 0; r < 3; ++r) {
    CO2_ASSERT_OK(shard_->Contribute("a", Contribution(r, 1.0f)));
    EXPECT_EQ(shard_->Poll(), 0) << "round " << r << " closed without b";
    CO2_ASSERT_OK(shard_->Contribute("b", Contribution(r, 3.0f)));
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
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));
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
    CO2_ASSERT_OK(shard_->Contribute("a", Contribution(r, 1.0f)));
    CO2_ASSERT_OK(shard_->Contribute("b", Contribution(r, 1.0f)));
    ASSERT_EQ(shard_->Poll(), 1);
  }
  CO2_ASSERT_OK(shard_->Join("c", Config(2), common::Codec::kFp32));
  auto snapshot = shard_->Fetch("c");
  CO2_ASSERT_OK(snapshot);
  EXPECT_EQ((*snapshot)->anchor_round, 3u);
  // Round 2 closes without c, which enters at round 3.
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(2, 1.0f)));
  CO2_ASSERT_OK(shard_->Contribute("b", Contribution(2, 1.0f)));
  EXPECT_EQ(shard_->Poll(), 1);
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(3, 1.0f)));
  CO2_ASSERT_OK(shard_->Contribute("b", Contribution(3, 1.0f)));
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
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));
  CO2_ASSERT_OK(shard_->Contribute("b", Contribution(0, 1.0f)));
  EXPECT_EQ(shard_->Poll(), 1);
  uint64_t round = 0;
  for (float a : shard_->AnchorForTesting(&round)) ASSERT_EQ(a, 9.0f);
}

// Drives one shard through `rounds` rounds of two workers with round-valued
// deltas, starting at round `from`.
void RunRounds(JobShard& shard, uint64_t from, uint64_t rounds) {
  for (uint64_t r = from; r < from + rounds; ++r) {
    CO2_ASSERT_OK(shard.Contribute("a", Contribution(r, 0.25f * r)));
    CO2_ASSERT_OK(shard.Contribute("b", Contribution(r, -0.5f, 3)));
    ASSERT_EQ(shard.Poll(), 1) << "round " << r;
  }
}

v1::JobConfig MomentumConfig() {
  v1::JobConfig c = common::DefaultJobConfig(kParams, 1);  // β, penalty, clip on
  c.set_min_workers(2);
  return c;
}

// Holds the updates it is sent only weakly, as a stream does once it has
// written them, and copies their payloads.
// Keeps what it is sent (of a one-chunk job) only weakly, as a stream that
// has written it; and the updates replayed to it.
class SendingSink : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks> update) override {
    sent.push_back((*update)[0]);
    payloads.push_back((*update)[0]->payload());
  }
  void Replay(const KeptUpdate& update) override { replayed.push_back(update); }
  std::vector<std::weak_ptr<const v1::OuterUpdate>> sent;
  std::vector<std::string> payloads;
  std::vector<KeptUpdate> replayed;
};

// Runs three rounds with or without checkpoints; `sink` saw them.
std::unique_ptr<JobShard> ThreeRounds(const CheckpointStore* store,
                                      std::shared_ptr<SendingSink> sink,
                                      common::FakeClock* clock) {
  JobShardOptions options;
  options.checkpoints = store;
  auto shard = *JobShard::Create("job", MomentumConfig(), options, clock);
  for (const char* w : {"a", "b"}) {
    CO2_EXPECT_OK(shard->Join(w, MomentumConfig(), common::Codec::kFp32));
  }
  CO2_EXPECT_OK(shard->SeedChunk("a", 0, 0, Fp32(1.5f)));
  CO2_EXPECT_OK(shard->Subscribe(sink, 0));
  RunRounds(*shard, 0, 3);
  return shard;
}

TEST(JobShardCheckpointTest, ASentUpdateIsKeptInItsCheckpointNotInMemory) {
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  auto sink = std::make_shared<SendingSink>();
  auto shard = ThreeRounds(&store, sink, &clock);
  ASSERT_EQ(sink->sent.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(sink->sent[r].expired()) << "round " << r << " still in memory";
  }
  // A reconnecting worker is replayed the last max_staleness + 1 rounds,
  // read back from their checkpoints: the bytes it would have been sent.
  auto reconnected = std::make_shared<SendingSink>();
  CO2_EXPECT_OK(shard->Subscribe(reconnected, 1));
  const std::vector<KeptUpdate>& replay = reconnected->replayed;
  ASSERT_EQ(replay.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(replay[i].chunks(), nullptr) << "round " << i + 1;
    auto chunk = replay[i].Chunk(0);
    CO2_ASSERT_OK(chunk);
    EXPECT_EQ((*chunk)->round(), i + 1);
    EXPECT_EQ((*chunk)->contributors(), 2u);
    EXPECT_EQ((*chunk)->anchor_round(), i + 3);
    EXPECT_EQ((*chunk)->payload(), sink->payloads[i + 1]) << "round " << i + 1;
  }
  EXPECT_EQ(shard->stats().unread_gap_chunks, 0u);
}

TEST(JobShardCheckpointTest, WithoutCheckpointsTheReplayRoundsStayInMemory) {
  common::FakeClock clock;
  auto sink = std::make_shared<SendingSink>();
  auto shard = ThreeRounds(nullptr, sink, &clock);
  ASSERT_EQ(sink->sent.size(), 3u);
  EXPECT_TRUE(sink->sent[0].expired());
  EXPECT_FALSE(sink->sent[1].expired());
  EXPECT_FALSE(sink->sent[2].expired());
}

// The one job checkpointed in `store`, restored into a shard with
// `options`; null (with the test failed) if that does not work.
std::unique_ptr<JobShard> RestoredShard(const CheckpointStore& store,
                                        const JobShardOptions& options,
                                        common::Clock* clock) {
  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
  EXPECT_EQ(loaded.size(), 1u);
  EXPECT_TRUE(errors.empty());
  if (loaded.size() != 1) return nullptr;
  auto restored = JobShard::Restore(std::move(loaded[0]), options, clock);
  CO2_EXPECT_OK(restored);
  return restored.ok() ? *std::move(restored) : nullptr;
}

// A checkpoint written by another protocol version (chunks of another size)
// is refused with the version it has; the registry then sets it aside.
TEST(JobShardCheckpointTest, RefusesACheckpointOfAnotherProtocolVersion) {
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  auto sink = std::make_shared<SendingSink>();
  ASSERT_NE(ThreeRounds(&store, sink, &clock), nullptr);
  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
  ASSERT_EQ(loaded.size(), 1u);
  loaded[0].header.mutable_config()->set_protocol_version(
      common::kProtocolVersion - 1);
  auto restored = JobShard::Restore(std::move(loaded[0]), {}, &clock);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(restored.status().message(),
            absl::StrCat("JobConfig.protocol_version must be ",
                         common::kProtocolVersion, ", got ",
                         common::kProtocolVersion - 1));
}

TEST(JobShardCheckpointTest, RestoredShardContinuesBitIdentically) {
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  JobShardOptions with_store;
  with_store.checkpoints = &store;
  auto original = *JobShard::Create("job", MomentumConfig(), with_store, &clock);
  auto reference = *JobShard::Create("job", MomentumConfig(), {}, &clock);
  for (JobShard* shard : {original.get(), reference.get()}) {
    for (const char* w : {"a", "b"}) {
      CO2_ASSERT_OK(shard->Join(w, MomentumConfig(), common::Codec::kFp32));
    }
    CO2_ASSERT_OK(shard->SeedChunk("a", 0, 0, Fp32(1.5f)));
    RunRounds(*shard, 0, 3);
  }
  EXPECT_EQ(original->stats().checkpoints_written, 3u);

  std::unique_ptr<JobShard> restored = RestoredShard(store, with_store, &clock);
  ASSERT_NE(restored, nullptr);
  JobShard& shard = *restored;
  // The update of the last closed round is replayed to reconnecting workers.
  auto sink = std::make_shared<RecordingSink>();
  CO2_EXPECT_OK(shard.Subscribe(sink, 2));
  EXPECT_EQ(sink->replayed, std::vector<uint64_t>{2});
  // Workers rejoin where they were and continue.
  for (const char* w : {"a", "b"}) {
    CO2_ASSERT_OK(shard.Join(w, MomentumConfig(), common::Codec::kFp32, 3));
  }
  RunRounds(shard, 3, 2);
  RunRounds(*reference, 3, 2);
  uint64_t round_a = 0, round_b = 0;
  const std::vector<float> a = shard.AnchorForTesting(&round_a);
  const std::vector<float> b = reference->AnchorForTesting(&round_b);
  EXPECT_EQ(round_a, round_b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(sink->rounds, (std::vector<uint64_t>{3, 4}));
}

// The shard runs the outer step chunk by chunk, keeps m only with β != 0 and,
// with the fp32 downlink, reads the gap from the cached update: its anchor
// must still be bit for bit the one of the step on the whole range, across a
// restart from its checkpoint. Parameters: β and the downlink codec.
class JobShardStepTest
    : public ::testing::TestWithParam<std::tuple<float, v1::Codec, uint32_t>> {
};

v1::JobConfig StepConfig(size_t n, float beta, v1::Codec downlink,
                         uint32_t max_staleness) {
  v1::JobConfig c = common::DefaultJobConfig(n, 1);
  c.set_max_staleness(max_staleness);
  c.set_alpha(0.7f);
  c.set_beta(beta);
  c.set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
  c.set_clip(v1::CLIP_ADAPTIVE);
  c.set_clip_value(2.0f);
  c.set_downlink_codec(downlink);
  return c;
}

std::string Fp32Chunk(const std::vector<float>& values, common::Range r) {
  std::string bytes(r.size() * sizeof(float), '\0');
  common::Encode(common::Codec::kFp32,
                 absl::MakeConstSpan(values).subspan(r.begin, r.size()),
                 absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

// Chunk `c` of `values` (the whole range) as `round`'s fp32 contribution.
v1::Contribution ChunkContribution(uint64_t round, uint32_t c,
                                   const std::vector<float>& values,
                                   double weight = 1.0) {
  v1::Contribution contribution;
  contribution.set_round(round);
  contribution.set_chunk_index(c);
  contribution.set_codec(v1::CODEC_FP32);
  contribution.set_weight(weight);
  contribution.set_payload(
      Fp32Chunk(values, common::ChunkRange(values.size(), c)));
  return contribution;
}

// A shard of `config` checkpointing to `store`, with worker "w" joined.
std::unique_ptr<JobShard> CheckpointedShard(const v1::JobConfig& config,
                                            const CheckpointStore* store,
                                            common::Clock* clock) {
  JobShardOptions options;
  options.checkpoints = store;
  auto shard = *JobShard::Create("job", config, options, clock);
  CO2_EXPECT_OK(shard->Join("w", config, common::Codec::kFp32));
  return shard;
}

// `worker` (told to seed) seeds `anchor`, the whole range, chunk by chunk.
void SeedAll(JobShard& shard, const std::string& worker,
             const std::vector<float>& anchor) {
  for (uint32_t c = 0; c < shard.num_chunks(); ++c) {
    CO2_ASSERT_OK(shard.SeedChunk(
        worker, c, 0, Fp32Chunk(anchor, common::ChunkRange(anchor.size(), c))));
  }
}

TEST_P(JobShardStepTest, AnchorFollowsTheStepOnTheWholeRange) {
  const auto [beta, downlink, max_staleness] = GetParam();
  const size_t n = 2 * common::kChunkElements + 1000;  // 3 chunks, 1 short
  const uint32_t chunks = static_cast<uint32_t>(common::NumChunks(n));
  const v1::JobConfig config = StepConfig(n, beta, downlink, max_staleness);
  const common::Codec codec = common::Codec(downlink);
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  JobShardOptions options;
  options.checkpoints = &store;
  auto shard = CheckpointedShard(config, &store, &clock);
  std::vector<float> anchor(n);
  for (size_t i = 0; i < n; ++i) anchor[i] = 0.01f * static_cast<float>(i % 100);
  SeedAll(*shard, "w", anchor);

  OuterConfig outer;
  outer.alpha = 0.7f;
  outer.beta = beta;
  outer.penalty = GapPenalty::kGapAware;
  outer.clip = ClipMode::kAdaptive;
  outer.clip_value = 2.0f;
  std::vector<float> gap(n, 0.0f), momentum(n, 0.0f), update(n);
  std::vector<float> delta(n);
  for (uint64_t r = 0; r < 4; ++r) {
    if (r == 2) {  // a restart: the state comes back from the checkpoint
      std::vector<UnusableCheckpoint> errors;
      std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
      ASSERT_EQ(loaded.size(), 1u);
      auto restored = JobShard::Restore(std::move(loaded[0]), options, &clock);
      CO2_ASSERT_OK(restored);
      shard = *std::move(restored);
      CO2_ASSERT_OK(shard->Join("w", config, common::Codec::kFp32, r));
    }
    for (size_t i = 0; i < n; ++i) {
      delta[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r)) *
                 static_cast<float>(1 + i % 5);
    }
    for (uint32_t c = 0; c < chunks; ++c) {
      CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(r, c, delta)));
    }
    ASSERT_EQ(shard->Poll(), 1) << "round " << r;
    // The reference: the step on the whole range, then what workers decode.
    OuterStep(outer, r, delta, gap, absl::MakeSpan(momentum),
              absl::MakeSpan(update));
    for (uint32_t c = 0; c < chunks; ++c) {
      const common::Range range = common::ChunkRange(n, c);
      std::string bytes(common::EncodedSize(codec, range.size()), '\0');
      common::Encode(codec,
                     absl::MakeConstSpan(update).subspan(range.begin, range.size()),
                     absl::MakeSpan(bytes.data(), bytes.size()));
      common::Decode(codec, bytes,
                     absl::MakeSpan(gap).subspan(range.begin, range.size()));
    }
    for (size_t i = 0; i < n; ++i) anchor[i] += gap[i];
  }
  uint64_t anchor_round = 0;
  const std::vector<float> got = shard->AnchorForTesting(&anchor_round);
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(std::memcmp(got.data(), anchor.data(), n * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(
    BetaDownlinkAndStaleness, JobShardStepTest,
    ::testing::Values(std::make_tuple(0.0f, v1::CODEC_FP32, 1u),
                      std::make_tuple(0.9f, v1::CODEC_FP32, 1u),
                      std::make_tuple(0.0f, v1::CODEC_BF16, 1u),
                      std::make_tuple(0.9f, v1::CODEC_INT8, 1u),
                      // The cache keeps one update: the gap must survive it.
                      std::make_tuple(0.9f, v1::CODEC_FP32, 0u),
                      std::make_tuple(0.9f, v1::CODEC_BF16, 0u)));

// Records every update chunk it is sent, in order.
class ChunkSink : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks> update) override {
    for (const auto& chunk : *update) chunks.push_back(chunk);
  }
  void Replay(const KeptUpdate& update) override {
    for (uint32_t c = 0; c < update.num_chunks(); ++c) {
      chunks.push_back(*update.Chunk(c));
    }
  }
  // The payload of chunk `chunk` of `round`'s update; empty if not sent.
  std::string Payload(uint64_t round, uint32_t chunk) const {
    for (const auto& m : chunks) {
      if (m->round() == round && m->chunk_index() == chunk) return m->payload();
    }
    return "";
  }
  std::vector<std::shared_ptr<const v1::OuterUpdate>> chunks;
};

// Two shards of one job fed the same input: `streaming` as shipped, and
// `reference` closing whole rounds (stream_updates off); workers "a" and "b"
// joined and `anchor` seeded by "a" on both. `streamed` and `whole` are
// sinks for the tests to subscribe to them.
struct StreamingAndWholeRounds {
  StreamingAndWholeRounds(const v1::JobConfig& config,
                          const std::vector<float>& anchor) {
    JobShardOptions whole_rounds;
    whole_rounds.stream_updates = false;
    streaming = *JobShard::Create("job", config, {}, &clock);
    reference = *JobShard::Create("job", config, whole_rounds, &clock);
    for (JobShard* shard : both()) {
      for (const char* w : {"a", "b"}) {
        CO2_EXPECT_OK(shard->Join(w, config, common::Codec::kFp32));
      }
      SeedAll(*shard, "a", anchor);
    }
  }
  std::vector<JobShard*> both() const {
    return {streaming.get(), reference.get()};
  }
  // Both sinks got the same updates of rounds [0, rounds) and the shards
  // hold the same anchor bits of the same round.
  void ExpectSameBits(uint64_t rounds) const {
    for (uint64_t r = 0; r < rounds; ++r) {
      for (uint32_t c = 0; c < streaming->num_chunks(); ++c) {
        EXPECT_EQ(streamed->Payload(r, c), whole->Payload(r, c))
            << "round " << r << " chunk " << c;
      }
    }
    uint64_t round_a = 0, round_b = 0;
    const std::vector<float> a = streaming->AnchorForTesting(&round_a);
    const std::vector<float> b = reference->AnchorForTesting(&round_b);
    EXPECT_EQ(round_a, round_b);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }

  common::FakeClock clock;
  std::unique_ptr<JobShard> streaming;
  std::unique_ptr<JobShard> reference;
  std::shared_ptr<ChunkSink> streamed = std::make_shared<ChunkSink>();
  std::shared_ptr<ChunkSink> whole = std::make_shared<ChunkSink>();
};

// Without checkpoints a shard steps and sends each chunk of a round as soon
// as both workers have sent it; its anchors, fetches and updates are bit for
// bit those of a shard that waits for the whole round (stream_updates off).
// It keeps the old values of stepped chunks only while a joined worker
// waits to fetch.
TEST(JobShardStreamTest, ChunksGoOutAsTheyCompleteWithTheBitsOfAWholeRound) {
  const size_t n = 2 * common::kChunkElements + 1000;  // 3 chunks, 1 short
  const uint32_t chunks = static_cast<uint32_t>(common::NumChunks(n));
  const v1::JobConfig config = StepConfig(n, 0.9f, v1::CODEC_BF16, 1);
  std::vector<float> anchor(n);
  for (size_t i = 0; i < n; ++i)
    anchor[i] = 0.01f * static_cast<float>(i % 100);
  StreamingAndWholeRounds pair(config, anchor);
  JobShard* const streaming = pair.streaming.get();
  JobShard* const reference = pair.reference.get();
  ChunkSink* const streamed = pair.streamed.get();
  ChunkSink* const whole = pair.whole.get();
  CO2_EXPECT_OK(streaming->Subscribe(pair.streamed, 0));
  CO2_EXPECT_OK(reference->Subscribe(pair.whole, 0));

  std::vector<float> delta(n);
  for (uint64_t r = 0; r < 4; ++r) {
    if (r == 2) {
      for (JobShard* shard : pair.both()) {
        CO2_ASSERT_OK(shard->Join("c", config, common::Codec::kFp32));
      }
    }
    for (uint32_t c = 0; c < chunks; ++c) {
      const common::Range range = common::ChunkRange(n, c);
      for (const char* w : {"a", "b"}) {
        const float sign = w[0] == 'a' ? 1.0f : -0.5f;
        for (size_t i = range.begin; i < range.end; ++i) {
          delta[i] =
              sign *
              std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r)) *
              static_cast<float>(1 + i % 5);
        }
        const v1::Contribution contribution =
            ChunkContribution(r, c, delta, w[0] == 'a' ? 1.0 : 3.0);
        CO2_ASSERT_OK(streaming->Contribute(w, contribution));
        CO2_ASSERT_OK(reference->Contribute(w, contribution));
      }
      const bool last = c + 1 == chunks;
      EXPECT_EQ(streaming->Poll(), last ? 1 : 0) << "round " << r;
      EXPECT_EQ(reference->Poll(), last ? 1 : 0) << "round " << r;
      // The streaming shard sent this chunk's update at once; the other
      // sends nothing of the round before it closes.
      EXPECT_FALSE(streamed->Payload(r, c).empty())
          << "round " << r << " chunk " << c;
      EXPECT_EQ(whole->Payload(r, c).empty(), !last)
          << "round " << r << " chunk " << c;
      if (r == 1 && c == 0) {
        // Nobody was waiting to fetch when chunk 0 was stepped, so the
        // shard kept no copy of its old values: a worker joining now is told
        // to retry until the round closes.
        CO2_ASSERT_OK(streaming->Join("d", config, common::Codec::kFp32));
        EXPECT_EQ(streaming->Fetch("d").status().code(),
                  absl::StatusCode::kUnavailable);
        CO2_ASSERT_OK(streaming->Leave("d"));
      }
      if (r == 2 && c == 0) {
        // "c" joined before the round and waits to fetch: mid-round it gets
        // the anchor of before the round. A stream that starts now is sent
        // the chunk streamed so far.
        auto fetched = streaming->Fetch("c");
        auto expected = reference->Fetch("c");
        CO2_ASSERT_OK(fetched);
        CO2_ASSERT_OK(expected);
        EXPECT_EQ((*fetched)->anchor_round, (*expected)->anchor_round);
        for (uint32_t k = 0; k < chunks; ++k) {
          EXPECT_EQ((*fetched)->chunks[k].payload(),
                    (*expected)->chunks[k].payload())
              << "chunk " << k;
        }
        auto reconnected = std::make_shared<ChunkSink>();
        CO2_EXPECT_OK(streaming->Subscribe(reconnected, 2));
        ASSERT_EQ(reconnected->chunks.size(), 1u);
        EXPECT_EQ(reconnected->chunks[0]->round(), 2u);
        EXPECT_EQ(reconnected->chunks[0]->chunk_index(), 0u);
        for (JobShard* shard : pair.both()) {
          CO2_ASSERT_OK(shard->Leave("c"));  // not a member of round 3
        }
      }
    }
  }
  ASSERT_EQ(streamed->chunks.size(), 4u * chunks) << "each chunk sent once";
  pair.ExpectSameBits(4);
}

// A round whose first chunk was streamed and which then closes at its
// deadline with quorum (b sent only chunk 0) steps the rest at the close: the
// update is whole, every chunk sent once, and the bits are those of a shard
// closing whole rounds; b's late chunk is folded into the next round in both.
TEST(JobShardStreamTest, AStreamedRoundClosesAtItsDeadlineWithQuorum) {
  const size_t n = 2 * common::kChunkElements;
  v1::JobConfig config = StepConfig(n, 0.9f, v1::CODEC_FP32, 1);
  config.set_min_workers(1);
  config.set_round_timeout_ms(1000);
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = std::cos(0.01f * static_cast<float>(i));
    b[i] = -0.5f * a[i];
  }
  StreamingAndWholeRounds pair(config, std::vector<float>(n, 1.0f));
  for (JobShard* shard : pair.both()) {
    CO2_ASSERT_OK(shard->Contribute("a", ChunkContribution(0, 0, a)));
    CO2_ASSERT_OK(shard->Contribute("b", ChunkContribution(0, 0, b)));
    CO2_ASSERT_OK(shard->Contribute("a", ChunkContribution(0, 1, a)));
    EXPECT_EQ(shard->Poll(), 0);
  }
  CO2_EXPECT_OK(pair.streaming->Subscribe(pair.streamed, 0));
  CO2_EXPECT_OK(pair.reference->Subscribe(pair.whole, 0));
  ASSERT_EQ(pair.streamed->chunks.size(), 1u) << "chunk 0 went out at once";
  EXPECT_TRUE(pair.whole->chunks.empty());
  pair.clock.Advance(absl::Seconds(2));  // past the deadline: a is quorum
  for (JobShard* shard : pair.both()) {
    EXPECT_EQ(shard->Poll(), 1);
    EXPECT_EQ(shard->stats().quorum_closes, 1u);
    auto late = shard->Contribute("b", ChunkContribution(0, 1, b));
    CO2_EXPECT_OK(late);
    EXPECT_EQ(shard->stats().late_chunks, 1u);
  }
  ASSERT_EQ(pair.streamed->chunks.size(), 2u) << "each chunk sent once";
  ASSERT_EQ(pair.whole->chunks.size(), 2u);
  pair.ExpectSameBits(1);
}

// Worker `w`'s delta of round `r` over a range of n elements.
std::vector<float> WorkerDelta(char w, uint64_t r, size_t n) {
  std::vector<float> delta(n);
  for (size_t i = 0; i < n; ++i) {
    delta[i] = (w == 'a' ? 1.0f : -0.5f) *
               std::sin(0.002f * static_cast<float>(i) + static_cast<float>(r));
  }
  return delta;
}

// With checkpoints a chunk's update goes out before its round closes once
// the chunk is in the round journal, synced; the round's checkpoint then
// holds it and the journal is emptied.
TEST(JobShardStreamTest, WithCheckpointsAChunkGoesOutOnceItIsJournaled) {
  const size_t n = 2 * common::kChunkElements;
  const v1::JobConfig config = StepConfig(n, 0.9f, v1::CODEC_FP32, 1);
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  const std::string journal = store.JournalPathFor("job", 0, 1);
  auto shard = CheckpointedShard(config, &store, &clock);
  const std::vector<float> values(n, 1.0f);
  SeedAll(*shard, "w", values);
  auto sink = std::make_shared<ChunkSink>();
  CO2_EXPECT_OK(shard->Subscribe(sink, 0));
  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 0, values, 2)));
  EXPECT_EQ(shard->Poll(), 0);
  ASSERT_EQ(sink->chunks.size(), 1u) << "chunk 0 went out before the close";
  auto journaled = RoundJournal::Load(journal, 0);
  CO2_ASSERT_OK(journaled);
  ASSERT_EQ(journaled->size(), 1u);
  const v1::JournalChunkHeader& h = (*journaled)[0].header;
  EXPECT_EQ(h.chunk_index(), 0u);
  ASSERT_EQ(h.senders_size(), 1);
  EXPECT_EQ(h.senders(0).worker_id(), "w");
  EXPECT_EQ(h.senders(0).contribution_weight(), 2);
  EXPECT_EQ((*journaled)[0].update, sink->chunks[0]->payload());
  EXPECT_EQ((*journaled)[0].momentum.size(), common::kChunkElements);
  EXPECT_EQ(shard->stats().checkpoints_written, 1u) << "the seeded anchor";

  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 1, values, 2)));
  EXPECT_EQ(shard->Poll(), 1);
  EXPECT_EQ(sink->chunks.size(), 2u);
  EXPECT_EQ(shard->stats().checkpoints_written, 2u);
  EXPECT_TRUE(RoundJournal::Load(journal, 0)->empty())
      << "the round's checkpoint holds it";
}

// A shard that dies mid-round after streaming some chunks comes back from
// its checkpoint and journal: the chunks it sent are replayed, not stepped
// again; the workers' resends of them are duplicates; and every update and
// the anchor are bit for bit those of a shard that never stopped.
TEST(JobShardStreamTest, AShardRestartedMidRoundKeepsTheChunksItSent) {
  const size_t n = 2 * common::kChunkElements + 1000;  // 3 chunks
  const uint32_t chunks = static_cast<uint32_t>(common::NumChunks(n));
  const v1::JobConfig config = StepConfig(n, 0.9f, v1::CODEC_BF16, 1);
  std::vector<float> anchor(n);
  for (size_t i = 0; i < n; ++i) anchor[i] = std::cos(0.01f * i);
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  JobShardOptions with_store;
  with_store.checkpoints = &store;
  JobShardOptions whole_rounds;
  whole_rounds.stream_updates = false;
  auto original = *JobShard::Create("job", config, with_store, &clock);
  auto reference = *JobShard::Create("job", config, whole_rounds, &clock);
  auto sent = std::make_shared<ChunkSink>();
  auto expected = std::make_shared<ChunkSink>();
  for (JobShard* shard : {original.get(), reference.get()}) {
    for (const char* w : {"a", "b"}) {
      CO2_ASSERT_OK(shard->Join(w, config, common::Codec::kFp32));
    }
    SeedAll(*shard, "a", anchor);
  }
  CO2_EXPECT_OK(original->Subscribe(sent, 0));
  CO2_EXPECT_OK(reference->Subscribe(expected, 0));
  const auto contribute = [&](JobShard& shard, char w, uint64_t r, uint32_t c) {
    return shard.Contribute(
        std::string(1, w),
        ChunkContribution(r, c, WorkerDelta(w, r, n), w == 'a' ? 1 : 3));
  };
  // Round 0 whole; round 1: chunks 0 and 1 from both, chunk 2 from a.
  for (JobShard* shard : {original.get(), reference.get()}) {
    for (uint32_t c = 0; c < chunks; ++c) {
      for (char w : {'a', 'b'}) CO2_ASSERT_OK(contribute(*shard, w, 0, c));
      shard->Poll();
    }
    for (uint32_t c = 0; c < chunks; ++c) {
      for (char w : {'a', 'b'}) {
        if (c < 2 || w == 'a') {
          CO2_ASSERT_OK(contribute(*shard, w, 1, c));
        }
      }
      shard->Poll();
    }
  }
  ASSERT_EQ(sent->chunks.size(), chunks + 2u) << "round 0, then 2 chunks";
  // A worker joins mid-round: its membership waits for the round's close to
  // be checkpointed, since the anchor is part old, part new now.
  const uint64_t written = original->stats().checkpoints_written;
  CO2_ASSERT_OK(original->Join("c", config, common::Codec::kFp32));
  EXPECT_EQ(original->Poll(), 0);
  EXPECT_EQ(original->stats().checkpoints_written, written);
  original.reset();  // the shard dies

  std::unique_ptr<JobShard> restored = RestoredShard(store, with_store, &clock);
  ASSERT_NE(restored, nullptr);
  JobShard& shard = *restored;
  auto reconnected = std::make_shared<ChunkSink>();
  CO2_EXPECT_OK(shard.Subscribe(reconnected, 1));
  ASSERT_EQ(reconnected->chunks.size(), 2u) << "round 1's chunks 0 and 1";
  for (const auto& chunk : reconnected->chunks) {
    EXPECT_EQ(chunk->payload(), sent->Payload(1, chunk->chunk_index()));
  }
  EXPECT_EQ(shard.Fetch("a").status().code(), absl::StatusCode::kUnavailable)
      << "the anchor is whole again once round 1 closes";
  for (const char* w : {"a", "b"}) {
    CO2_ASSERT_OK(shard.Join(w, config, common::Codec::kFp32, 1));
  }
  // The workers resend round 1 whole; only chunk 2 is new.
  for (uint32_t c = 0; c < chunks; ++c) {
    for (char w : {'a', 'b'}) CO2_ASSERT_OK(contribute(shard, w, 1, c));
  }
  EXPECT_EQ(shard.stats().duplicate_chunks, 4u);
  EXPECT_EQ(shard.Poll(), 1);
  CO2_ASSERT_OK(contribute(*reference, 'b', 1, 2));
  EXPECT_EQ(reference->Poll(), 1);
  for (JobShard* s : {&shard, reference.get()}) {
    for (uint32_t c = 0; c < chunks; ++c) {
      for (char w : {'a', 'b'}) CO2_ASSERT_OK(contribute(*s, w, 2, c));
      s->Poll();
    }
  }
  for (uint64_t r = 0; r < 3; ++r) {
    for (uint32_t c = 0; c < chunks; ++c) {
      const std::string got = r == 0 || (r == 1 && c < 2)
                                  ? sent->Payload(r, c)
                                  : reconnected->Payload(r, c);
      EXPECT_FALSE(got.empty()) << "round " << r << " chunk " << c;
      EXPECT_EQ(got, expected->Payload(r, c))
          << "round " << r << " chunk " << c;
    }
  }
  // The two replayed, round 1's chunk 2, round 2: each sent once.
  EXPECT_EQ(reconnected->chunks.size(), 2u + 1 + chunks);
  uint64_t round_a = 0, round_b = 0;
  const std::vector<float> a = shard.AnchorForTesting(&round_a);
  const std::vector<float> b = reference->AnchorForTesting(&round_b);
  EXPECT_EQ(round_a, round_b);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
}

// A chunk whose journal append fails is not sent; it and the rest of its
// round go out after the round's checkpoint, at the close.
TEST(JobShardStreamTest, AChunkWhoseJournalFailsWaitsForItsRoundsCheckpoint) {
  const size_t n = 2 * common::kChunkElements;
  const v1::JobConfig config = StepConfig(n, 0.0f, v1::CODEC_FP32, 1);
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  // A directory where the journal should be: it cannot be opened.
  ASSERT_EQ(mkdir(store.JournalPathFor("job", 0, 1).c_str(), 0700), 0);
  auto shard = CheckpointedShard(config, &store, &clock);
  const std::vector<float> values(n, 1.0f);
  SeedAll(*shard, "w", values);
  auto sink = std::make_shared<ChunkSink>();
  CO2_EXPECT_OK(shard->Subscribe(sink, 0));
  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 0, values)));
  EXPECT_EQ(shard->Poll(), 0);
  EXPECT_TRUE(sink->chunks.empty()) << "sent before it was durable";
  EXPECT_EQ(shard->stats().checkpoint_failures, 1u);
  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 1, values)));
  EXPECT_EQ(shard->Poll(), 1);
  EXPECT_EQ(sink->chunks.size(), 2u);
  EXPECT_EQ(shard->stats().checkpoint_failures, 1u) << "round 0 not retried";
}

// A stream that starts while a closed round waits for its checkpoint gets
// that round's chunks streamed before the close at once, and the rest with
// the checkpoint: each chunk once.
TEST(JobShardStreamTest, AStreamStartedBeforeACloseIsDurableGetsEveryChunk) {
  const size_t n = 2 * common::kChunkElements;
  const v1::JobConfig config = StepConfig(n, 0.0f, v1::CODEC_FP32, 1);
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  auto shard = CheckpointedShard(config, &store, &clock);
  const std::vector<float> values(n, 1.0f);
  SeedAll(*shard, "w", values);
  auto early = std::make_shared<ChunkSink>();
  CO2_EXPECT_OK(shard->Subscribe(early, 0));
  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 0, values)));
  shard->Poll();
  ASSERT_EQ(early->chunks.size(), 1u) << "chunk 0 streamed";
  // A non-empty directory where the checkpoint goes: round 0's close fails.
  const std::string path = store.PathFor("job", 0, 1);
  const std::string blocker = path + "/blocker";
  ASSERT_EQ(std::remove(path.c_str()), 0);
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  { std::ofstream(blocker) << "x"; }
  CO2_ASSERT_OK(shard->Contribute("w", ChunkContribution(0, 1, values)));
  EXPECT_EQ(shard->Poll(), 0);
  EXPECT_EQ(shard->stats().checkpoint_failures, 1u);
  auto late = std::make_shared<ChunkSink>();
  CO2_EXPECT_OK(shard->Subscribe(late, 0));
  ASSERT_EQ(late->chunks.size(), 1u) << "chunk 0, streamed before the close";
  EXPECT_EQ(late->chunks[0]->chunk_index(), 0u);
  ASSERT_EQ(std::remove(blocker.c_str()), 0);
  ASSERT_EQ(std::remove(path.c_str()), 0);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(shard->Poll(), 1);
  for (const auto& sink : {early, late}) {
    ASSERT_EQ(sink->chunks.size(), 2u);
    EXPECT_NE(sink->chunks[0]->chunk_index(), sink->chunks[1]->chunk_index());
  }
  for (uint32_t c = 0; c < 2; ++c) {
    EXPECT_FALSE(early->Payload(0, c).empty());
    EXPECT_EQ(late->Payload(0, c), early->Payload(0, c));
  }
}

// A round whose mean would carry the anchor past fp32's range is refused,
// not applied: the round closes and its update is zero, so the shard and
// the workers stay at the last good anchor, and the refusal is counted.
// The next round, whose step fits, moves the anchor again.
TEST(JobShardOverflowTest, AStepThatWouldOverflowTheAnchorIsRefused) {
  common::FakeClock clock;
  auto seeded = shard_test::SeededShard(Config(2), JobShardOptions{}, &clock,
                                        {"a", "b"}, /*anchor=*/3e38f);
  CO2_ASSERT_OK(seeded);
  JobShard& shard = **seeded;
  auto sink = std::make_shared<RecordingSink>();
  CO2_ASSERT_OK(shard.Subscribe(sink, 0));
  // U = −mean = +1e38: A would be 4e38.
  CO2_ASSERT_OK(shard.Contribute("a", Contribution(0, -1e38f)));
  CO2_ASSERT_OK(shard.Contribute("b", Contribution(0, -1e38f)));
  EXPECT_EQ(shard.Poll(), 1);
  EXPECT_EQ(sink->rounds, (std::vector<uint64_t>{0}));
  EXPECT_EQ(shard.stats().refused_step_chunks, 1u);
  uint64_t round = 0;
  for (float a : shard.AnchorForTesting(&round)) ASSERT_EQ(a, 3e38f);
  CO2_ASSERT_OK(shard.Contribute("a", Contribution(1, 1e37f)));
  CO2_ASSERT_OK(shard.Contribute("b", Contribution(1, 1e37f)));
  EXPECT_EQ(shard.Poll(), 1);
  EXPECT_EQ(shard.stats().refused_step_chunks, 1u);
  for (float a : shard.AnchorForTesting(&round)) ASSERT_EQ(a, 3e38f - 1e37f);
}

// With the outlier rule, a contribution far off the others is held out:
// the anchor moves by the others' mean, the update names the worker and
// does not count it, and a worker held out in max_rejected_chunks rounds in
// a row is evicted (a round in between without a hold-out starts the count
// again).
TEST(JobShardOutlierTest, AnOutlierIsHeldOutNamedAndEvictedAfterRoundsInARow) {
  common::FakeClock clock;
  v1::JobConfig config = Config(4);
  config.set_outlier_ratio(10);
  JobShardOptions options;
  options.max_rejected_chunks = 2;
  auto seeded =
      shard_test::SeededShard(config, options, &clock, {"a", "b", "c", "d"});
  CO2_ASSERT_OK(seeded);
  JobShard& shard = **seeded;
  auto sink = std::make_shared<UpdateRecorder>();
  CO2_ASSERT_OK(shard.Subscribe(sink, 0));
  const auto round = [&](uint64_t r, float d) {
    for (const char* w : {"a", "b", "c"}) {
      CO2_ASSERT_OK(shard.Contribute(w, Contribution(r, 1.0f))) << w;
    }
    CO2_ASSERT_OK(shard.Contribute("d", Contribution(r, d)));
    ASSERT_EQ(shard.Poll(), 1) << "round " << r;
  };
  round(0, 1e6f);
  ASSERT_EQ(sink->updates.size(), 1u);
  const v1::OuterUpdate& update = *sink->updates[0];
  EXPECT_EQ(update.contributors(), 3u);
  ASSERT_EQ(update.held_out_size(), 1);
  EXPECT_EQ(update.held_out(0).worker_id(), "d");
  EXPECT_THAT(update.held_out(0).reason(),
              ::testing::HasSubstr("x the chunk's median"));
  uint64_t anchor_round = 0;
  for (float a : shard.AnchorForTesting(&anchor_round)) ASSERT_EQ(a, 9.0f);
  EXPECT_EQ(shard.stats().held_out_chunks, 1u);
  EXPECT_EQ(shard.stats().rejected_chunks, 1u);
  round(1, 1.0f);  // d is back: the count starts again
  EXPECT_EQ(sink->updates[1]->held_out_size(), 0);
  round(2, 1e6f);
  EXPECT_EQ(shard.stats().evicted_workers, 0u) << "one round in a row";
  round(3, -1e6f);
  EXPECT_EQ(shard.stats().evicted_workers, 1u);
  EXPECT_EQ(shard.stats().held_out_chunks, 3u);
  const absl::Status evicted = shard.Heartbeat("d");
  EXPECT_EQ(evicted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(evicted.message(),
              ::testing::HasSubstr("2 rounds in a row with a contribution held "
                                   "out of the mean (last: round 3 chunk 0"));
  // The rounds close without it.
  for (const char* w : {"a", "b", "c"}) {
    CO2_ASSERT_OK(shard.Contribute(w, Contribution(4, 1.0f))) << w;
  }
  EXPECT_EQ(shard.Poll(), 1);
}

// A worker evicted for invalid chunks leaves the membership a checkpoint
// holds, as one that left does: a restarted shard does not wait for it.
TEST(JobShardCheckpointTest, AWorkerEvictedForInvalidChunksLeavesTheCheckpoint) {
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  JobShardOptions options;
  options.checkpoints = &store;
  options.max_rejected_chunks = 2;
  auto seeded =
      shard_test::SeededShard(Config(2), options, &clock, {"a", "b", "c"});
  CO2_ASSERT_OK(seeded);
  JobShard& shard = **seeded;
  EXPECT_EQ(shard.Poll(), 0);  // the seeded anchor's checkpoint, with c
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(shard.Contribute("c", Contribution(0, NAN)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  ASSERT_EQ(shard.stats().evicted_workers, 1u);
  EXPECT_EQ(shard.Poll(), 0);
  auto restored = RestoredShard(store, {}, &clock);
  ASSERT_NE(restored, nullptr);
  CO2_EXPECT_OK(restored->Heartbeat("a"));
  EXPECT_EQ(restored->Heartbeat("c").code(), absl::StatusCode::kNotFound);
}

TEST_F(JobShardTest, FetchesOfOneAnchorShareOneSnapshot) {
  JoinAndSeed({"a", "b"});
  auto first = shard_->Fetch("a");
  auto second = shard_->Fetch("b");
  CO2_ASSERT_OK(first);
  CO2_ASSERT_OK(second);
  EXPECT_EQ(first->get(), second->get());
  CO2_ASSERT_OK(shard_->Contribute("a", Contribution(0, 1.0f)));
  CO2_ASSERT_OK(shard_->Contribute("b", Contribution(0, 3.0f)));
  ASSERT_EQ(shard_->Poll(), 1);
  // The anchor moved: a new fetch gets it, the old snapshot is unchanged.
  auto third = shard_->Fetch("a");
  CO2_ASSERT_OK(third);
  EXPECT_NE(third->get(), first->get());
  EXPECT_EQ((*first)->chunks[0].payload(), Fp32(10));
  EXPECT_EQ((*third)->chunks[0].payload(), Fp32(10.0f - 2.0f));
  EXPECT_EQ((*third)->chunks[0].anchor_round(), (*third)->anchor_round);
}

TEST(JobShardCheckpointTest, UpdateIsHeldUntilItsCheckpointIsDurable) {
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  const std::string dir = temp_dir.path() + "/blocked";
  { std::ofstream(dir) << "a file where the directory should be"; }
  CheckpointStore store(dir);
  JobShardOptions options;
  options.checkpoints = &store;
  auto shard = *JobShard::Create("job", Config(1), options, &clock);
  CO2_ASSERT_OK(shard->Join("a", Config(1), common::Codec::kFp32));
  CO2_ASSERT_OK(shard->SeedChunk("a", 0, 0, Fp32(1)));
  auto sink = std::make_shared<RecordingSink>();
  CO2_EXPECT_OK(shard->Subscribe(sink, 0));
  CO2_ASSERT_OK(shard->Contribute("a", Contribution(0, 1)));
  EXPECT_EQ(shard->Poll(), 0);
  EXPECT_TRUE(sink->rounds.empty()) << "update released before it was durable";
  EXPECT_EQ(shard->stats().checkpoint_failures, 1u);
  EXPECT_EQ(shard->UpdateHeld(), "checkpoint failing: Not a directory");
  // The disk comes back: the retry publishes.
  std::remove(dir.c_str());
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(shard->Poll(), 1);
  EXPECT_EQ(sink->rounds, (std::vector<uint64_t>{0}));
  EXPECT_EQ(shard->UpdateHeld(), "");
}

class RecordingObserver : public ShardObserver {
 public:
  void OnReseeded(const std::string& job, ReseedReason reason) override {
    reseeds.push_back(job + ":" + std::string(ReseedReasonName(reason)));
  }
  std::vector<std::string> reseeds;
};

TEST(JobShardReseedTest, ResumingWorkerReseedsALostShardAtItsAnchorRound) {
  // A shard that lost its state (restarted with no checkpoint) meets the
  // workers of a running CO2 job (max_staleness 1) holding A_6.
  common::FakeClock clock;
  RecordingObserver observer;
  JobShardOptions options;
  options.observer = &observer;
  options.reseed_reason = ReseedReason::kCorrupt;
  auto shard = *JobShard::Create("job", Config(2), options, &clock);
  auto a = shard->Join("a", Config(2), common::Codec::kFp32, 5);
  CO2_ASSERT_OK(a);
  EXPECT_TRUE(a->must_reseed);
  EXPECT_FALSE(a->must_seed);
  // Until a's anchor is in, other resuming workers wait and nothing counts.
  EXPECT_EQ(
      shard->Join("b", Config(2), common::Codec::kFp32, 5).status().code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(shard->Contribute("a", Contribution(5, 1.0f)).code(),
            absl::StatusCode::kUnavailable);
  CO2_ASSERT_OK(shard->SeedChunk("a", 0, 6, Fp32(10)));
  EXPECT_EQ(observer.reseeds, std::vector<std::string>{"job:corrupt"});
  EXPECT_EQ(shard->stats().reseeds, 1u);
  uint64_t anchor_round = 0;
  EXPECT_EQ(shard->AnchorForTesting(&anchor_round),
            std::vector<float>(kParams, 10.0f));
  EXPECT_EQ(anchor_round, 6u);

  // b joins now: the shard opens round 5 (whose update gives A_7) and has no
  // older update to replay.
  auto b = shard->Join("b", Config(2), common::Codec::kFp32, 5);
  CO2_ASSERT_OK(b);
  EXPECT_FALSE(b->must_reseed);
  EXPECT_EQ(b->open_round, 5u);
  EXPECT_EQ(b->oldest_update_round, 5u);
  // Rounds continue from there; momentum restarted from zero, so with
  // α = 1, β = 0 the update is exactly −mean Δ.
  auto sink = std::make_shared<RecordingSink>();
  CO2_EXPECT_OK(shard->Subscribe(sink, 5));
  CO2_ASSERT_OK(shard->Contribute("a", Contribution(5, 1.0f)));
  CO2_ASSERT_OK(shard->Contribute("b", Contribution(5, 3.0f)));
  EXPECT_EQ(shard->Poll(), 1);
  EXPECT_EQ(sink->rounds, std::vector<uint64_t>{5});
  EXPECT_EQ(shard->AnchorForTesting(&anchor_round),
            std::vector<float>(kParams, 8.0f));
  EXPECT_EQ(anchor_round, 7u);
}

TEST(JobShardReseedTest, ReseedChunksMustAgreeOnTheRound) {
  common::FakeClock clock;
  auto shard = *JobShard::Create("job", Config(1), JobShardOptions{}, &clock);
  // A fresh seed is A_0.
  CO2_ASSERT_OK(shard->Join("fresh", Config(1), common::Codec::kFp32));
  EXPECT_EQ(shard->SeedChunk("fresh", 0, 3, Fp32(1)).code(),
            absl::StatusCode::kInvalidArgument);
  // A resuming worker takes the seed over from a fresh one that has not
  // finished: its anchor is the job's, the fresh worker's A_0 is not.
  auto resumed = shard->Join("w", Config(1), common::Codec::kFp32, 2);
  CO2_ASSERT_OK(resumed);
  EXPECT_TRUE(resumed->must_reseed);
  EXPECT_EQ(shard->SeedChunk("fresh", 0, 0, Fp32(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->stats().reseeds, 0u);
}

TEST(JobShardReseedTest, SynchronousJobReopensAtTheAnchorRound) {
  // max_staleness 0 (localsgd): the update of round r gives A_{r+1}, so a
  // worker holding A_4 resumes a shard that opens round 4.
  common::FakeClock clock;
  v1::JobConfig config = Config(1);
  config.set_max_staleness(0);
  auto shard = *JobShard::Create("job", config, JobShardOptions{}, &clock);
  ASSERT_TRUE(shard->Join("w", config, common::Codec::kFp32, 4)->must_reseed);
  CO2_ASSERT_OK(shard->SeedChunk("w", 0, 4, Fp32(2)));
  auto rejoined = shard->Join("w", config, common::Codec::kFp32, 4);
  CO2_ASSERT_OK(rejoined);
  EXPECT_FALSE(rejoined->must_reseed);
  EXPECT_EQ(rejoined->open_round, 4u);
  CO2_ASSERT_OK(shard->Contribute("w", Contribution(4, 0.5f)));
  EXPECT_EQ(shard->Poll(), 1);
  uint64_t anchor_round = 0;
  EXPECT_EQ(shard->AnchorForTesting(&anchor_round),
            std::vector<float>(kParams, 1.5f));
  EXPECT_EQ(anchor_round, 5u);
}

TEST(JobShardReseedTest, ReseededShardRestoresBeforeItClosesARound) {
  // The re-seeded state is checkpointed (the Seed is acknowledged once it is
  // durable); a restart before the next round closes restores it, with no
  // update to replay yet.
  common::FakeClock clock;
  const TempDir temp_dir("co2-shard");
  CheckpointStore store(temp_dir.path());
  JobShardOptions options;
  options.checkpoints = &store;
  {
    auto shard = *JobShard::Create("job", Config(1), options, &clock);
    ASSERT_TRUE(
        shard->Join("w", Config(1), common::Codec::kFp32, 8)->must_reseed);
    CO2_ASSERT_OK(shard->SeedChunk("w", 0, 9, Fp32(4)));
    EXPECT_EQ(shard->Poll(), 0);
    EXPECT_EQ(shard->stats().checkpoints_written, 1u);
  }
  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
  ASSERT_EQ(loaded.size(), 1u);
  auto restored = JobShard::Restore(std::move(loaded[0]), options, &clock);
  CO2_ASSERT_OK(restored);
  uint64_t anchor_round = 0;
  EXPECT_EQ((*restored)->AnchorForTesting(&anchor_round),
            std::vector<float>(kParams, 4.0f));
  EXPECT_EQ(anchor_round, 9u);
  auto rejoined = (*restored)->Join("w", Config(1), common::Codec::kFp32, 8);
  CO2_ASSERT_OK(rejoined);
  EXPECT_FALSE(rejoined->must_reseed);
  EXPECT_EQ(rejoined->open_round, 8u);
  EXPECT_EQ(rejoined->oldest_update_round, 8u);
}

}  // namespace
}  // namespace co2::server
