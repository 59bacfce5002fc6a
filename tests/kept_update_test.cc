#include "server/storage/kept_update.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/stored_chunks.h"

namespace co2::server {
namespace {

std::shared_ptr<const v1::OuterUpdate> Message(uint64_t round, uint32_t chunk,
                                               std::string payload) {
  auto message = std::make_shared<v1::OuterUpdate>();
  message->set_round(round);
  message->set_chunk_index(chunk);
  message->set_contributors(3);
  message->set_payload(std::move(payload));
  message->set_anchor_digest(1000 + chunk);
  return message;
}

std::shared_ptr<const UpdateChunks> Chunks(
    uint64_t round, const std::vector<std::string>& payloads) {
  auto chunks = std::make_shared<UpdateChunks>();
  for (uint32_t i = 0; i < payloads.size(); ++i) {
    chunks->push_back(Message(round, i, payloads[i]));
  }
  return chunks;
}

TEST(KeptUpdateTest, InMemoryItReadsTheMessagesInPlace) {
  auto chunks = Chunks(6, {"abc", "defg"});
  KeptUpdate kept(chunks);
  EXPECT_EQ(kept.round(), 6u);
  EXPECT_EQ(kept.contributors(), 3u);
  EXPECT_EQ(kept.num_chunks(), 2u);
  EXPECT_EQ(kept.PayloadBytes(1), 4u);
  std::string scratch;
  auto payload = kept.Payload(1, &scratch);
  CO2_ASSERT_OK(payload);
  EXPECT_EQ(payload->data(), (*chunks)[1]->payload().data()) << "not copied";
  auto chunk = kept.Chunk(1);
  CO2_ASSERT_OK(chunk);
  EXPECT_EQ(*chunk, (*chunks)[1]) << "the kept message itself";
}

TEST(KeptUpdateTest, StoredItReleasesTheMessagesAndReadsTheFile) {
  auto chunks = Chunks(6, {"abc", "defg"});
  std::weak_ptr<const UpdateChunks> weak = chunks;
  KeptUpdate kept(std::move(chunks));
  kept.Store(StoreChunks({"abc", "defg"}));
  EXPECT_EQ(kept.chunks(), nullptr);
  EXPECT_TRUE(weak.expired()) << "the messages are no longer held";
  EXPECT_EQ(kept.round(), 6u);
  EXPECT_EQ(kept.contributors(), 3u);
  EXPECT_EQ(kept.PayloadBytes(1), 4u);
  std::string scratch;
  auto payload = kept.Payload(1, &scratch);
  CO2_ASSERT_OK(payload);
  EXPECT_EQ(*payload, "defg");
  for (uint32_t c = 0; c < 2; ++c) {
    auto chunk = kept.Chunk(c);
    CO2_ASSERT_OK(chunk);
    EXPECT_EQ((*chunk)->round(), 6u);
    EXPECT_EQ((*chunk)->contributors(), 3u);
    EXPECT_EQ((*chunk)->chunk_index(), c);
    EXPECT_EQ((*chunk)->payload(), c == 0 ? "abc" : "defg");
    EXPECT_EQ((*chunk)->anchor_digest(), 1000u + c);
    EXPECT_EQ(kept.AnchorDigest(c), 1000u + c);
  }
}

TEST(KeptUpdateTest, AStoredChunkThatCannotBeReadIsAnError) {
  std::string path;
  KeptUpdate kept(Chunks(2, {"abc", "defg"}));
  kept.Store(StoreChunks({"abc", "defg"}, &path, /*keep_file=*/true));
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  std::string scratch;
  EXPECT_EQ(kept.Payload(0, &scratch).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(kept.Chunk(1).status().code(), absl::StatusCode::kDataLoss);
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace co2::server
