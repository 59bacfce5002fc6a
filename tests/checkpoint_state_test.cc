#include "server/job/checkpoint_state.h"

#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

using ::co2::testing::TempDir;

constexpr size_t kElements = common::kChunkElements + 100;  // 2 chunks

v1::ShardCheckpointHeader Header(v1::Codec downlink, uint64_t rounds_closed) {
  v1::ShardCheckpointHeader h;
  h.set_job("job");
  h.set_shard_index(0);
  *h.mutable_config() = common::DefaultJobConfig(kElements, 1);
  h.mutable_config()->set_downlink_codec(downlink);
  h.set_range_begin(0);
  h.set_range_end(kElements);
  h.set_rounds_closed(rounds_closed);
  h.set_update_contributors(3);
  return h;
}

// The update of round 4 in `codec`, chunk c holding c + 0.5 everywhere.
UpdateChunks Update(const ShardStepConfig& step, common::Codec codec) {
  const UpdateMessages messages(
      Header(v1::Codec(static_cast<int>(codec)), 5).config(),
      step.num_chunks());
  UpdateChunks update;
  for (uint32_t c = 0; c < step.num_chunks(); ++c) {
    const common::Range r = common::ChunkRange(kElements, c);
    std::vector<float> values(r.size(), c + 0.5f);
    std::string bytes(common::EncodedSize(codec, r.size()), '\0');
    common::Encode(codec, values, absl::MakeSpan(bytes.data(), bytes.size()));
    update.push_back(messages.Make(4, c, 3, bytes, 100 + c));
  }
  return update;
}

TEST(CheckpointStateTest, WritesZeroMomentumAndRestoresTheLastUpdate) {
  const TempDir temp_dir("co2-shard-checkpoint");
  CheckpointStore store(temp_dir.path());
  const v1::ShardCheckpointHeader header = Header(v1::CODEC_BF16, 5);
  const ShardStepConfig step(header.config(), kElements);
  const UpdateChunks update = Update(step, common::Codec::kBf16);
  const KeptUpdate kept(std::make_shared<const UpdateChunks>(update));
  std::vector<float> anchor(kElements, 2.0f);
  CO2_ASSERT_OK(WriteShardCheckpoint(store, header, anchor, {}, &kept));

  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
  ASSERT_EQ(loaded.size(), 1u);
  LoadedCheckpoint& checkpoint = loaded[0];
  EXPECT_EQ(checkpoint.anchor, anchor);
  EXPECT_EQ(checkpoint.momentum, std::vector<float>(kElements, 0.0f))
      << "β = 0 keeps no m; zeros are written in its place";
  CO2_ASSERT_OK(CheckCheckpointFits(checkpoint, common::Range{0, kElements}, 0,
                                    step.num_chunks()));
  auto restored = RestoreLastUpdate(
      checkpoint, step, UpdateMessages(header.config(), step.num_chunks()));
  CO2_ASSERT_OK(restored);
  ASSERT_EQ((*restored)->size(), update.size());
  for (uint32_t c = 0; c < update.size(); ++c) {
    const v1::OuterUpdate& m = *(**restored)[c];
    EXPECT_EQ(m.round(), 4u) << "rounds_closed − 1";
    EXPECT_EQ(m.anchor_round(), update[c]->anchor_round());
    EXPECT_EQ(m.chunk_index(), c);
    EXPECT_EQ(m.contributors(), 3u);
    EXPECT_EQ(m.payload(), update[c]->payload());
    EXPECT_EQ(m.anchor_digest(), 100u + c) << "kept in the checkpoint";
  }
}

TEST(CheckpointStateTest, WritesTheMomentumItIsGiven) {
  const TempDir temp_dir("co2-shard-checkpoint");
  CheckpointStore store(temp_dir.path());
  const v1::ShardCheckpointHeader header = Header(v1::CODEC_FP32, 0);
  std::vector<float> anchor(kElements, 1.0f), momentum(kElements, -3.0f);
  CO2_ASSERT_OK(WriteShardCheckpoint(store, header, anchor, momentum, nullptr));
  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> loaded = store.LoadAll(0, 1, &errors);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].momentum, momentum);
  EXPECT_TRUE(loaded[0].update_chunks.empty());
}

LoadedCheckpoint Loaded(uint64_t rounds_closed, size_t update_chunks) {
  LoadedCheckpoint c;
  c.header = Header(v1::CODEC_FP32, rounds_closed);
  c.anchor.resize(kElements);
  c.momentum.resize(kElements);
  c.update_chunks.resize(update_chunks);
  return c;
}

TEST(CheckpointStateTest, RefusesACheckpointOfAnotherShape) {
  const common::Range range{0, kElements};
  CO2_EXPECT_OK(CheckCheckpointFits(Loaded(5, 2), range, 0, 2));
  CO2_EXPECT_OK(CheckCheckpointFits(Loaded(5, 0), range, 0, 2));
  // Re-seeded, no round closed since: no update.
  CO2_EXPECT_OK(CheckCheckpointFits(Loaded(0, 0), range, 0, 2));
  absl::Status s = CheckCheckpointFits(Loaded(0, 2), range, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "checkpoint of job \"job\": has 2 update chunks, expected 0");
  s = CheckCheckpointFits(Loaded(5, 1), range, 0, 2);
  EXPECT_EQ(s.message(),
            "checkpoint of job \"job\": has 1 update chunks, expected 2");
  s = CheckCheckpointFits(Loaded(5, 2), common::Range{8, kElements + 8}, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(absl::StrCat("covers [0, ", kElements,
                                          ") but shard 1 owns [8, ")),
            std::string::npos)
      << s;
  LoadedCheckpoint short_anchor = Loaded(5, 2);
  short_anchor.anchor.pop_back();
  EXPECT_EQ(CheckCheckpointFits(short_anchor, range, 0, 2).code(),
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointStateTest, RefusesAnUpdateChunkThatIsNotAnEncoding) {
  LoadedCheckpoint checkpoint = Loaded(5, 2);
  checkpoint.update_chunks[1] = "short";
  const ShardStepConfig step(checkpoint.header.config(), kElements);
  auto restored = RestoreLastUpdate(
      checkpoint, step,
      UpdateMessages(checkpoint.header.config(), step.num_chunks()));
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(restored.status().message().rfind("checkpoint of job \"job\": ", 0),
            0u)
      << restored.status();
}

}  // namespace
}  // namespace co2::server
