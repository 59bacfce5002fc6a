#include "client/send_buffers.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/layout.h"
#include "gtest/gtest.h"

namespace co2::client {
namespace {

TEST(SendBuffersTest, ChunksAreSizedForTheCodec) {
  const size_t elements = 2 * common::kChunkElements + 5;
  SendBuffers buffers(common::Codec::kBf16, elements);
  ASSERT_EQ(buffers.size(), 3u);
  const std::vector<absl::Span<char>> spans = buffers.Writable();
  ASSERT_EQ(spans.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(spans[i].size(),
              common::EncodedSize(common::Codec::kBf16,
                                  common::ChunkRange(elements, i).size()));
    EXPECT_EQ(buffers.Lend(i)->size(), spans[i].size());
  }
}

TEST(SendBuffersTest, ChunksNobodyHoldsAreReused) {
  SendBuffers buffers(common::Codec::kFp32, 3 * common::kChunkElements);
  const std::vector<absl::Span<char>> first = buffers.Writable();
  // Lent and released again, as when gRPC has sent the bytes.
  for (size_t i = 0; i < buffers.size(); ++i) (void)buffers.Lend(i);
  const std::vector<absl::Span<char>> second = buffers.Writable();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].data(), second[i].data()) << "chunk " << i;
  }
}

TEST(SendBuffersTest, AChunkStillLentIsNotWrittenInto) {
  SendBuffers buffers(common::Codec::kFp32, 2 * common::kChunkElements);
  std::vector<absl::Span<char>> spans = buffers.Writable();
  std::fill(spans[1].begin(), spans[1].end(), 'a');
  // gRPC still holds chunk 1 of the last contribution.
  std::shared_ptr<const std::string> held = buffers.Lend(1);
  const std::vector<absl::Span<char>> next = buffers.Writable();
  EXPECT_EQ(next[0].data(), spans[0].data());
  EXPECT_NE(next[1].data(), held->data());
  EXPECT_EQ(next[1].size(), held->size());
  std::fill(next[1].begin(), next[1].end(), 'b');
  EXPECT_EQ(*held, std::string(held->size(), 'a'));
  // The replacement is what is lent from now on.
  EXPECT_EQ(buffers.Lend(1)->data(), next[1].data());
}

}  // namespace
}  // namespace co2::client
