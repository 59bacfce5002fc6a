// The state of one JobShard in and out of a checkpoint file
// (server/storage/checkpoint_store.h): the numerical state written from spans
// into the live shard, and a loaded checkpoint checked against the shard it is
// restored into, its last update rebuilt as the messages workers replay.
// Membership and the round are the header's, built by the shard itself.
//
// Stateless functions; any thread. The buffers they borrow must not change
// during the call.
#ifndef CO2_SERVER_JOB_CHECKPOINT_STATE_H_
#define CO2_SERVER_JOB_CHECKPOINT_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "co2/v1/checkpoint.pb.h"
#include "common/layout.h"
#include "server/job/chunked_outer_step.h"
#include "server/job/round_journal.h"
#include "server/job/update_messages.h"
#include "server/storage/checkpoint_store.h"
#include "server/storage/checkpointed_update.h"
#include "server/storage/kept_update.h"

namespace co2::server {

// Writes `header` with A, m, the last update (none before the first round
// closed) and the earlier updates kept for replay (oldest first). An empty
// `momentum` (β = 0 keeps none) is written as zeros that cost no memory.
// RESOURCE_EXHAUSTED if those cannot be mapped; else what
// CheckpointStore::Write returns: the last update as written, readable from
// the file.
absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>> WriteShardCheckpoint(
    const CheckpointStore& store, const v1::ShardCheckpointHeader& header,
    absl::Span<const float> anchor, absl::Span<const float> momentum,
    const KeptUpdate* last_update,
    std::vector<const KeptUpdate*> earlier_updates = {});

// DATA_LOSS "checkpoint of job "<job>": <what>".
absl::Status CheckpointDataLoss(const std::string& job,
                                const std::string& what);

// DATA_LOSS when `checkpoint` does not fit shard `shard_index`, which owns
// `range` in `num_chunks` chunks: another range, vectors of another size,
// or update chunks of another count (of the last or an earlier update).
absl::Status CheckCheckpointFits(const LoadedCheckpoint& checkpoint,
                                 common::Range range, uint32_t shard_index,
                                 uint32_t num_chunks);

// The update of the checkpoint's last closed round (it must have one and
// fit, see CheckCheckpointFits), its chunks (of the range `step` steps)
// moved out of `checkpoint` into the messages `messages` makes. DATA_LOSS
// for a chunk that is not a valid encoding.
absl::StatusOr<std::shared_ptr<const UpdateChunks>> RestoreLastUpdate(
    LoadedCheckpoint& checkpoint, const ShardStepConfig& step,
    const UpdateMessages& messages);
// The same for the earlier updates the checkpoint keeps for replay, oldest
// first (none in a checkpoint that keeps only the last).
absl::StatusOr<std::vector<std::shared_ptr<const UpdateChunks>>>
RestoreEarlierUpdates(LoadedCheckpoint& checkpoint, const ShardStepConfig& step,
                      const UpdateMessages& messages);

// DATA_LOSS "round journal <path>: chunk <i>: <what>".
absl::Status JournalDataLoss(const std::string& path, uint32_t chunk_index,
                             const std::string& what);

// JournalDataLoss when a journal chunk does not fit the shard `step` steps: a
// chunk index out of range, an anchor or momentum of another size (`momentum`:
// whether the shard keeps m), or an update that is not a valid encoding in the
// job's downlink codec.
absl::Status CheckJournalChunkFits(const LoadedJournalChunk& chunk,
                                   const ShardStepConfig& step, bool momentum,
                                   const std::string& path);

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CHECKPOINT_STATE_H_
