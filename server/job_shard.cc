#include "server/job_shard.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace co2::server {
namespace {

OuterConfig ToOuterConfig(const v1::JobConfig& c) {
  OuterConfig o;
  o.alpha = c.alpha();
  o.beta = c.beta();
  o.momentum = c.momentum() == v1::MOMENTUM_NESTEROV ? MomentumKind::kNesterov
                                                     : MomentumKind::kHeavyBall;
  switch (c.gap_penalty()) {
    case v1::GAP_PENALTY_CONSTANT:
      o.penalty = GapPenalty::kConstant;
      break;
    case v1::GAP_PENALTY_GAP_AWARE:
      o.penalty = GapPenalty::kGapAware;
      break;
    default:
      o.penalty = GapPenalty::kNone;
  }
  o.penalty_lambda = c.penalty_lambda();
  switch (c.clip()) {
    case v1::CLIP_VALUE:
      o.clip = ClipMode::kValue;
      break;
    case v1::CLIP_ADAPTIVE:
      o.clip = ClipMode::kAdaptive;
      break;
    default:
      o.clip = ClipMode::kNone;
  }
  o.clip_value = c.clip_value();
  return o;
}

// The floats of an fp32 payload, in place: a payload string's buffer is
// operator new's (or the string's own, for a few bytes), aligned for float.
absl::Span<float> Fp32Floats(std::string& bytes) {
  return absl::MakeSpan(reinterpret_cast<float*>(bytes.data()),
                        bytes.size() / sizeof(float));
}
absl::Span<const float> Fp32Floats(const std::string& bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()),
                             bytes.size() / sizeof(float));
}

// `n` zero floats that cost no memory: untouched private anonymous pages all
// read as the kernel's zero page. The checkpoint format has a momentum that a
// job with β = 0 does not keep; this is what it writes.
class ZeroFloats {
 public:
  explicit ZeroFloats(size_t n) : bytes_(n * sizeof(float)) {
    if (bytes_ == 0) return;
    void* pages = mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (pages != MAP_FAILED) data_ = static_cast<const float*>(pages);
  }
  ZeroFloats(const ZeroFloats&) = delete;
  ZeroFloats& operator=(const ZeroFloats&) = delete;
  ~ZeroFloats() {
    if (data_ != nullptr) munmap(const_cast<float*>(data_), bytes_);
  }

  bool ok() const { return bytes_ == 0 || data_ != nullptr; }
  absl::Span<const float> span() const {
    return absl::MakeConstSpan(data_, bytes_ / sizeof(float));
  }

 private:
  const size_t bytes_;
  const float* data_ = nullptr;
};

void AddStats(const OuterStepStats& chunk, size_t elements,
              OuterStepStats* total, double* penalty_sum) {
  *penalty_sum += chunk.mean_penalty * static_cast<double>(elements);
  total->momentum_norm_sq += chunk.momentum_norm_sq;
  total->clipped += chunk.clipped;
}

