#include "client/send_buffers.h"

#include <atomic>

#include "common/layout.h"

namespace co2::client {
namespace {

// Whether nobody but the owner holds `chunk`. The acquire fence pairs with
// the release in the last other owner's decrement, so that owner's reads of
// the bytes happen before the writes that follow.
bool Unshared(const std::shared_ptr<std::string>& chunk) {
  if (chunk.use_count() != 1) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

}  // namespace

SendBuffers::SendBuffers(common::Codec codec, size_t elements)
    : chunks_(common::NumChunks(elements)) {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    chunks_[i] = std::make_shared<std::string>(
        common::EncodedSize(codec, common::ChunkRange(elements, i).size()),
        '\0');
  }
}

std::vector<absl::Span<char>> SendBuffers::Writable() {
  std::vector<absl::Span<char>> spans;
  spans.reserve(chunks_.size());
  for (std::shared_ptr<std::string>& chunk : chunks_) {
    if (!Unshared(chunk)) {
      chunk = std::make_shared<std::string>(chunk->size(), '\0');
    }
    spans.push_back(absl::MakeSpan(chunk->data(), chunk->size()));
  }
  return spans;
}

}  // namespace co2::client
