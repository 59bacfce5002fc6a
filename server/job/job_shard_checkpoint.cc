// JobShard's checkpoint side: restoring a shard from its checkpoint, and
// what a checkpoint of the live state holds. The rest of the class is in
// job_shard.cc, job_shard_join.cc and job_shard_publish.cc.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/fnv_hash.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job/checkpoint_state.h"
#include "server/job/job_shard.h"

namespace co2::server {

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Restore(
    LoadedCheckpoint checkpoint, const JobShardOptions& options,
    common::Clock* clock) {
  const v1::ShardCheckpointHeader& h = checkpoint.header;
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<JobShard> shard,
      Build(h.job(), h.config(), options, clock, h.rounds_closed()));
  CO2_RETURN_IF_ERROR(CheckCheckpointFits(
      checkpoint, shard->range_, options.shard_index, shard->num_chunks()));
  absl::MutexLock lock(&shard->mu_);
  shard->anchor_ = std::move(checkpoint.anchor);
  if (shard->step_.outer().beta != 0) {
    shard->momentum_ = std::move(checkpoint.momentum);
  }
  shard->anchor_ready_ = true;
  shard->rounds_closed_ = h.rounds_closed();
  shard->restored_quorum_misses_ = h.quorum_misses();
  shard->lifecycle_ = JobLifecycle(h.config().rounds(), options.abandon_after,
                                   clock->Now(), h.state());
  const absl::Time lease_expiry = clock->Now() + options.lease;
  for (const v1::CheckpointMember& m : h.members()) {
    absl::StatusOr<common::Codec> uplink =
        common::CodecFromWire(m.uplink_codec());
    if (!uplink.ok()) {
      return CheckpointDataLoss(h.job(),
                                std::string(uplink.status().message()));
    }
    shard->members_.Restore(m.worker_id(), *uplink, lease_expiry);
    shard->rounds_.AddWorker(m.worker_id(), h.rounds_closed());
    shard->rounds_.RestoreCountedInPreviousRound(m.worker_id(),
                                                 m.counted_last_round());
  }
  if (!checkpoint.update_chunks.empty()) {
    // The earlier updates first: the cache holds them oldest first.
    CO2_ASSIGN_OR_RETURN(
        std::vector<std::shared_ptr<const UpdateChunks>> earlier,
        RestoreEarlierUpdates(checkpoint, shard->step_, shard->messages_));
    for (auto& update : earlier)
      shard->updates_.AddPublished(std::move(update));
    CO2_ASSIGN_OR_RETURN(std::shared_ptr<const UpdateChunks> update,
                         RestoreLastUpdate(checkpoint, shard->step_,
                                           shard->messages_));
    shard->updates_.AddPublished(std::move(update));
  }
  shard->durability_.AnchorRestored();
  CO2_RETURN_IF_ERROR(shard->RestoreJournalLocked());
  return shard;
}

absl::Status JobShard::RestoreJournalLocked() {
  if (journal_ == nullptr) return absl::OkStatus();
  const uint64_t round = rounds_.open_round();
  CO2_ASSIGN_OR_RETURN(std::vector<LoadedJournalChunk> chunks,
                       RoundJournal::Load(journal_->path(), round));
  if (chunks.empty()) return absl::OkStatus();
  BeginStepLocked(round);
  for (LoadedJournalChunk& chunk : chunks) {
    const v1::JournalChunkHeader& h = chunk.header;
    CO2_RETURN_IF_ERROR(CheckJournalChunkFits(chunk, step_, !momentum_.empty(),
                                              journal_->path()));
    if (streamed_.stepped(h.chunk_index())) {
      return JournalDataLoss(journal_->path(), h.chunk_index(),
                             "in the journal twice");
    }
    const common::Range r = common::ChunkRange(range_.size(), h.chunk_index());
    std::copy(chunk.anchor.begin(), chunk.anchor.end(),
              anchor_.begin() + static_cast<std::ptrdiff_t>(r.begin));
    if (!momentum_.empty()) {
      std::copy(chunk.momentum.begin(), chunk.momentum.end(),
                momentum_.begin() + static_cast<std::ptrdiff_t>(r.begin));
    }
    std::vector<ChunkSender> senders;
    for (const v1::JournalSender& sender : h.senders()) {
      senders.push_back(
          ChunkSender{sender.worker_id(), sender.contribution_weight()});
    }
    rounds_.RestoreTakenChunk(h.chunk_index(), senders);
    updates_.AddStreamed(streamed_.Restore(
        h.chunk_index(), h.contributors(), std::move(chunk.update),
        common::AnchorDigest(chunk.anchor)));
  }
  CO2_LOG(INFO) << "job " << job_ << ": shard " << options_.shard_index
                << " restored " << chunks.size() << " of " << num_chunks()
                << " chunks of round " << round
                << " stepped and sent before the restart, from "
                << journal_->path();
  return absl::OkStatus();
}

v1::ShardCheckpointHeader JobShard::CheckpointHeaderLocked() const {
  v1::ShardCheckpointHeader header;
  header.set_job(job_);
  header.set_shard_index(options_.shard_index);
  *header.mutable_config() = config_;
  header.set_range_begin(range_.begin);
  header.set_range_end(range_.end);
  header.set_rounds_closed(rounds_closed_);
  header.set_quorum_misses(restored_quorum_misses_ + rounds_.quorum_misses());
  header.set_state(lifecycle_.state());
  if (const std::optional<KeptUpdate> update = updates_.Last()) {
    header.set_update_contributors(update->contributors());
  }
  for (const auto& [worker, member] : members_.live()) {
    v1::CheckpointMember* m = header.add_members();
    m->set_worker_id(worker);
    m->set_uplink_codec(v1::Codec(member.uplink));
    m->set_counted_last_round(rounds_.CountedInPreviousRound(worker));
  }
  return header;
}

absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>>
JobShard::WriteCheckpoint(const v1::ShardCheckpointHeader& header) {
  // Every update kept for replay, so that a restarted shard replays as many
  // rounds as this one would.
  const std::vector<KeptUpdate> kept = updates_.All();
  std::vector<const KeptUpdate*> earlier;
  for (size_t i = 0; i + 1 < kept.size(); ++i) earlier.push_back(&kept[i]);
  return WriteShardCheckpoint(*options_.checkpoints, header, anchor_, momentum_,
                              kept.empty() ? nullptr : &kept.back(),
                              std::move(earlier));
}

}  // namespace co2::server