absl::Status NotMember(const std::string& worker) {
  return absl::NotFoundError(absl::StrCat(
      "worker \"", worker, "\" is not a live member of this job (join first)"));
}

}  // namespace

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
  CO2_RETURN_IF_ERROR(ValidateOuterConfig(ToOuterConfig(config)));
  CO2_ASSIGN_OR_RETURN(
      common::Range range,
      common::ShardRangeFor(config.num_parameters(), config.num_shards(),
                            options.shard_index));
  return std::unique_ptr<JobShard>(new JobShard(
      std::move(job), config, options, range, clock, first_round));
}

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Restore(
    LoadedCheckpoint checkpoint, const JobShardOptions& options,
    common::Clock* clock) {
  const v1::ShardCheckpointHeader& h = checkpoint.header;
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard,
                       Build(h.job(), h.config(), options, clock,
                             h.rounds_closed()));
  auto data_loss = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("checkpoint of job \"", h.job(), "\": ", what));
  };
  if (shard->range_.begin != h.range_begin() ||
      shard->range_.end != h.range_end() ||
      checkpoint.anchor.size() != shard->range_.size() ||
      checkpoint.momentum.size() != shard->range_.size()) {
    return data_loss(absl::StrCat("covers [", h.range_begin(), ", ",
                                  h.range_end(), ") but shard ",
                                  options.shard_index, " owns [",
                                  shard->range_.begin, ", ", shard->range_.end,
                                  ")"));
  }
  const uint32_t chunks = shard->num_chunks();
  // A shard re-seeded at a later round holds no update until it closes one.
  const size_t expected_chunks = h.rounds_closed() > 0 ? chunks : 0;
  if (!checkpoint.update_chunks.empty() &&
      checkpoint.update_chunks.size() != expected_chunks) {
    return data_loss(absl::StrCat("has ", checkpoint.update_chunks.size(),
                                  " update chunks, expected ",
                                  expected_chunks));
  }
  const common::Codec codec = common::Codec(h.config().downlink_codec());
  absl::MutexLock lock(&shard->mu_);
  shard->anchor_ = std::move(checkpoint.anchor);
  if (shard->outer_.beta != 0) shard->momentum_ = std::move(checkpoint.momentum);
  shard->anchor_ready_ = true;
  shard->rounds_closed_ = h.rounds_closed();
  shard->restored_quorum_misses_ = h.quorum_misses();
  const absl::Time lease_expiry = clock->Now() + options.lease;
  for (const v1::CheckpointMember& m : h.members()) {
    absl::StatusOr<common::Codec> uplink = common::CodecFromWire(m.uplink_codec());
    if (!uplink.ok()) return data_loss(std::string(uplink.status().message()));
    shard->members_[m.worker_id()] = Member{*uplink, lease_expiry};
    shard->rounds_.AddWorker(m.worker_id(), h.rounds_closed());
    shard->rounds_.RestoreCountedInPreviousRound(m.worker_id(),
                                                 m.counted_last_round());
  }
  if (checkpoint.update_chunks.empty()) return shard;
  auto update = std::make_shared<UpdateChunks>();
  for (uint32_t i = 0; i < chunks; ++i) {
    const common::Range r = common::ChunkRange(shard->range_.size(), i);
    std::string& bytes = checkpoint.update_chunks[i];
    absl::Status valid = common::Validate(codec, bytes, r.size());
    if (!valid.ok()) return data_loss(std::string(valid.message()));
    if (!shard->last_update_.empty()) {
      common::Decode(codec, bytes, absl::MakeSpan(shard->last_update_)
                                       .subspan(r.begin, r.size()));
    }
    update->push_back(shard->UpdateMessage(h.rounds_closed() - 1, i,
                                           h.update_contributors(),
                                           std::move(bytes)));
  }
  shard->cache_.push_back(std::move(update));
  return shard;
}

JobShard::JobShard(std::string job, const v1::JobConfig& config,
                   const JobShardOptions& options, common::Range range,
                   common::Clock* clock, uint64_t first_round)
    : job_(std::move(job)),
      config_(config),
      options_(options),
      range_(range),
      outer_(ToOuterConfig(config)),
      clock_(clock),
      rounds_(RoundOptions{range.size(), config.min_workers(),
                           absl::Milliseconds(config.round_timeout_ms()),
                           first_round},
              clock),
      anchor_(range.size()),
      momentum_(outer_.beta != 0 ? range.size() : 0),
      last_update_(common::Codec(config.downlink_codec()) ==
                           common::Codec::kFp32
                       ? 0
                       : range.size()) {}

JobShard::~JobShard() {
  std::vector<std::function<void(absl::Status)>> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(durable_waiters_);
  }
  for (auto& done : waiters) {
    done(absl::UnavailableError("shard shutting down before the checkpoint"));
  }
}

void JobShard::NotifyWhenDurable(std::function<void(absl::Status)> done) {
  if (options_.checkpoints == nullptr) {
    done(absl::OkStatus());
    return;
  }
  absl::MutexLock lock(&mu_);
  checkpoint_dirty_ = true;
  durable_waiters_.push_back(std::move(done));
}

