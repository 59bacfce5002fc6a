#include "server/job/anchor_snapshot.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/layout.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

std::vector<float> Anchor(size_t n, float offset) {
  std::vector<float> anchor(n);
  for (size_t i = 0; i < n; ++i)
    anchor[i] = offset + 0.5f * static_cast<float>(i);
  return anchor;
}

// The snapshot's chunks, in order, are exactly `anchor`'s bytes.
void ExpectCarries(const AnchorSnapshot& snapshot,
                   const std::vector<float>& anchor, uint64_t anchor_round) {
  EXPECT_EQ(snapshot.anchor_round, anchor_round);
  ASSERT_EQ(snapshot.chunks.size(), common::NumChunks(anchor.size()));
  for (uint32_t i = 0; i < snapshot.chunks.size(); ++i) {
    const v1::AnchorChunk& chunk = snapshot.chunks[i];
    const common::Range r = common::ChunkRange(anchor.size(), i);
    EXPECT_EQ(chunk.anchor_round(), anchor_round);
    EXPECT_EQ(chunk.chunk_index(), i);
    ASSERT_EQ(chunk.payload().size(), r.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(chunk.payload().data(), anchor.data() + r.begin,
                          chunk.payload().size()),
              0)
        << "chunk " << i;
  }
}

TEST(AnchorSnapshotTest, CarriesTheAnchorChunkByChunk) {
  const std::vector<float> anchor =
      Anchor(2 * common::kChunkElements + 17, 1.0f);  // 3 chunks, 1 short
  ExpectCarries(*MakeAnchorSnapshot(5, anchor), anchor, 5);
}

TEST(AnchorSnapshotTest, AnEmptyRangeHasNoChunks) {
  EXPECT_TRUE(MakeAnchorSnapshot(0, {})->chunks.empty());
}

TEST(SharedAnchorSnapshotTest, FetchesShareOneSnapshotUntilReset) {
  SharedAnchorSnapshot shared;
  std::vector<float> anchor = Anchor(1000, 1.0f);
  const std::vector<float> first_anchor = anchor;
  std::shared_ptr<const AnchorSnapshot> first = shared.Get(3, anchor);
  EXPECT_EQ(shared.Get(3, anchor), first);
  // The anchor moves (a round closed): the next fetch gets the new one, the
  // snapshot already handed out is unchanged.
  anchor = Anchor(1000, 2.0f);
  shared.Reset();
  std::shared_ptr<const AnchorSnapshot> second = shared.Get(4, anchor);
  EXPECT_NE(second, first);
  ExpectCarries(*first, first_anchor, 3);
  ExpectCarries(*second, anchor, 4);
}

TEST(SharedAnchorSnapshotTest, ASnapshotNobodyHoldsIsMadeAgain) {
  SharedAnchorSnapshot shared;
  std::vector<float> anchor = Anchor(100, 1.0f);
  std::weak_ptr<const AnchorSnapshot> released = shared.Get(1, anchor);
  EXPECT_TRUE(released.expired()) << "the shared snapshot kept it alive";
  anchor = Anchor(100, 3.0f);
  ExpectCarries(*shared.Get(1, anchor), anchor, 1);
}

}  // namespace
}  // namespace co2::server
