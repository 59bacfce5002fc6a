#include "server/job/anchor_snapshot.h"

#include <string>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"

namespace co2::server {

std::shared_ptr<const AnchorSnapshot> MakeAnchorSnapshot(
    uint64_t anchor_round, absl::Span<const float> anchor,
    absl::Span<const std::vector<float>> unstepped) {
  const uint32_t num_chunks =
      static_cast<uint32_t>(common::NumChunks(anchor.size()));
  auto snapshot = std::make_shared<AnchorSnapshot>();
  snapshot->anchor_round = anchor_round;
  snapshot->chunks.resize(num_chunks);
  for (uint32_t i = 0; i < num_chunks; ++i) {
    const common::Range chunk = common::ChunkRange(anchor.size(), i);
    v1::AnchorChunk& message = snapshot->chunks[i];
    message.set_anchor_round(anchor_round);
    message.set_chunk_index(i);
    std::string* bytes = message.mutable_payload();
    bytes->resize(chunk.size() * sizeof(float));
    const bool moved = i < unstepped.size() && !unstepped[i].empty();
    common::Encode(common::Codec::kFp32,
                   moved ? absl::MakeConstSpan(unstepped[i])
                         : anchor.subspan(chunk.begin, chunk.size()),
                   absl::MakeSpan(bytes->data(), bytes->size()));
  }
  return snapshot;
}

std::shared_ptr<const AnchorSnapshot> SharedAnchorSnapshot::Get(
    uint64_t anchor_round, absl::Span<const float> anchor,
    absl::Span<const std::vector<float>> unstepped) {
  std::shared_ptr<const AnchorSnapshot> snapshot = snapshot_.lock();
  if (snapshot == nullptr) {
    snapshot = MakeAnchorSnapshot(anchor_round, anchor, unstepped);
    snapshot_ = snapshot;
  }
  return snapshot;
}

}  // namespace co2::server