uint32_t JobShard::num_chunks() const {
  return static_cast<uint32_t>(common::NumChunks(range_.size()));
}

absl::StatusOr<JoinResult> JobShard::Join(const std::string& worker,
                                          const v1::JobConfig& config,
                                          common::Codec uplink,
                                          std::optional<uint64_t> resume_round) {
  CO2_RETURN_IF_ERROR(common::CheckSameJobConfig(config_, config));
  absl::MutexLock lock(&mu_);
  if (evicted_.contains(worker)) return NotMemberLocked(worker);
  const bool lost_state = !anchor_ready_ && resume_round.has_value();
  if (lost_state && reseeding_ && !seeder_.empty() && seeder_ != worker) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" lost its state on shard ", options_.shard_index,
        " and is being re-seeded by worker \"", seeder_, "\"; retry"));
  }
  auto it = members_.find(worker);
  if (it == members_.end()) {
    if (members_.size() >= options_.max_workers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job \"", job_, "\" already has ", members_.size(),
                       " workers (limit ", options_.max_workers, ")"));
    }
    it = members_.emplace(std::string(worker), Member{}).first;
    checkpoint_dirty_ = true;
    // A worker of a fresh job takes part from round 0; one joining a running
    // job from the anchor round its Fetch returns (see Fetch); one resuming
    // after a reconnect from the round it is in.
    rounds_.AddWorker(worker, resume_round.value_or(
                                  rounds_closed_ == 0 ? 0 : UINT64_MAX));
    CO2_LOG(INFO) << "job " << job_ << ": worker " << worker
                  << (resume_round ? " rejoined" : " joined") << " ("
                  << members_.size() << " live)";
  }
  it->second.uplink = uplink;
  it->second.lease_expiry = clock_->Now() + options_.lease;
  JoinResult result;
  if (lost_state) {
    // A worker that was training holds the exact anchor; a fresh worker's
    // A_0 would restart the job, so the resuming worker seeds instead.
    if (!reseeding_ && !seeder_.empty()) {
      CO2_LOG(WARNING) << "job " << job_ << ": worker " << worker
                       << " re-seeds the lost state instead of " << seeder_
                       << "'s A_0";
    }
    seeder_ = std::string(worker);
    reseeding_ = true;
    seeded_chunks_ = 0;
    result.must_reseed = true;
    CO2_LOG(WARNING) << "job " << job_ << ": shard " << options_.shard_index
                     << " has no state for this running job (checkpoint "
                     << ReseedReasonName(options_.reseed_reason)
                     << "); asking worker " << worker
                     << " to re-seed it from its anchor";
  } else if (!anchor_ready_ && (seeder_.empty() || seeder_ == worker)) {
    seeder_ = std::string(worker);
    seeded_chunks_ = 0;
    result.must_seed = true;
  }
  result.open_round = rounds_.open_round();
  result.oldest_update_round = OldestUpdateRoundLocked();
  return result;
}

absl::Status JobShard::Heartbeat(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMemberLocked(worker);
  it->second.lease_expiry = clock_->Now() + options_.lease;
  return absl::OkStatus();
}

absl::Status JobShard::Leave(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (members_.erase(worker) == 0) return NotMemberLocked(worker);
  checkpoint_dirty_ = true;
  rounds_.RemoveWorker(worker);
  if (seeder_ == worker && !anchor_ready_) seeder_.clear();
  CO2_LOG(INFO) << "job " << job_ << ": worker " << worker << " left";
  return absl::OkStatus();
}

absl::StatusOr<common::Codec> JobShard::UplinkCodec(
    const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMemberLocked(worker);
  return it->second.uplink;
}

