// CheckpointStore: durable shard state on local disk. One file per (job,
// shard): <dir>/<job>.shard-<i>-of-<S>.ckpt, written atomically (temp file,
// fsync, rename, fsync of the directory) and checksummed (CRC-32 over the
// whole file), so a crash leaves either the old or the new checkpoint, and a
// torn or corrupted file is detected on load (DATA_LOSS) instead of used.
//
// File: "CO2CKPT1" | u32 header length | ShardCheckpointHeader | anchor fp32 |
// momentum fp32 | encoded last update chunks | the chunks of the earlier
// updates kept for replay, oldest first | u32 CRC-32 of all before it.
//
// Write hands back the update it wrote as a CheckpointedUpdate: read through
// the file's descriptor, it outlives the file being replaced by the next
// checkpoint (server/storage/kept_update.h keeps sent updates there, not in
// memory).
//
// Thread-safe (no shared mutable state); Write is called from the aggregator
// poller thread, never from gRPC reactions.
#ifndef CO2_SERVER_STORAGE_CHECKPOINT_STORE_H_
#define CO2_SERVER_STORAGE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "co2/v1/checkpoint.pb.h"
#include "server/storage/checkpointed_update.h"
#include "server/storage/kept_update.h"

namespace co2::server {

// What a checkpoint holds, as spans into the live state (Write) or owned
// vectors (Load).
struct CheckpointView {
  const v1::ShardCheckpointHeader* header =
      nullptr;  // update sizes filled in by Write
  absl::Span<const float> anchor;
  absl::Span<const float> momentum;
  // The last update, read chunk by chunk; null before the first round closed.
  const KeptUpdate* update = nullptr;
  // The updates before it that the shard keeps for replay, oldest first.
  std::vector<const KeptUpdate*> earlier_updates;
};

// A checkpoint file that could not be used.
struct UnusableCheckpoint {
  std::string path;
  absl::Status error;  // DATA_LOSS (or the I/O error) saying what was wrong
};

struct LoadedCheckpoint {
  v1::ShardCheckpointHeader header;
  std::vector<float> anchor;
  std::vector<float> momentum;
  std::vector<std::string> update_chunks;
  // The chunks of each of header.earlier_updates, in its order.
  std::vector<std::vector<std::string>> earlier_update_chunks;
};

class CheckpointStore {
 public:
  // `dir` is created if missing, with its missing parents.
  explicit CheckpointStore(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }

  // Atomically replaces the checkpoint of (header.job, header.shard_index)
  // and returns the update it wrote, readable from the file (null if the
  // view has none). RESOURCE_EXHAUSTED when the disk is full,
  // UNAVAILABLE/INTERNAL for other I/O errors; the message names the file and
  // the errno text; a stored update that cannot be read back fails the write
  // with its error. A failed write leaves the previous checkpoint intact.
  absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>> Write(
      const CheckpointView& view) const;

  // Every checkpoint file of shard `shard_index` of `num_shards` in the
  // directory, loaded and verified. Files that fail verification are skipped
  // and reported in `unusable` (DATA_LOSS naming the file and what was wrong).
  std::vector<LoadedCheckpoint> LoadAll(
      uint32_t shard_index, uint32_t num_shards,
      std::vector<UnusableCheckpoint>* unusable) const;

  // Renames an unusable checkpoint file to "<path>.corrupt-<unix ms>": kept
  // for inspection, never loaded again, and out of the way of the job's next
  // checkpoint. Returns the new path; UNAVAILABLE naming both paths and the
  // errno text if the rename fails.
  static absl::StatusOr<std::string> SetAside(const std::string& path);

  // Loads and verifies one file.
  static absl::StatusOr<LoadedCheckpoint> Load(const std::string& path);

  // The file of (job, shard); job names are escaped to stay one path element.
  std::string PathFor(const std::string& job, uint32_t shard_index,
                      uint32_t num_shards) const;
  // The round journal beside it (server/job/round_journal.h): "<PathFor>.journal",
  // which LoadAll does not take for a checkpoint.
  std::string JournalPathFor(const std::string& job, uint32_t shard_index,
                             uint32_t num_shards) const;

 private:
  std::string dir_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_CHECKPOINT_STORE_H_
