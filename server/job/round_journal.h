// RoundJournal: the chunks of the open round that a shard with checkpoints
// steps and sends before the round closes. A shard releases an update only
// once the state it leaves is durable, and a round's checkpoint is written at
// its close; so each chunk stepped ahead of that is appended here first, with
// what its step changed (its chunk of A and of m, and its encoded update) and
// who sent it, and the file is synced before the chunk's update goes out. A
// restarted shard restores its checkpoint, then the journal's chunks of the
// round that checkpoint opens (JobShard::Restore).
//
// File (CheckpointStore::JournalPathFor), records back to back, each:
//   u32 header length | JournalChunkHeader | A chunk (fp32) |
//   m chunk (fp32; none with β = 0) | encoded update | u32 CRC-32 of the
//   record before it.
// It holds one round: appending a chunk of another round empties it first,
// and a shard empties it once a checkpoint holds everything in it. Loading
// stops at the first record that is cut short or fails its CRC: it was not
// synced, so its update was never sent.
//
// Not thread-safe: one owner (the shard's poller thread). The spans a chunk
// borrows must not change during Append.
#ifndef CO2_SERVER_JOB_ROUND_JOURNAL_H_
#define CO2_SERVER_JOB_ROUND_JOURNAL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "co2/v1/checkpoint.pb.h"
#include "server/job/round_state.h"

namespace co2::server {

// One stepped chunk, as the journal takes it.
struct JournalChunk {
  uint32_t chunk_index = 0;
  uint32_t contributors = 0;  // on its update's message
  std::vector<ChunkSender> senders;
  absl::Span<const float> anchor;    // after the step
  absl::Span<const float> momentum;  // after the step; empty with β = 0
  std::string_view update;           // the encoded update chunk
};

// One chunk read back.
struct LoadedJournalChunk {
  v1::JournalChunkHeader header;
  std::vector<float> anchor;
  std::vector<float> momentum;
  std::string update;
};

class RoundJournal {
 public:
  // Nothing is opened or created before the first Append.
  explicit RoundJournal(std::string path);
  ~RoundJournal();
  RoundJournal(const RoundJournal&) = delete;
  RoundJournal& operator=(const RoundJournal&) = delete;

  const std::string& path() const { return path_; }

  // Appends `chunks` of `round` (emptying the file first if it holds another
  // round) and syncs the file. On failure (the status names the file and the
  // errno text; RESOURCE_EXHAUSTED for a full disk) the journal is left as
  // it was synced, save perhaps a record cut short, which Load ignores; the
  // owner must not append to this round again.
  absl::Status Append(uint64_t round, absl::Span<const JournalChunk> chunks);
  // Removes the file, if there is one: a checkpoint now holds its chunks
  // (the next Append creates it again).
  absl::Status Clear();

  // The chunks of `round` in the journal at `path`, in the order appended;
  // none if there is no file or it holds another round. A record past the
  // last whole one is ignored (logged).
  static absl::StatusOr<std::vector<LoadedJournalChunk>> Load(
      const std::string& path, uint64_t round);

 private:
  absl::Status Open();
  absl::Status Truncate();

  const std::string path_;
  int fd_ = -1;
  bool empty_ = true;   // as far as this object knows: nothing appended
  uint64_t round_ = 0;  // of the chunks in the file, unless empty_
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_ROUND_JOURNAL_H_