absl::Status JobShard::SeedChunk(const std::string& worker, uint32_t chunk_index,
                                 uint64_t anchor_round,
                                 const std::string& payload) {
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
  if (seeder_ != worker) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker \"", worker, "\" was not asked to seed (seeder is \"",
        seeder_, "\")"));
  }
  if (chunk_index != seeded_chunks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed chunk_index ", chunk_index, " out of order: expected ",
                     seeded_chunks_));
  }
  if (!reseeding_ && anchor_round != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a seed is the anchor of round 0, got anchor_round ", anchor_round));
  }
  if (reseeding_ && chunk_index == 0) reseed_anchor_round_ = anchor_round;
  if (reseeding_ && anchor_round != reseed_anchor_round_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-seed chunk ", chunk_index, " has anchor_round ", anchor_round,
        ", chunk 0 had ", reseed_anchor_round_));
  }
  common::Decode(common::Codec::kFp32, payload,
                 absl::MakeSpan(anchor_).subspan(chunk.begin, chunk.size()));
  if (++seeded_chunks_ == num_chunks()) {
    anchor_ready_ = true;
    checkpoint_dirty_ = true;
    round_opened_ = clock_->Now();
    if (reseeding_) {
      FinishReseedLocked();
    } else {
      CO2_LOG(INFO) << "job " << job_ << ": anchor seeded by " << worker;
    }
  }
  return absl::OkStatus();
}

void JobShard::FinishReseedLocked() {
  // The worker's anchor A_a starts round a, so the shard resumes as if it
  // had closed round a − 1 − s: its next update (of round a − s) turns A_a
  // into A_{a+1}, the update that worker and every worker at its round wait
  // for next. Momentum and gap restart from zero (they were only here).
  const uint64_t staleness = config_.max_staleness();
  rounds_closed_ = reseed_anchor_round_ > staleness
                       ? reseed_anchor_round_ - staleness
                       : 0;
  rounds_.Reopen(rounds_closed_);
  reseeding_ = false;
  ++stats_.reseeds;
  CO2_LOG(WARNING) << "job " << job_ << ": shard " << options_.shard_index
                   << " re-seeded by worker " << seeder_
                   << " with its anchor of round " << reseed_anchor_round_
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
  if (members_.find(worker) == members_.end()) return NotMemberLocked(worker);
  if (!anchor_ready_) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" has no anchor yet (being seeded by \"", seeder_,
        "\"); retry"));
  }
  // Workers fetch together (a job's start, a shard's restart): one copy of
  // the anchor serves them all, however many there are.
  std::shared_ptr<const AnchorSnapshot> snapshot = snapshot_.lock();
  if (snapshot == nullptr) {
    snapshot = SnapshotLocked();
    snapshot_ = snapshot;
  }
  rounds_.AddWorker(worker, snapshot->anchor_round);
  return snapshot;
}

