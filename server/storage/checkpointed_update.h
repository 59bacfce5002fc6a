// CheckpointedUpdate: the encoded chunks of one round's outer update inside a
// durable checkpoint file, read back through a descriptor of that file. The
// descriptor keeps what it reads unchanged when a later checkpoint replaces
// the file (renames over it): the replaced file's blocks stay allocated until
// its last CheckpointedUpdate is destroyed, which closes the descriptor.
//
// It lets a shard keep an update it has already sent on disk instead of in
// memory (server/storage/kept_update.h). Immutable; any thread (positional
// reads).
#ifndef CO2_SERVER_STORAGE_CHECKPOINTED_UPDATE_H_
#define CO2_SERVER_STORAGE_CHECKPOINTED_UPDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace co2::server {

class CheckpointedUpdate {
 public:
  // Takes `fd` (open for reading). Chunk i is `sizes[i]` bytes, the chunks
  // back to back from byte `first_offset` of the file at `path` (named in
  // errors only).
  CheckpointedUpdate(int fd, std::string path, uint64_t first_offset,
               const std::vector<uint32_t>& sizes);
  ~CheckpointedUpdate();
  CheckpointedUpdate(const CheckpointedUpdate&) = delete;
  CheckpointedUpdate& operator=(const CheckpointedUpdate&) = delete;

  const std::string& path() const { return path_; }
  uint32_t num_chunks() const { return static_cast<uint32_t>(sizes_.size()); }
  uint32_t chunk_bytes(uint32_t chunk) const { return sizes_[chunk]; }

  // Chunk `chunk`'s bytes into `out` (resized to chunk_bytes). UNAVAILABLE
  // naming the file and the errno text if a read fails; DATA_LOSS if the file
  // ends before the chunk does (something truncated it).
  absl::Status Read(uint32_t chunk, std::string* out) const;

 private:
  const int fd_;
  const std::string path_;
  std::vector<uint64_t> offsets_;
  const std::vector<uint32_t> sizes_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_CHECKPOINTED_UPDATE_H_
