#include "server/job/update_cache.h"

#include <memory>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/stored_chunks.h"

namespace co2::server {
namespace {

// The update of `round`, one chunk.
std::shared_ptr<const UpdateChunks> Update(uint64_t round) {
  auto message = std::make_shared<v1::OuterUpdate>();
  message->set_round(round);
  return std::make_shared<const UpdateChunks>(UpdateChunks{message});
}

std::vector<uint64_t> Rounds(
    const std::vector<std::shared_ptr<const UpdateChunks>>& updates) {
  std::vector<uint64_t> rounds;
  for (const auto& u : updates) rounds.push_back((*u)[0]->round());
  return rounds;
}
std::vector<uint64_t> Rounds(const std::vector<KeptUpdate>& updates) {
  std::vector<uint64_t> rounds;
  for (const auto& u : updates) rounds.push_back(u.round());
  return rounds;
}

// One round as JobShard runs it: room, the new update, its publication.
void CloseAndPublish(UpdateCache& cache, uint64_t round) {
  cache.MakeRoomForNext();
  cache.AddUnpublished(Update(round));
  EXPECT_EQ(Rounds(cache.Publish(nullptr)), std::vector<uint64_t>{round});
}

TEST(UpdateCacheTest, EmptyHoldsNothing) {
  UpdateCache cache(2);
  EXPECT_FALSE(cache.Last().has_value());
  EXPECT_EQ(cache.OldestRound(), std::nullopt);
  EXPECT_FALSE(cache.has_unpublished());
  EXPECT_TRUE(cache.PublishedSince(0).empty());
  EXPECT_TRUE(cache.Publish(nullptr).empty());
}

TEST(UpdateCacheTest, KeepsTheLastReplayRoundsInOrderDroppingTheOldest) {
  UpdateCache cache(3);  // max_staleness 2
  for (uint64_t r = 0; r < 6; ++r) {
    CloseAndPublish(cache, r);
    const uint64_t oldest = r < 2 ? 0 : r - 2;
    EXPECT_EQ(cache.OldestRound(), oldest) << "after round " << r;
    EXPECT_EQ(Rounds(cache.PublishedSince(0)).size(), r - oldest + 1);
  }
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(Rounds(cache.PublishedSince(4)), (std::vector<uint64_t>{4, 5}));
  EXPECT_TRUE(cache.PublishedSince(6).empty());
  EXPECT_EQ(cache.Last()->round(), 5u);
}

TEST(UpdateCacheTest, MakesRoomBeforeTheNextUpdateExists) {
  UpdateCache cache(2);
  CloseAndPublish(cache, 0);
  CloseAndPublish(cache, 1);
  cache.MakeRoomForNext();
  // Round 0 goes before round 2's update is built; round 1 (its gap) stays.
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), std::vector<uint64_t>{1});
  EXPECT_EQ(cache.Last()->round(), 1u);
}

TEST(UpdateCacheTest, UnpublishedUpdatesAreKeptButNotReplayed) {
  UpdateCache cache(2);
  CloseAndPublish(cache, 0);
  CloseAndPublish(cache, 1);
  // Two rounds close while their checkpoints fail: nothing is published.
  for (uint64_t r = 2; r < 4; ++r) {
    cache.MakeRoomForNext();
    cache.AddUnpublished(Update(r));
  }
  EXPECT_TRUE(cache.has_unpublished());
  EXPECT_TRUE(cache.PublishedSince(0).empty()) << "room made from published";
  EXPECT_EQ(cache.OldestRound(), 2u);
  EXPECT_EQ(cache.Last()->round(), 3u) << "the last, published or not";
  cache.MakeRoomForNext();
  EXPECT_EQ(cache.OldestRound(), 2u) << "an unpublished update was dropped";
  EXPECT_EQ(Rounds(cache.Publish(nullptr)), (std::vector<uint64_t>{2, 3}));
  EXPECT_FALSE(cache.has_unpublished());
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), (std::vector<uint64_t>{2, 3}));
}

std::vector<uint32_t> ChunkIndices(const UpdateChunks& chunks) {
  std::vector<uint32_t> indices;
  for (const auto& chunk : chunks) indices.push_back(chunk->chunk_index());
  return indices;
}