std::shared_ptr<const AnchorSnapshot> JobShard::SnapshotLocked() const {
  auto snapshot = std::make_shared<AnchorSnapshot>();
  snapshot->anchor_round = AnchorRoundLocked();
  snapshot->chunks.resize(num_chunks());
  for (uint32_t i = 0; i < num_chunks(); ++i) {
    const common::Range chunk = common::ChunkRange(range_.size(), i);
    v1::AnchorChunk& message = snapshot->chunks[i];
    message.set_anchor_round(snapshot->anchor_round);
    message.set_chunk_index(i);
    std::string* bytes = message.mutable_payload();
    bytes->resize(chunk.size() * sizeof(float));
    common::Encode(common::Codec::kFp32,
                   absl::MakeConstSpan(anchor_).subspan(chunk.begin, chunk.size()),
                   absl::MakeSpan(bytes->data(), bytes->size()));
  }
  return snapshot;
}

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
  CO2_ASSIGN_OR_RETURN(common::Codec codec, common::CodecFromWire(c.codec));
  if (c.chunk_index >= num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_index ", c.chunk_index,
                     " out of range: shard has ", num_chunks(), " chunks"));
  }
  const size_t elements =
      common::ChunkRange(range_.size(), c.chunk_index).size();
  // The payload is read where it arrived, except int8 in several pieces,
  // whose scales lie apart from its values (common/payload_pieces.h).
  common::Pieces payload = c.payload;
  std::string gathered;
  std::string_view whole;
  if (codec == common::Codec::kInt8 && payload.size() > 1) {
    gathered = common::Gather(payload);
    whole = gathered;
    payload = common::Pieces(&whole, 1);
  }
  const size_t payload_size = common::TotalSize(payload);
  // The expensive scan for NaN/Inf runs outside the lock.
  absl::Status valid = common::ValidatePieces(codec, payload, elements);
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMemberLocked(worker);
  if (it->second.uplink != codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution codec ", std::string(common::CodecName(codec)),
        " differs from the codec worker \"", worker, "\" joined with (",
        std::string(common::CodecName(it->second.uplink)), ")"));
  }
  if (!valid.ok()) {
    return RejectLocked(worker, it->second,
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
        " yet (being seeded by \"", seeder_, "\"); retry"));
  }
  it->second.lease_expiry = clock_->Now() + options_.lease;
  absl::StatusOr<ChunkOutcome> added = rounds_.AddChunk(
      worker, c.round, c.chunk_index, codec, payload, c.weight);
  // RoundState refuses a bad weight, or values whose weighted sum would
  // overflow fp32, before counting anything: garbage like a NaN.
  if (added.status().code() == absl::StatusCode::kInvalidArgument) {
    return RejectLocked(worker, it->second, added.status());
  }
  it->second.consecutive_rejects = 0;
  CO2_ASSIGN_OR_RETURN(ChunkOutcome outcome, std::move(added));
  if (options_.observer != nullptr) {
    options_.observer->OnContribution(job_, codec, payload_size,
                                      outcome.folded, outcome.duplicate);
  }
  if (outcome.duplicate) ++stats_.duplicate_chunks;
  if (outcome.folded) ++stats_.late_chunks;
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const UpdateChunks>> JobShard::Subscribe(
    std::weak_ptr<UpdateSink> sink, uint64_t from_round) {
  absl::MutexLock lock(&mu_);
  sinks_.push_back(std::move(sink));
  std::vector<std::shared_ptr<const UpdateChunks>> replay;
  for (const auto& update : cache_) {
    if ((*update)[0]->round() >= from_round) replay.push_back(update);
  }
  return replay;
}

int JobShard::Poll() {
  std::optional<v1::ShardCheckpointHeader> header;
  std::vector<std::function<void(absl::Status)>> durable;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked();
    while (CloseRoundLocked()) {
    }
    ObservePollLocked();
    // Membership and the seeded anchor are made durable too, so a shard
    // that restarts before its first round closed still knows the job.
    const bool dirty = checkpoint_dirty_ && anchor_ready_ &&
                       options_.checkpoints != nullptr;
    if (unpublished_.empty() && !dirty) return 0;
    if (options_.checkpoints != nullptr) {
      if (clock_->Now() < checkpoint_retry_at_) return 0;
      header = CheckpointHeaderLocked();
      checkpoint_dirty_ = false;
    }
  }
  if (header.has_value()) {
    const absl::Time start = absl::Now();
    const absl::Status written = WriteCheckpoint(*header);
    absl::MutexLock lock(&mu_);
    if (!written.ok()) {
      // The update waits: releasing it before the state is durable could
      // leave workers ahead of a restarted shard.
      checkpoint_dirty_ = true;
      ++stats_.checkpoint_failures;
      checkpoint_retry_at_ = clock_->Now() + options_.checkpoint_retry;
      CO2_LOG(ERROR) << "job " << job_ << ": checkpoint of round "
                     << rounds_closed_ - 1 << " failed, update held: "
                     << written;
      return 0;
    }
    ++stats_.checkpoints_written;
    stats_.last_checkpoint_duration = absl::Now() - start;
    if (options_.observer != nullptr) {
      options_.observer->OnCheckpointWritten(job_,
                                             stats_.last_checkpoint_duration);
    }
    durable.swap(durable_waiters_);
  }
  for (auto& done : durable) done(absl::OkStatus());
  std::vector<std::shared_ptr<const UpdateChunks>> published;
  std::vector<std::shared_ptr<UpdateSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    published.swap(unpublished_);
    for (const auto& update : published) cache_.push_back(update);
    TrimCacheLocked(ReplayRounds());
    sinks = LiveSinksLocked();
  }
  for (const auto& update : published) {
    for (const auto& sink : sinks) sink->Send(update);
    if (options_.observer != nullptr) {
      size_t bytes = 0;
      for (const auto& chunk : *update) bytes += chunk->payload().size();
      options_.observer->OnUpdatePublished(
          job_, common::Codec(config_.downlink_codec()), bytes, sinks.size());
    }
  }
  return static_cast<int>(published.size());
}

