// JobShard's publishing side: how the updates of closed rounds and of the
// open round's complete chunks reach the workers' streams, at once in
// memory or once a checkpoint or the round journal holds them. The rest of
// the class is in job_shard.cc, job_shard_join.cc and
// job_shard_checkpoint.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/layout.h"
#include "common/logging.h"
#include "server/job/job_shard.h"
#include "server/storage/write_failure.h"

namespace co2::server {

int JobShard::Poll() {
  if (options_.checkpoints == nullptr) return PollInMemory();
  const int published = PublishDurably();
  StreamDurably();
  return published;
}

int JobShard::PollInMemory() {
  std::vector<std::shared_ptr<const UpdateChunks>> published;
  std::vector<std::shared_ptr<UpdateSink>> sinks;
  int rounds_published = 0;
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked();
    // Nothing to make durable: the closed rounds' updates go out at once,
    // then the chunks of the open round that are complete.
    rounds_published = static_cast<int>(updates_.num_unpublished());
    published = updates_.Publish(nullptr);
    std::vector<SteppedChunk> stepped = StepCompleteChunksLocked();
    if (!stepped.empty()) {
      published.push_back(
          std::make_shared<const UpdateChunks>(ReleaseLocked(stepped)));
    }
    if (published.empty()) return 0;
    sinks = sinks_.Live();
  }
  SendToSinks(published, sinks);
  return rounds_published;
}

int JobShard::PublishDurably() {
  v1::ShardCheckpointHeader header;
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked();
    // Membership and the seeded anchor are made durable too, so a shard
    // that restarts before its first round closed still knows the job; but
    // not while chunks of the open round are stepped (the anchor is then
    // part old, part new, and the round's close writes it whole).
    if (!durability_.Due(updates_.has_unpublished(),
                         anchor_ready_ && !streamed_.active(),
                         clock_->Now())) {
      return 0;
    }
    header = CheckpointHeaderLocked();
    durability_.BeginWrite();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>> written =
      WriteCheckpoint(header);
  std::vector<ShardDurability::Waiter> durable;
  {
    absl::MutexLock lock(&mu_);
    if (!written.ok()) {
      // The update waits: releasing it before the state is durable could
      // leave workers ahead of a restarted shard.
      durability_.WriteFailed(clock_->Now());
      WriteFailedLocked(
          rounds_closed_ == 0
              ? std::string("checkpoint before the first round closed")
              : absl::StrCat("checkpoint of round ", rounds_closed_ - 1),
          written.status());
      return 0;
    }
    WriteSucceededLocked();
    durable = durability_.Written();
    ++stats_.checkpoints_written;
    stats_.last_checkpoint_duration = absl::Now() - start;
    if (options_.observer != nullptr && lifecycle_.open()) {
      options_.observer->OnCheckpointWritten(job_,
                                             stats_.last_checkpoint_duration);
    }
  }
  // The checkpoint holds every chunk the journal had (no chunk of the open
  // round is stepped while one is written). A journal that cannot be
  // emptied holds only rounds before the checkpoint's, which no restore
  // reads.
  if (absl::Status cleared = journal_->Clear(); !cleared.ok()) {
    CO2_LOG(WARNING) << "job " << job_ << ": " << cleared;
  }
  for (auto& done : durable) done(absl::OkStatus());
  std::vector<std::shared_ptr<const UpdateChunks>> published;
  std::vector<std::shared_ptr<UpdateSink>> sinks;
  int rounds_published = 0;
  {
    absl::MutexLock lock(&mu_);
    rounds_published = static_cast<int>(updates_.num_unpublished());
    published = updates_.Publish(*std::move(written));
    sinks = sinks_.Live();
  }
  SendToSinks(published, sinks);
  return rounds_published;
}

void JobShard::StreamDurably() {
  std::vector<SteppedChunk> stepped;
  uint64_t round = 0;
  {
    absl::MutexLock lock(&mu_);
    stepped = StepCompleteChunksLocked();
    if (stepped.empty()) return;
    round = rounds_.open_round();
  }
  const absl::Status written = WriteJournal(round, stepped);
  std::vector<std::shared_ptr<const UpdateChunks>> released;
  std::vector<std::shared_ptr<UpdateSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    if (!written.ok()) {
      // Stepped but not durable: these chunks and the rest of the round go
      // out after the round's checkpoint, at its close.
      durability_.JournalFailed(round);
      WriteFailedLocked(absl::StrCat("round ", round, " journal"), written);
      return;
    }
    WriteSucceededLocked();
    released.push_back(
        std::make_shared<const UpdateChunks>(ReleaseLocked(stepped)));
    sinks = sinks_.Live();
  }
  SendToSinks(released, sinks);
}

void JobShard::WriteFailedLocked(absl::string_view what,
                                 const absl::Status& error) {
  ++stats_.checkpoint_failures;
  if (options_.observer != nullptr) {
    options_.observer->OnCheckpointFailed(job_, WriteFailureOf(error));
  }
  if (std::optional<std::string> line =
          checkpoint_health_.Failed(what, error, clock_->Now())) {
    CO2_LOG(ERROR) << "job " << job_ << ": " << *line;
  }
}

void JobShard::WriteSucceededLocked() {
  if (std::optional<std::string> line =
          checkpoint_health_.Succeeded(clock_->Now())) {
    CO2_LOG(INFO) << "job " << job_ << ": " << *line;
  }
}

std::string JobShard::UpdateHeld() const {
  absl::MutexLock lock(&mu_);
  return checkpoint_health_.held();
}

void JobShard::SendToSinks(
    const std::vector<std::shared_ptr<const UpdateChunks>>& updates,
    const std::vector<std::shared_ptr<UpdateSink>>& sinks) {
  for (const auto& update : updates) {
    for (const auto& sink : sinks) sink->Send(update);
    if (options_.observer != nullptr) {
      size_t bytes = 0;
      for (const auto& chunk : *update) bytes += chunk->payload().size();
      options_.observer->OnUpdatePublished(
          job_, common::Codec(config_.downlink_codec()), bytes, sinks.size());
    }
  }
}

absl::Status JobShard::WriteJournal(uint64_t round,
                                    const std::vector<SteppedChunk>& stepped) {
  std::vector<JournalChunk> chunks;
  chunks.reserve(stepped.size());
  for (const SteppedChunk& chunk : stepped) {
    const uint32_t c = chunk.update->chunk_index();
    const common::Range r = common::ChunkRange(range_.size(), c);
    chunks.push_back(JournalChunk{
        c, chunk.update->contributors(), chunk.senders,
        absl::MakeConstSpan(anchor_).subspan(r.begin, r.size()),
        momentum_.empty()
            ? absl::Span<const float>()
            : absl::MakeConstSpan(momentum_).subspan(r.begin, r.size()),
        chunk.update->payload()});
  }
  return journal_->Append(round, chunks);
}

}  // namespace co2::server
