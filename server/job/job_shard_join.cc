// JobShard's joining side: how a worker joins the job, renews its lease and
// leaves it, and how the shard's anchor is seeded by the first worker (or
// re-seeded by a resuming one after the shard lost its state) and fetched.
// The rest of the class is in job_shard.cc, job_shard_checkpoint.cc and
// job_shard_publish.cc.
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job/job_shard.h"

namespace co2::server {

absl::StatusOr<JoinResult> JobShard::Join(const std::string& worker,
                                          const v1::JobConfig& config,
                                          common::Codec uplink,
                                          std::optional<uint64_t> resume_round,
                                          bool rejoin) {
  CO2_RETURN_IF_ERROR(common::CheckSameJobConfig(config_, config));
  absl::MutexLock lock(&mu_);
  if (retired_) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" was just retired on shard ", options_.shard_index,
        "; join again"));
  }
  const bool abandoned = lifecycle_.state() == v1::JOB_STATE_ABANDONED;
  CO2_RETURN_IF_ERROR(lifecycle_.AdmitJoin(job_, rejoin, clock_->Now()));
  if (abandoned) {
    durability_.MarkDirty();
    CO2_LOG(INFO) << "job " << job_ << ": abandoned -> open (worker " << worker
                  << " joined at round " << rounds_.open_round() << ")";
  }
  if (members_.IsEvicted(worker)) return members_.NotMember(worker);
  const bool lost_state = !anchor_ready_ && resume_round.has_value();
  if (lost_state && seed_.ReseedingByOther(worker)) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" lost its state on shard ", options_.shard_index,
        " and is being re-seeded by worker \"", seed_.seeder(), "\"; retry"));
  }
  bool added = false;
  CO2_ASSIGN_OR_RETURN(ShardMember* member, members_.Add(worker, &added));
  if (added) {
    durability_.MarkDirty();
    // A worker of a fresh job takes part from round 0; one joining a running
    // job from the anchor round its Fetch returns (see Fetch); one resuming
    // after a reconnect from the round it is in.
    rounds_.AddWorker(worker, resume_round.value_or(
                                  rounds_closed_ == 0 ? 0 : UINT64_MAX));
    CO2_LOG(INFO) << "job " << job_ << ": worker " << worker
                  << (resume_round ? " rejoined" : " joined") << " ("
                  << members_.size() << " live)";
  }
  member->uplink = uplink;
  members_.Renew(*member, clock_->Now());
  JoinResult result;
  if (lost_state) {
    // A worker that was training holds the exact anchor; a fresh worker's
    // A_0 would restart the job, so the resuming worker seeds instead.
    if (!seed_.reseeding() && !seed_.seeder().empty()) {
      CO2_LOG(WARNING) << "job " << job_ << ": worker " << worker
                       << " re-seeds the lost state instead of "
                       << seed_.seeder() << "'s A_0";
    }
    seed_.StartReseed(worker);
    result.must_reseed = true;
    CO2_LOG(WARNING) << "job " << job_ << ": shard " << options_.shard_index
                     << " has no state for this running job (checkpoint "
                     << ReseedReasonName(options_.reseed_reason)
                     << "); asking worker " << worker
                     << " to re-seed it from its anchor";
  } else if (!anchor_ready_) {
    result.must_seed = seed_.OfferSeed(worker);
  }
  result.open_round = rounds_.open_round();
  result.oldest_update_round =
      updates_.OldestRound().value_or(rounds_.open_round());
  return result;
}

absl::Status JobShard::Heartbeat(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  ShardMember* member = members_.Find(worker);
  if (member == nullptr) return members_.NotMember(worker);
  members_.Renew(*member, clock_->Now());
  return absl::OkStatus();
}

absl::Status JobShard::Leave(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (!members_.Remove(worker)) return members_.NotMember(worker);
  durability_.MarkDirty();
  ForgetWorkerLocked(worker);
  CO2_LOG(INFO) << "job " << job_ << ": worker " << worker << " left";
  return absl::OkStatus();
}

