// KeptUpdate: one closed round's encoded outer update as a shard keeps it.
// In memory, as the messages the streams send, until its checkpoint is
// durable and it has been handed to the streams; from then on in that
// checkpoint (CheckpointedUpdate) when the shard has one, read back chunk by
// chunk when it is needed again: as the gap of the next step, for a worker that
// reconnects having missed it, and when a checkpoint is written again before
// the next round closes. Without checkpoints it stays in memory.
//
// A value type over shared immutable parts: copies are cheap and may be read
// from any thread; changing one (Store) is the owner's to serialise.
#ifndef CO2_SERVER_STORAGE_KEPT_UPDATE_H_
#define CO2_SERVER_STORAGE_KEPT_UPDATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "co2/v1/aggregator.pb.h"
#include "server/storage/checkpointed_update.h"
#include "server/storage/update_chunks.h"

namespace co2::server {

class KeptUpdate {
 public:
  // In memory; `chunks` has at least one chunk.
  explicit KeptUpdate(std::shared_ptr<const UpdateChunks> chunks);

  uint64_t round() const { return round_; }
  uint32_t contributors() const { return contributors_; }
  uint32_t num_chunks() const { return num_chunks_; }
  // The messages while in memory; null once stored.
  const std::shared_ptr<const UpdateChunks>& chunks() const { return chunks_; }

  // From now on read from `stored`, which holds the same payloads; the
  // messages are released (the streams sending them hold their own).
  void Store(std::shared_ptr<const CheckpointedUpdate> stored);

  size_t PayloadBytes(uint32_t chunk) const;
  // Chunk `chunk`'s OuterUpdate.anchor_digest.
  uint64_t AnchorDigest(uint32_t chunk) const;
  // Chunk `chunk`'s encoded payload: in place while in memory, else read
  // into `scratch`, which the view then points into. CheckpointedUpdate::Read's
  // errors.
  absl::StatusOr<std::string_view> Payload(uint32_t chunk,
                                           std::string* scratch) const;

  // The message that carries chunk `chunk`: the kept one, or, once stored,
  // one made again with the payload read back (CheckpointedUpdate::Read's
  // errors).
  absl::StatusOr<std::shared_ptr<const v1::OuterUpdate>> Chunk(
      uint32_t chunk) const;

 private:
  uint64_t round_;
  uint32_t contributors_;
  uint32_t num_chunks_;
  std::shared_ptr<const UpdateChunks> chunks_;  // null once stored
  std::shared_ptr<const CheckpointedUpdate> stored_;  // null while in memory
  // Once stored: chunk 0's message without its payload, the fields every
  // chunk's message shares, and every chunk's anchor digest.
  std::shared_ptr<const v1::OuterUpdate> fields_;
  std::shared_ptr<const std::vector<uint64_t>> digests_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_KEPT_UPDATE_H_
