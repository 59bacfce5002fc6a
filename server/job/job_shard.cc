#include "server/job/job_shard.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace co2::server {

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Create(
    std::string job, const v1::JobConfig& config,
    const JobShardOptions& options, common::Clock* clock) {
  return Build(std::move(job), config, options, clock, /*first_round=*/0);
}

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Build(
    std::string job, const v1::JobConfig& config,
    const JobShardOptions& options, common::Clock* clock,
    uint64_t first_round) {
  CO2_RETURN_IF_ERROR(common::ValidateJobConfig(config));
  CO2_RETURN_IF_ERROR(ValidateOuterConfig(OuterConfigOf(config)));
  CO2_ASSIGN_OR_RETURN(
      common::Range range,
      common::ShardRangeFor(config.num_parameters(), config.num_shards(),
                            options.shard_index));
  return std::unique_ptr<JobShard>(
      new JobShard(std::move(job), config, options, range, clock, first_round));
}

JobShard::JobShard(std::string job, const v1::JobConfig& config,
                   const JobShardOptions& options, common::Range range,
                   common::Clock* clock, uint64_t first_round)
    : job_(std::move(job)),
      config_(config),
      options_(options),
      range_(range),
      step_(config, range.size()),
      messages_(config, step_.num_chunks()),
      clock_(clock),
      rounds_(RoundOptions{range.size(), config.min_workers(),
                           absl::Milliseconds(config.round_timeout_ms()),
                           first_round, options.round_deadline,
                           config.deterministic(), config.rounds(),
                           config.outlier_ratio()},
              clock),
      members_(job_, options.max_workers, options.lease,
               options.max_rejected_chunks),
      anchor_(range.size()),
      momentum_(step_.outer().beta != 0 ? range.size() : 0),
      streamed_(step_, messages_),
      updates_(config.max_staleness() + 1),
      durability_(options.checkpoints != nullptr, options.checkpoint_retry),
      checkpoint_health_(options.checkpoint_log_every),
      journal_(options.checkpoints == nullptr
                   ? nullptr
                   : std::make_unique<RoundJournal>(
                         options.checkpoints->JournalPathFor(
                             job_, options.shard_index, config.num_shards()))),
      report_(job_, options.observer, clock),
      lifecycle_(config.rounds(), options.abandon_after, clock->Now()) {}

JobShard::~JobShard() {
  std::vector<ShardDurability::Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters = durability_.Abandon();
  }
  for (auto& done : waiters) {
    done(absl::UnavailableError("shard shutting down before the checkpoint"));
  }
}

void JobShard::NotifyWhenDurable(std::function<void(absl::Status)> done) {
  std::optional<ShardDurability::Waiter> now;
  {
    absl::MutexLock lock(&mu_);
    now = durability_.Wait(std::move(done));
  }
  if (now) (*now)(absl::OkStatus());
}

uint32_t JobShard::num_chunks() const { return step_.num_chunks(); }

absl::Status JobShard::Contribute(const std::string& worker,
                                  const ContributionView& c) {
  absl::Status status = ContributeUnobserved(worker, c);
  if (!status.ok() && options_.observer != nullptr) {
    options_.observer->OnRejected(job_, RejectReasonOf(status));
  }
  return status;
}

absl::Status JobShard::Contribute(const std::string& worker,
                                  const v1::Contribution& c) {
  const std::string_view payload = c.payload();
  return Contribute(worker, ContributionView{c.round(), c.chunk_index(),
                                             c.codec(), c.weight(),
                                             common::Pieces(&payload, 1)});
}