absl::Time JobShard::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = rounds_.Deadline().value_or(absl::InfiniteFuture());
  if (!unpublished_.empty()) next = std::min(next, checkpoint_retry_at_);
  for (const auto& [worker, member] : members_) {
    next = std::min(next, member.lease_expiry);
  }
  return next;
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

absl::Status JobShard::NotMemberLocked(const std::string& worker) const {
  auto evicted = evicted_.find(worker);
  if (evicted == evicted_.end()) return NotMember(worker);
  return absl::FailedPreconditionError(absl::StrCat(
      "worker \"", worker, "\" was evicted from job \"", job_, "\": ",
      evicted->second, "; it cannot rejoin under this id"));
}

absl::Status JobShard::RejectLocked(const std::string& worker, Member& member,
                                   const absl::Status& invalid) {
  // Dropped before anything is accumulated; a worker that keeps sending
  // garbage (a diverged model) is evicted so it cannot stall the rounds.
  ++stats_.rejected_chunks;
  std::string message(invalid.message());
  const uint32_t rejects = ++member.consecutive_rejects;
  if (options_.max_rejected_chunks > 0 &&
      rejects >= options_.max_rejected_chunks) {
    EvictLocked(worker, absl::StrCat(rejects,
                                     " invalid contribution chunks in a row "
                                     "(last: ",
                                     message, ")"));
    absl::StrAppend(&message, "; worker \"", worker, "\" is evicted after ",
                    rejects, " invalid chunks in a row");
  }
  return absl::Status(invalid.code(), message);
}

void JobShard::EvictLocked(const std::string& worker, std::string reason) {
  CO2_LOG(WARNING) << "job " << job_ << ": evicting worker " << worker << ": "
                   << reason;
  members_.erase(worker);
  rounds_.RemoveWorker(worker);
  if (seeder_ == worker && !anchor_ready_) seeder_.clear();
  if (evicted_.size() >= options_.max_workers) evicted_.erase(evicted_.begin());
  evicted_[worker] = std::move(reason);
  ++stats_.evicted_workers;
}

uint64_t JobShard::OldestUpdateRoundLocked() const {
  if (!cache_.empty()) return (*cache_.front())[0]->round();
  if (!unpublished_.empty()) return (*unpublished_.front())[0]->round();
  return rounds_.open_round();
}

uint64_t JobShard::AnchorRoundLocked() const {
  // A_0 = A_1 (U_1 = 0), so before any round closed the anchor starts round 0.
  return rounds_closed_ == 0 ? 0 : rounds_closed_ + config_.max_staleness();
}

bool JobShard::CloseRoundLocked() {
  if (!anchor_ready_) return false;
  std::optional<ClosedRound> closed = rounds_.TryClose();
  if (!closed) return false;
  // The oldest update kept goes before the new one exists, so at most
  // ReplayRounds() rounds of encoded updates exist at any time (the last
  // update, the gap of this step, stays).
  TrimCacheLocked(ReplayRounds() - 1);
  std::shared_ptr<const UpdateChunks> update = StepLocked(*closed);
  if (closed->quorum_close) ++stats_.quorum_closes;
  ObserveRoundClosedLocked(*closed);
  ++rounds_closed_;
  unpublished_.push_back(std::move(update));
  snapshot_.reset();
  return true;
}