absl::StatusOr<common::Codec> JobShard::UplinkCodec(
    const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  const ShardMember* member = members_.Find(worker);
  if (member == nullptr) return members_.NotMember(worker);
  return member->uplink;
}

absl::Status JobShard::SeedChunk(const std::string& worker, uint32_t chunk_index,
                                 uint64_t anchor_round,
                                 const std::string& payload,
                                 uint64_t* attempt) {
  if (chunk_index >= num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed chunk_index ", chunk_index,
                     " out of range: shard has ", num_chunks(), " chunks"));
  }
  const common::Range chunk = common::ChunkRange(range_.size(), chunk_index);
  CO2_RETURN_IF_ERROR(
      common::Validate(common::Codec::kFp32, payload, chunk.size()));
  absl::MutexLock lock(&mu_);
  if (anchor_ready_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_, "\" already has an anchor; fetch it"));
  }
  CO2_ASSIGN_OR_RETURN(
      const bool last,
      seed_.Accept(worker, chunk_index, anchor_round, num_chunks(), attempt));
  common::Decode(common::Codec::kFp32, payload,
                 absl::MakeSpan(anchor_).subspan(chunk.begin, chunk.size()));
  if (last) {
    anchor_ready_ = true;
    durability_.AnchorReplaced();
    report_.RoundOpened();
    if (seed_.reseeding()) {
      FinishReseedLocked();
    } else {
      CO2_LOG(INFO) << "job " << job_ << ": anchor seeded by " << worker;
    }
  }
  return absl::OkStatus();
}

void JobShard::AbandonSeed(uint64_t attempt) {
  absl::MutexLock lock(&mu_);
  if (!anchor_ready_) seed_.Abandon(attempt);
}

void JobShard::FinishReseedLocked() {
  // The worker's anchor A_a starts round a, so the shard resumes as if it
  // had closed round a − 1 − s: its next update (of round a − s) turns A_a
  // into A_{a+1}, the update that worker and every worker at its round wait
  // for next. Momentum and gap restart from zero (they were only here).
  const uint64_t staleness = config_.max_staleness();
  const uint64_t anchor_round = seed_.reseed_anchor_round();
  rounds_closed_ = anchor_round > staleness ? anchor_round - staleness : 0;
  rounds_.Reopen(rounds_closed_);
  seed_.FinishReseed();
  ++stats_.reseeds;
  CO2_LOG(WARNING) << "job " << job_ << ": shard " << options_.shard_index
                   << " re-seeded by worker " << seed_.seeder()
                   << " with its anchor of round " << anchor_round
                   << " after losing its state (checkpoint "
                   << ReseedReasonName(options_.reseed_reason)
                   << "); open round " << rounds_closed_
                   << "; outer momentum restarts from zero";
  if (options_.observer != nullptr) {
    options_.observer->OnReseeded(job_, options_.reseed_reason);
  }
}

absl::StatusOr<std::shared_ptr<const AnchorSnapshot>> JobShard::Fetch(
    const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (members_.Find(worker) == nullptr) return members_.NotMember(worker);
  if (!anchor_ready_) {
    if (seed_.seeder() == worker) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker \"", worker, "\" was told to seed job \"", job_,
          "\" on shard ", options_.shard_index,
          ": it uploads the anchor with Seed and cannot fetch it"));
    }
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" has no anchor on shard ", options_.shard_index,
        " yet (",
        seed_.seeder().empty()
            ? std::string("no worker is seeding it: the next to join does")
            : absl::StrCat("being seeded by worker \"", seed_.seeder(), "\""),
        "); retry"));
  }
  if (!streamed_.StartAnchorWhole()) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\": shard ", options_.shard_index,
        " is sending the update of round ", streamed_.round(),
        " and its anchor is whole again once that round closes; retry"));
  }
  std::shared_ptr<const AnchorSnapshot> snapshot = snapshot_.Get(
      AnchorRoundLocked(), anchor_, streamed_.start_anchor());
  rounds_.AddWorker(worker, snapshot->anchor_round);
  return snapshot;
}

}  // namespace co2::server
