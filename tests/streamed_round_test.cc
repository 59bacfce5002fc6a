#include "server/job/streamed_round.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/fnv_hash.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

constexpr size_t kElements = 2 * common::kChunkElements + 100;  // 3 chunks

std::vector<float> ChunkOf(const std::vector<float>& v, uint32_t c) {
  const common::Range r = common::ChunkRange(v.size(), c);
  return std::vector<float>(v.begin() + r.begin, v.begin() + r.end);
}

// A round whose chunk 1 is streamed ahead of its close, the rest stepped at
// it: the update holds every chunk in order, each message made with the
// contributors it was stepped with; the anchor the round started from is
// kept for the streamed chunk when asked, and none is active after.
TEST(StreamedRoundTest, StreamsAChunkAheadAndClosesWithTheWholeUpdate) {
  v1::JobConfig config = common::DefaultJobConfig(kElements, 1);
  config.set_max_staleness(1);
  const ShardStepConfig step(config, kElements);
  const UpdateMessages messages(config, step.num_chunks());
  std::vector<float> anchor(kElements, 1.0f), momentum(kElements, 0.0f);
  const std::vector<float> start = anchor;
  StreamedRound streamed(step, messages);
  EXPECT_FALSE(streamed.active());
  EXPECT_TRUE(streamed.StartAnchorWhole());

  streamed.Begin(5, std::nullopt,
                 {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
  ASSERT_TRUE(streamed.active());
  EXPECT_EQ(streamed.round(), 5u);
  std::vector<float> mean1(ChunkOf(anchor, 1).size(), 0.5f);
  auto sent = streamed.Step(1, mean1, /*contributors=*/3, /*held_out=*/{},
                            /*keep_start=*/true);
  EXPECT_TRUE(mean1.empty()) << "the mean is freed";
  EXPECT_TRUE(streamed.stepped(1));
  EXPECT_FALSE(streamed.stepped(0));
  EXPECT_EQ(sent->round(), 5u);
  EXPECT_EQ(sent->anchor_round(), 7u);
  EXPECT_EQ(sent->chunk_index(), 1u);
  EXPECT_EQ(sent->contributors(), 3u);
  EXPECT_NE(ChunkOf(anchor, 1), ChunkOf(start, 1)) << "chunk 1 was stepped";
  EXPECT_TRUE(streamed.StartAnchorWhole());
  ASSERT_EQ(streamed.start_anchor().size(), 3u);
  EXPECT_EQ(streamed.start_anchor()[1], ChunkOf(start, 1));
  EXPECT_TRUE(streamed.start_anchor()[0].empty());

  ClosedRound closed;
  closed.round = 5;
  closed.contributors = 2;
  closed.mean.resize(3);
  closed.mean[0].assign(ChunkOf(anchor, 0).size(), 0.5f);
  closed.mean[2].assign(ChunkOf(anchor, 2).size(), 0.5f);
  StreamedRound::Closed result = streamed.Close(closed);
  EXPECT_FALSE(streamed.active());
  EXPECT_TRUE(streamed.start_anchor().empty());
  ASSERT_EQ(result.update->size(), 3u);
  for (uint32_t c = 0; c < 3; ++c) {
    const v1::OuterUpdate& m = *(*result.update)[c];
    EXPECT_EQ(m.chunk_index(), c);
    EXPECT_EQ(m.round(), 5u);
    EXPECT_EQ(m.contributors(), c == 1 ? 3u : 2u) << c;
  }
  EXPECT_EQ((*result.update)[1], sent) << "the streamed message is kept";
  // Every chunk, the short tail included, took the same step from the same
  // start, and each message carries that chunk's update: the start plus
  // the decoded payload is the chunk's new anchor, whose digest it names.
  const float stepped = anchor[0];
  EXPECT_NE(stepped, 1.0f);
  for (uint32_t c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    const std::vector<float> now = ChunkOf(anchor, c);
    EXPECT_EQ(now, std::vector<float>(now.size(), stepped));
    const v1::OuterUpdate& m = *(*result.update)[c];
    ASSERT_EQ(m.payload().size(), now.size() * sizeof(float));
    std::vector<float> update(now.size());
    common::Decode(common::Codec::kFp32, m.payload(), absl::MakeSpan(update));
    const std::vector<float> from = ChunkOf(start, c);
    for (size_t i = 0; i < now.size(); ++i) {
      ASSERT_EQ(from[i] + update[i], now[i]) << "element " << i;
    }
    EXPECT_EQ(m.anchor_digest(), common::AnchorDigest(now));
  }
  EXPECT_EQ(ChunkOf(anchor, 2).size(), 100u) << "the tail chunk is short";
}

// Without keep_start a stepped chunk's start anchor is unknown: a fetch
// must wait for the round's close.
TEST(StreamedRoundTest, AChunkSteppedWithoutKeepingItsStartIsNotWhole) {
  const v1::JobConfig config = common::DefaultJobConfig(kElements, 1);
  const ShardStepConfig step(config, kElements);
  const UpdateMessages messages(config, step.num_chunks());
  std::vector<float> anchor(kElements, 1.0f), momentum(kElements, 0.0f);
  StreamedRound streamed(step, messages);
  streamed.Begin(0, std::nullopt,
                 {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
  EXPECT_TRUE(streamed.StartAnchorWhole()) << "nothing stepped yet";
  std::vector<float> mean(common::kChunkElements, 0.5f);
  streamed.Step(0, mean, 1, /*held_out=*/{}, /*keep_start=*/false);
  EXPECT_FALSE(streamed.StartAnchorWhole());
}

}  // namespace
}  // namespace co2::server