size_t JobShard::ReplayRounds() const {
  // A worker that reconnects asks for the rounds after the last update it
  // applied; it has contributed at most max_staleness rounds past that one,
  // so it misses at most the last max_staleness + 1 closed rounds.
  return config_.max_staleness() + 1;
}

void JobShard::TrimCacheLocked(size_t keep) {
  while (!cache_.empty() && cache_.size() + unpublished_.size() > keep) {
    cache_.erase(cache_.begin());
  }
}

std::shared_ptr<const v1::OuterUpdate> JobShard::UpdateMessage(
    uint64_t round, uint32_t chunk_index, uint32_t contributors,
    std::string payload) const {
  auto msg = std::make_shared<v1::OuterUpdate>();
  msg->set_round(round);
  msg->set_anchor_round(round + 1 + config_.max_staleness());
  msg->set_chunk_index(chunk_index);
  msg->set_num_chunks(num_chunks());
  msg->set_codec(v1::Codec(config_.downlink_codec()));
  msg->set_contributors(contributors);
  msg->set_payload(std::move(payload));
  return msg;
}

// Chunk by chunk: the step's reductions are per block and chunks are whole
// blocks, so this is the step on the whole range, with no range-sized
// temporaries. With the fp32 downlink the step writes U_{r+2} straight into
// the payload and reads the gap from the last update's payload, whose floats
// are the decoded update; other codecs encode U and decode it back into
// last_update_ (the next gap). Either way the anchor adds exactly the bits
// the workers decode, so anchors stay bit-identical on both sides.
std::shared_ptr<const UpdateChunks> JobShard::StepLocked(
    const ClosedRound& closed) {
  const common::Codec codec = common::Codec(config_.downlink_codec());
  const bool fp32 = codec == common::Codec::kFp32;
  const UpdateChunks* last = fp32 ? LastUpdateLocked() : nullptr;
  const size_t chunk_elements = std::min(range_.size(), common::kChunkElements);
  // Zeros: the gap before the first update (fp32), and m where β = 0.
  std::vector<float> no_gap(fp32 && last == nullptr ? chunk_elements : 0);
  std::vector<float> fresh_momentum(momentum_.empty() ? chunk_elements : 0);
  std::vector<float> encoded_from(fp32 ? 0 : chunk_elements);
  auto chunks = std::make_shared<UpdateChunks>();
  chunks->reserve(num_chunks());
  OuterStepStats step;
  double penalty_sum = 0;
  for (uint32_t i = 0; i < num_chunks(); ++i) {
    const common::Range r = common::ChunkRange(range_.size(), i);
    const absl::Span<const float> mean =
        absl::MakeConstSpan(closed.mean).subspan(r.begin, r.size());
    const absl::Span<const float> gap =
        !fp32 ? absl::MakeConstSpan(last_update_).subspan(r.begin, r.size())
        : last != nullptr ? Fp32Floats((*last)[i]->payload())
                          : absl::MakeConstSpan(no_gap).first(r.size());
    absl::Span<float> momentum;
    if (momentum_.empty()) {
      std::fill(fresh_momentum.begin(), fresh_momentum.end(), 0.0f);
      momentum = absl::MakeSpan(fresh_momentum).first(r.size());
    } else {
      momentum = absl::MakeSpan(momentum_).subspan(r.begin, r.size());
    }
    std::string payload(common::EncodedSize(codec, r.size()), '\0');
    absl::Span<float> update =
        fp32 ? Fp32Floats(payload)
             : absl::MakeSpan(encoded_from).first(r.size());
    AddStats(OuterStep(outer_, mean, gap, momentum, update), r.size(), &step,
             &penalty_sum);
    if (!fp32) {
      common::Encode(codec, update,
                     absl::MakeSpan(payload.data(), payload.size()));
      update = absl::MakeSpan(last_update_).subspan(r.begin, r.size());
      common::Decode(codec, payload, update);
    }
    auto anchor = absl::MakeSpan(anchor_).subspan(r.begin, r.size());
    for (size_t j = 0; j < r.size(); ++j) anchor[j] += update[j];
    chunks->push_back(
        UpdateMessage(closed.round, i, closed.contributors, std::move(payload)));
  }
  step.mean_penalty =
      range_.size() == 0 ? 1.0
                         : penalty_sum / static_cast<double>(range_.size());
  stats_.last_step = step;
  return chunks;
}