absl::Status JobShard::ContributeUnobserved(const std::string& worker,
                                            const ContributionView& c) {
  // The expensive scan for NaN/Inf runs outside the lock.
  ContributionPayload payload;
  CO2_RETURN_IF_ERROR(payload.Read(c, range_.size()));
  const common::Codec codec = payload.codec();
  const absl::Status& valid = payload.valid();
  absl::MutexLock lock(&mu_);
  ShardMember* member = members_.Find(worker);
  if (member == nullptr) return members_.NotMember(worker);
  if (member->uplink != codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution codec ", std::string(common::CodecName(codec)),
        " differs from the codec worker \"", worker, "\" joined with (",
        std::string(common::CodecName(member->uplink)), ")"));
  }
  if (config_.rounds() > 0 && c.round >= config_.rounds()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution to round ", c.round, ", past the job's last round ",
        config_.rounds() - 1, " (JobConfig.rounds = ", config_.rounds(), ")"));
  }
  if (!valid.ok()) {
    return RejectLocked(worker, *member,
                        absl::Status(valid.code(),
                                     absl::StrCat("round ", c.round, " chunk ",
                                                  c.chunk_index, ": ",
                                                  valid.message())));
  }
  if (!anchor_ready_) {
    // Nothing is accumulated before the anchor: a re-seed moves the open
    // round to where the workers are.
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" has no anchor on shard ", options_.shard_index,
        " yet (being seeded by \"", seed_.seeder(), "\"); retry"));
  }
  members_.Renew(*member, clock_->Now());
  absl::StatusOr<ChunkOutcome> added = rounds_.AddChunk(
      worker, c.round, c.chunk_index, codec, payload.pieces(), c.weight);
  // RoundState refuses a bad weight, or values whose weighted sum would
  // overflow fp32, before counting anything: garbage like a NaN.
  if (added.status().code() == absl::StatusCode::kInvalidArgument) {
    return RejectLocked(worker, *member, added.status());
  }
  member->consecutive_rejects = 0;
  CO2_ASSIGN_OR_RETURN(ChunkOutcome outcome, std::move(added));
  if (options_.observer != nullptr) {
    options_.observer->OnContribution(job_, codec, payload.bytes(),
                                      outcome.folded, outcome.duplicate);
  }
  if (outcome.duplicate) ++stats_.duplicate_chunks;
  if (outcome.folded) ++stats_.late_chunks;
  return absl::OkStatus();
}

absl::Status JobShard::Subscribe(const std::shared_ptr<UpdateSink>& sink,
                                 uint64_t from_round) {
  absl::MutexLock lock(&mu_);
  const uint64_t oldest =
      updates_.OldestRound().value_or(rounds_.open_round());
  if (from_round < oldest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replay_from_round ", from_round, " is older than the oldest update "
        "shard ", options_.shard_index, " holds for job \"", job_,
        "\" (round ", oldest, "; open round ", rounds_.open_round(),
        "): the updates before round ", oldest,
        " are gone; join without resume_round and fetch the anchor"));
  }
  sinks_.Add(sink);
  // Under the lock, so that nothing a Poll sends later comes before these:
  // the published updates, the chunks of a closed round waiting for its
  // checkpoint that went out before it closed (the rest goes out with the
  // checkpoint), and the open round's chunks sent ahead.
  for (const KeptUpdate& update : updates_.PublishedSince(from_round)) {
    sink->Replay(update);
  }
  for (const auto& sent : updates_.StreamedUnpublishedSince(from_round)) {
    sink->Send(sent);
  }
  const UpdateChunks& streamed = updates_.Streamed();
  if (!streamed.empty() && streamed.front()->round() >= from_round) {
    sink->Send(std::make_shared<const UpdateChunks>(streamed));
  }
  return absl::OkStatus();
}

void JobShard::AdvanceLocked() {
  ExpireLeasesLocked();
  while (CloseRoundLocked()) {
  }
  UpdateLifecycleLocked();
  if (lifecycle_.open()) {
    report_.Polled(members_.size(), rounds_.open_round(), anchor_ready_,
                   rounds_.quorum_misses(), rounds_.RoundTimeout());
  }
}

void JobShard::UpdateLifecycleLocked() {
  const v1::JobState before = lifecycle_.state();
  if (!lifecycle_.Update(rounds_closed_, members_.size(), clock_->Now())) {
    return;
  }
  durability_.MarkDirty();
  CO2_LOG(INFO) << "job " << job_ << ": " << JobStateName(before) << " -> "
                << JobStateName(lifecycle_.state()) << " at round "
                << rounds_.open_round() << " on shard " << options_.shard_index;
  if (!lifecycle_.open()) report_.Closed();
  if (lifecycle_.state() == v1::JOB_STATE_FINISHED &&
      config_.outlier_ratio() > 0) {
    CO2_LOG(INFO) << "job " << job_ << ": largest contribution norm / its "
                  << "chunk's median in any round: " << stats_.max_norm_ratio
                  << " (outlier_ratio " << config_.outlier_ratio() << ", "
                  << stats_.held_out_chunks << " chunk(s) held out)";
  }
}