TEST(UpdateCacheTest, ChunksStreamedBeforeTheCloseStayReachableUntilPublished) {
  UpdateCache cache(2);
  CloseAndPublish(cache, 0);
  UpdateChunks round1;
  for (uint32_t c = 0; c < 3; ++c) {
    auto message = std::make_shared<v1::OuterUpdate>();
    message->set_round(1);
    message->set_chunk_index(c);
    round1.push_back(message);
  }
  cache.AddStreamed(round1[0]);
  cache.AddStreamed(round1[2]);
  EXPECT_EQ(ChunkIndices(cache.Streamed()), (std::vector<uint32_t>{0, 2}));
  EXPECT_TRUE(cache.StreamedUnpublishedSince(0).empty()) << "not closed yet";
  // Round 1 closes; its checkpoint is not durable yet.
  cache.MakeRoomForNext();
  cache.AddUnpublished(std::make_shared<const UpdateChunks>(round1));
  EXPECT_TRUE(cache.Streamed().empty());
  const auto streamed = cache.StreamedUnpublishedSince(1);
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(ChunkIndices(*streamed[0]), (std::vector<uint32_t>{0, 2}));
  EXPECT_TRUE(cache.StreamedUnpublishedSince(2).empty());
  const auto released = cache.Publish(nullptr);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(ChunkIndices(*released[0]), std::vector<uint32_t>{1})
      << "the streamed chunks are not sent again";
  EXPECT_TRUE(cache.StreamedUnpublishedSince(0).empty());
  EXPECT_EQ(Rounds(cache.PublishedSince(1)), std::vector<uint64_t>{1});
}

TEST(UpdateCacheTest, ARestoredUpdateIsReplayedAndIsTheLast) {
  UpdateCache cache(2);
  cache.AddPublished(Update(7));
  EXPECT_FALSE(cache.has_unpublished());
  EXPECT_EQ(Rounds(cache.PublishedSince(7)), std::vector<uint64_t>{7});
  EXPECT_EQ(cache.Last()->round(), 7u);
  CloseAndPublish(cache, 8);
  CloseAndPublish(cache, 9);
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), (std::vector<uint64_t>{8, 9}));
}

TEST(UpdateCacheTest, OneReplayRoundKeepsOnlyTheUnpublished) {
  UpdateCache cache(1);  // max_staleness 0
  CloseAndPublish(cache, 0);
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), std::vector<uint64_t>{0});
  cache.MakeRoomForNext();
  EXPECT_FALSE(cache.Last().has_value());
  cache.AddUnpublished(Update(1));
  EXPECT_EQ(Rounds(cache.Publish(nullptr)), std::vector<uint64_t>{1});
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), std::vector<uint64_t>{1});
}

TEST(UpdateCacheTest, APublishedUpdateIsKeptInItsCheckpointNotInMemory) {
  UpdateCache cache(2);
  cache.AddUnpublished(Update(0));
  EXPECT_TRUE(cache.Last()->chunks() != nullptr) << "unpublished: in memory";
  std::weak_ptr<const UpdateChunks> sent;
  {
    const auto released = cache.Publish(StoreChunks({"round 0"}));
    ASSERT_EQ(Rounds(released), std::vector<uint64_t>{0});
    sent = released[0];
  }
  EXPECT_TRUE(sent.expired()) << "only the streams held the messages";
  std::string scratch;
  auto payload = cache.Last()->Payload(0, &scratch);
  CO2_ASSERT_OK(payload);
  EXPECT_EQ(*payload, "round 0");
  EXPECT_EQ(Rounds(cache.PublishedSince(0)), std::vector<uint64_t>{0});
}

TEST(UpdateCacheTest, ACheckpointWrittenAgainMovesTheLastUpdateToIt) {
  UpdateCache cache(2);
  cache.AddUnpublished(Update(0));
  cache.Publish(StoreChunks({"first file"}));
  cache.MakeRoomForNext();
  cache.AddUnpublished(Update(1));
  cache.Publish(StoreChunks({"round 1"}));
  // Membership changed: the checkpoint is written again with the same last
  // update, and nothing is published.
  EXPECT_TRUE(cache.Publish(StoreChunks({"round 1, again"})).empty());
  std::string scratch;
  const std::vector<KeptUpdate> kept = cache.PublishedSince(0);
  ASSERT_EQ(Rounds(kept), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(*kept[0].Payload(0, &scratch), "first file");
  EXPECT_EQ(*kept[1].Payload(0, &scratch), "round 1, again");
}

TEST(UpdateCacheTest, WithoutACheckpointPublishedUpdatesStayInMemory) {
  UpdateCache cache(2);
  CloseAndPublish(cache, 0);
  CloseAndPublish(cache, 1);
  for (const KeptUpdate& kept : cache.PublishedSince(0)) {
    EXPECT_NE(kept.chunks(), nullptr) << "round " << kept.round();
  }
}

}  // namespace
}  // namespace co2::server