const UpdateChunks* JobShard::LastUpdateLocked() const {
  if (!unpublished_.empty()) return unpublished_.back().get();
  if (!cache_.empty()) return cache_.back().get();
  return nullptr;
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
  if (const UpdateChunks* update = LastUpdateLocked();
      update != nullptr && !update->empty()) {
    header.set_update_contributors(update->front()->contributors());
  }
  for (const auto& [worker, member] : members_) {
    v1::CheckpointMember* m = header.add_members();
    m->set_worker_id(worker);
    m->set_uplink_codec(v1::Codec(member.uplink));
    m->set_counted_last_round(rounds_.CountedInPreviousRound(worker));
  }
  return header;
}

absl::Status JobShard::WriteCheckpoint(const v1::ShardCheckpointHeader& header) {
  CheckpointView view;
  view.header = &header;
  view.anchor = anchor_;
  const ZeroFloats zeros(momentum_.empty() ? anchor_.size() : 0);
  if (!zeros.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", anchor_.size(), " zero floats for the momentum"));
  }
  view.momentum = momentum_.empty() ? zeros.span() : momentum_;
  if (const UpdateChunks* update = LastUpdateLocked(); update != nullptr) {
    for (const auto& chunk : *update) {
      view.update_chunks.push_back(&chunk->payload());
    }
  }
  return options_.checkpoints->Write(view);
}

void JobShard::ExpireLeasesLocked() {
  const absl::Time now = clock_->Now();
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.lease_expiry > now) {
      ++it;
      continue;
    }
    CO2_LOG(WARNING) << "job " << job_ << ": lease of worker " << it->first
                 << " expired; rounds close without it";
    rounds_.RemoveWorker(it->first);
    if (seeder_ == it->first && !anchor_ready_) seeder_.clear();
    members_.erase(it++);
    checkpoint_dirty_ = true;
  }
}

std::vector<std::shared_ptr<UpdateSink>> JobShard::LiveSinksLocked() {
  std::vector<std::shared_ptr<UpdateSink>> live;
  auto dead = std::remove_if(sinks_.begin(), sinks_.end(), [&](const auto& weak) {
    std::shared_ptr<UpdateSink> sink = weak.lock();
    if (sink == nullptr) return true;
    live.push_back(std::move(sink));
    return false;
  });
  sinks_.erase(dead, sinks_.end());
  return live;
}

void JobShard::ObserveRoundClosedLocked(const ClosedRound& closed) {
  const absl::Time now = clock_->Now();
  if (options_.observer != nullptr) {
    RoundClosedEvent event;
    event.round = closed.round;
    event.duration = now - round_opened_;
    event.contributors = closed.contributors;
    event.quorum_close = closed.quorum_close;
    event.step = stats_.last_step;
    event.elements = range_.size();
    options_.observer->OnRoundClosed(job_, event);
  }
  round_opened_ = now;
}

void JobShard::ObservePollLocked() {
  if (options_.observer == nullptr) return;
  ShardPollEvent event;
  event.live_workers = members_.size();
  event.open_round = rounds_.open_round();
  event.open_round_age =
      anchor_ready_ ? clock_->Now() - round_opened_ : absl::ZeroDuration();
  const uint64_t misses = rounds_.quorum_misses();
  event.new_quorum_misses = misses - observed_quorum_misses_;
  observed_quorum_misses_ = misses;
  options_.observer->OnPoll(job_, event);
}

}  // namespace co2::server