v1::JobSummary JobShard::Summary() const {
  absl::MutexLock lock(&mu_);
  v1::JobSummary summary;
  summary.set_job(job_);
  summary.set_state(lifecycle_.state());
  summary.set_open_round(rounds_.open_round());
  summary.set_rounds(config_.rounds());
  summary.set_live_workers(static_cast<uint32_t>(members_.size()));
  summary.set_seconds_in_state(
      absl::ToDoubleSeconds(clock_->Now() - lifecycle_.since()));
  summary.set_in_memory(true);
  return summary;
}

bool JobShard::RetireIfExpired(absl::Duration retention) {
  absl::MutexLock lock(&mu_);
  if (lifecycle_.open() || clock_->Now() - lifecycle_.since() < retention) {
    return false;
  }
  if (!durability_.Clean(updates_.has_unpublished())) return false;
  retired_ = true;
  return true;
}

absl::Status JobShard::RetireForDelete() {
  absl::MutexLock lock(&mu_);
  if (lifecycle_.open() && members_.size() > 0) {
    std::vector<std::string> live;
    for (const auto& [worker, member] : members_.live()) live.push_back(worker);
    std::sort(live.begin(), live.end());
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_, "\" is open with ", live.size(), " live worker(s) (",
        absl::StrJoin(live, ", "), "); stop them first"));
  }
  retired_ = true;
  return absl::OkStatus();
}

absl::Time JobShard::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = rounds_.Deadline().value_or(absl::InfiniteFuture());
  next = std::min(next, lifecycle_.NextDeadline());
  next = std::min(next, durability_.RetryAt(updates_.has_unpublished()));
  return std::min(next, members_.NextExpiry());
}

JobShardStats JobShard::stats() const {
  absl::MutexLock lock(&mu_);
  JobShardStats s = stats_;
  s.rounds_closed = rounds_closed_;
  s.quorum_misses = restored_quorum_misses_ + rounds_.quorum_misses();
  s.live_workers = members_.size();
  return s;
}

std::vector<float> JobShard::AnchorForTesting(uint64_t* anchor_round) const {
  absl::MutexLock lock(&mu_);
  *anchor_round = AnchorRoundLocked();
  return anchor_;
}

absl::Status JobShard::RejectLocked(const std::string& worker,
                                   ShardMember& member,
                                   const absl::Status& invalid) {
  ++stats_.rejected_chunks;
  bool evicted = false;
  absl::Status status = members_.Reject(worker, member, invalid, &evicted);
  if (evicted) EvictedLocked(worker);
  return status;
}

void JobShard::HoldOutLocked(uint64_t round,
                             const std::vector<HeldOut>& held_out) {
  for (const HeldOut& out : held_out) {
    const std::string why = absl::StrCat("round ", round, " chunk ",
                                         out.chunk_index, ": ", out.reason);
    CO2_LOG(WARNING) << "job " << job_ << ": contribution of worker "
                     << out.worker << " held out of the mean, " << why;
    ++stats_.rejected_chunks;
    ++stats_.held_out_chunks;
    if (options_.observer != nullptr) {
      options_.observer->OnRejected(
          job_, out.outlier ? RejectReason::kOutlier : RejectReason::kNonFinite);
    }
    ShardMember* member = members_.Find(out.worker);
    if (member == nullptr) continue;
    bool evicted = false;
    members_.HoldOut(out.worker, *member, round, why, &evicted);
    if (evicted) EvictedLocked(out.worker);
  }
}

void JobShard::EvictedLocked(const std::string& worker) {
  ForgetWorkerLocked(worker);
  ++stats_.evicted_workers;
  durability_.MarkDirty();
}

void JobShard::ForgetWorkerLocked(const std::string& worker) {
  rounds_.RemoveWorker(worker);
  if (!anchor_ready_) seed_.Forget(worker);
}

uint64_t JobShard::AnchorRoundLocked() const {
  // A_0 = A_1 (U_1 = 0), so before any round closed the anchor starts round 0.
  return rounds_closed_ == 0 ? 0 : rounds_closed_ + config_.max_staleness();
}

bool JobShard::CloseRoundLocked() {
  if (!anchor_ready_) return false;
  std::optional<ClosedRound> closed = rounds_.TryClose();
  if (!closed) return false;
  // The last update is the gap of this step (the begun step holds a copy).
  // Then the oldest update kept goes before the new one is whole, so at most
  // max_staleness + 1 rounds of encoded updates exist at any time.
  BeginStepLocked(closed->round);
  updates_.MakeRoomForNext();
  StreamedRound::Closed closing = streamed_.Close(*closed);
  const StepResult& step = closing.result;
  stats_.last_step = step.stats;
  if (step.unread_gap_chunks > 0) {
    stats_.unread_gap_chunks += step.unread_gap_chunks;
    CO2_LOG(ERROR) << "job " << job_ << ": round " << closed->round
                   << " stepped " << step.unread_gap_chunks << " of "
                   << step_.num_chunks()
                   << " chunks with a zero gap, the last update could not "
                      "be read back: "
                   << step.gap_error;
  }
  if (step.stats.refused_chunks > 0) {
    stats_.refused_step_chunks += step.stats.refused_chunks;
    CO2_LOG(ERROR) << "job " << job_ << ": round " << closed->round
                   << ": the outer step of " << step.stats.refused_chunks
                   << " of " << step_.num_chunks()
                   << " chunks was refused; those chunks keep their last "
                      "good anchor and momentum and get a zero update: "
                   << step.refused_error;
  }
  HoldOutLocked(closed->round, closed->held_out);
  stats_.max_norm_ratio =
      std::max(stats_.max_norm_ratio, closed->max_norm_ratio);
  if (closed->quorum_close) ++stats_.quorum_closes;
  report_.RoundClosed(*closed, stats_.last_step, range_.size());
  ++rounds_closed_;
  updates_.AddUnpublished(std::move(closing.update));
  snapshot_.Reset();
  return true;
}

void JobShard::BeginStepLocked(uint64_t round) {
  if (!streamed_.active()) {
    streamed_.Begin(
        round, updates_.Last(),
        OuterStepBuffers{absl::MakeSpan(anchor_), absl::MakeSpan(momentum_)});
  }
  assert(streamed_.round() == round);
}

std::vector<JobShard::SteppedChunk> JobShard::StepCompleteChunksLocked() {
  std::vector<SteppedChunk> stepped;
  if (!options_.stream_updates || !anchor_ready_ ||
      updates_.has_unpublished()) {
    return stepped;
  }
  if (!durability_.MayStream(rounds_.open_round())) return stepped;
  std::vector<CompleteChunk> complete = rounds_.TakeCompleteChunks();
  if (complete.empty()) return stepped;
  // Only a worker that has joined and not fetched yet will fetch before the
  // round closes; without one, the copies would cost a range of memory for
  // nothing (a fetch this round that finds none is told to retry), and once
  // a chunk went without, later copies would serve no fetch either.
  const bool keep =
      rounds_.HasWorkerWithoutRound() && streamed_.StartAnchorWhole();
  BeginStepLocked(rounds_.open_round());
  for (CompleteChunk& chunk : complete) {
    SteppedChunk one;
    if (journal_ != nullptr) one.senders = rounds_.SendersOf(chunk.chunk_index);
    one.update = streamed_.Step(chunk.chunk_index, chunk.mean,
                                chunk.contributors, chunk.held_out, keep);
    HoldOutLocked(rounds_.open_round(), chunk.held_out);
    stepped.push_back(std::move(one));
  }
  return stepped;
}

UpdateChunks JobShard::ReleaseLocked(std::vector<SteppedChunk>& stepped) {
  UpdateChunks released;
  for (SteppedChunk& chunk : stepped) {
    updates_.AddStreamed(chunk.update);
    released.push_back(std::move(chunk.update));
  }
  return released;
}

void JobShard::ExpireLeasesLocked() {
  for (const std::string& worker : members_.ExpireLeases(clock_->Now())) {
    ForgetWorkerLocked(worker);
    durability_.MarkDirty();
  }
}

}  // namespace co2::server
