#include "server/job_shard.h"

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

absl::Status NotMember(const std::string& worker) {
  return absl::NotFoundError(absl::StrCat(
      "worker \"", worker, "\" is not a live member of this job (join first)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobShard>> JobShard::Create(
    std::string job, const v1::JobConfig& config,
    const JobShardOptions& options, common::Clock* clock) {
  CO2_RETURN_IF_ERROR(common::ValidateJobConfig(config));
  CO2_RETURN_IF_ERROR(ValidateOuterConfig(ToOuterConfig(config)));
  CO2_ASSIGN_OR_RETURN(
      common::Range range,
      common::ShardRangeFor(config.num_parameters(), config.num_shards(),
                            options.shard_index));
  return std::unique_ptr<JobShard>(
      new JobShard(std::move(job), config, options, range, clock));
}

JobShard::JobShard(std::string job, const v1::JobConfig& config,
                   const JobShardOptions& options, common::Range range,
                   common::Clock* clock)
    : job_(std::move(job)),
      config_(config),
      options_(options),
      range_(range),
      outer_(ToOuterConfig(config)),
      clock_(clock),
      rounds_(RoundOptions{range.size(), config.min_workers(),
                           absl::Milliseconds(config.round_timeout_ms())},
              clock),
      anchor_(range.size()),
      momentum_(range.size()),
      last_update_(range.size()) {}

uint32_t JobShard::num_chunks() const {
  return static_cast<uint32_t>(common::NumChunks(range_.size()));
}

absl::StatusOr<JoinResult> JobShard::Join(const std::string& worker,
                                          const v1::JobConfig& config,
                                          common::Codec uplink) {
  CO2_RETURN_IF_ERROR(common::CheckSameJobConfig(config_, config));
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) {
    if (members_.size() >= options_.max_workers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job \"", job_, "\" already has ", members_.size(),
                       " workers (limit ", options_.max_workers, ")"));
    }
    it = members_.emplace(std::string(worker), Member{}).first;
    // A worker of a fresh job takes part from round 0; one joining a running
    // job from the anchor round its Fetch returns (see Fetch).
    rounds_.AddWorker(worker, rounds_closed_ == 0 ? 0 : UINT64_MAX);
    CO2_LOG(INFO) << "job " << job_ << ": worker " << worker << " joined ("
              << members_.size() << " live)";
  }
  it->second.uplink = uplink;
  it->second.lease_expiry = clock_->Now() + options_.lease;
  JoinResult result;
  if (!anchor_ready_ && (seeder_.empty() || seeder_ == worker)) {
    seeder_ = std::string(worker);
    seeded_chunks_ = 0;
    result.must_seed = true;
  }
  result.open_round = rounds_.open_round();
  return result;
}

absl::Status JobShard::Heartbeat(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMember(worker);
  it->second.lease_expiry = clock_->Now() + options_.lease;
  return absl::OkStatus();
}

absl::Status JobShard::Leave(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (members_.erase(worker) == 0) return NotMember(worker);
  rounds_.RemoveWorker(worker);
  if (seeder_ == worker && !anchor_ready_) seeder_.clear();
  CO2_LOG(INFO) << "job " << job_ << ": worker " << worker << " left";
  return absl::OkStatus();
}

absl::StatusOr<common::Codec> JobShard::UplinkCodec(
    const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMember(worker);
  return it->second.uplink;
}

absl::Status JobShard::SeedChunk(const std::string& worker, uint32_t chunk_index,
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
  common::Decode(common::Codec::kFp32, payload,
                 absl::MakeSpan(anchor_).subspan(chunk.begin, chunk.size()));
  if (++seeded_chunks_ == num_chunks()) {
    anchor_ready_ = true;
    CO2_LOG(INFO) << "job " << job_ << ": anchor seeded by " << worker;
  }
  return absl::OkStatus();
}

absl::StatusOr<AnchorSnapshot> JobShard::Fetch(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (members_.find(worker) == members_.end()) return NotMember(worker);
  if (!anchor_ready_) {
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_, "\" has no anchor yet (being seeded by \"", seeder_,
        "\"); retry"));
  }
  AnchorSnapshot snapshot;
  snapshot.anchor_round = AnchorRoundLocked();
  snapshot.chunks.reserve(num_chunks());
  for (uint32_t i = 0; i < num_chunks(); ++i) {
    const common::Range chunk = common::ChunkRange(range_.size(), i);
    std::string bytes(chunk.size() * sizeof(float), '\0');
    common::Encode(common::Codec::kFp32,
                   absl::MakeConstSpan(anchor_).subspan(chunk.begin, chunk.size()),
                   absl::MakeSpan(bytes.data(), bytes.size()));
    snapshot.chunks.push_back(std::move(bytes));
  }
  rounds_.AddWorker(worker, snapshot.anchor_round);
  return snapshot;
}

absl::Status JobShard::Contribute(const std::string& worker,
                                  const v1::Contribution& c) {
  CO2_ASSIGN_OR_RETURN(common::Codec codec, common::CodecFromWire(c.codec()));
  if (c.chunk_index() >= num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_index ", c.chunk_index(),
                     " out of range: shard has ", num_chunks(), " chunks"));
  }
  const size_t elements = common::ChunkRange(range_.size(), c.chunk_index()).size();
  // The expensive scan for NaN/Inf runs outside the lock.
  absl::Status valid = common::Validate(codec, c.payload(), elements);
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker);
  if (it == members_.end()) return NotMember(worker);
  if (it->second.uplink != codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution codec ", std::string(common::CodecName(codec)),
        " differs from the codec worker \"", worker, "\" joined with (",
        std::string(common::CodecName(it->second.uplink)), ")"));
  }
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat("round ", c.round(), " chunk ",
                                     c.chunk_index(), ": ", valid.message()));
  }
  it->second.lease_expiry = clock_->Now() + options_.lease;
  CO2_ASSIGN_OR_RETURN(ChunkOutcome outcome,
                       rounds_.AddChunk(worker, c.round(), c.chunk_index(),
                                        codec, c.payload(), c.weight()));
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
  std::vector<std::shared_ptr<const UpdateChunks>> published;
  std::vector<std::shared_ptr<UpdateSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked();
    while (auto update = CloseRoundLocked()) published.push_back(*update);
    if (!published.empty()) sinks = LiveSinksLocked();
  }
  for (const auto& update : published) {
    for (const auto& sink : sinks) sink->Send(update);
  }
  return static_cast<int>(published.size());
}

absl::Time JobShard::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = rounds_.Deadline().value_or(absl::InfiniteFuture());
  for (const auto& [worker, member] : members_) {
    next = std::min(next, member.lease_expiry);
  }
  return next;
}

JobShardStats JobShard::stats() const {
  absl::MutexLock lock(&mu_);
  JobShardStats s = stats_;
  s.rounds_closed = rounds_closed_;
  s.quorum_misses = rounds_.quorum_misses();
  s.live_workers = members_.size();
  return s;
}

std::vector<float> JobShard::AnchorForTesting(uint64_t* anchor_round) const {
  absl::MutexLock lock(&mu_);
  *anchor_round = AnchorRoundLocked();
  return anchor_;
}

uint64_t JobShard::AnchorRoundLocked() const {
  // A_0 = A_1 (U_1 = 0), so before any round closed the anchor starts round 0.
  return rounds_closed_ == 0 ? 0 : rounds_closed_ + config_.max_staleness();
}

std::optional<std::shared_ptr<const UpdateChunks>> JobShard::CloseRoundLocked() {
  if (!anchor_ready_) return std::nullopt;
  std::optional<ClosedRound> closed = rounds_.TryClose();
  if (!closed) return std::nullopt;
  // The gap g of this step is the previous decoded update; OuterStep may write
  // the new update over it (element-wise).
  stats_.last_step = OuterStep(outer_, closed->mean, last_update_,
                               absl::MakeSpan(momentum_),
                               absl::MakeSpan(last_update_));
  if (closed->quorum_close) ++stats_.quorum_closes;
  ++rounds_closed_;
  auto update = EncodeUpdateLocked(*closed);
  cache_.push_back(update);
  if (cache_.size() > 2) cache_.erase(cache_.begin());
  return update;
}

std::shared_ptr<const UpdateChunks> JobShard::EncodeUpdateLocked(
    const ClosedRound& closed) {
  const common::Codec codec = common::Codec(config_.downlink_codec());
  auto chunks = std::make_shared<UpdateChunks>();
  chunks->reserve(num_chunks());
  for (uint32_t i = 0; i < num_chunks(); ++i) {
    const common::Range r = common::ChunkRange(range_.size(), i);
    auto update = absl::MakeSpan(last_update_).subspan(r.begin, r.size());
    auto msg = std::make_shared<v1::OuterUpdate>();
    msg->set_round(closed.round);
    msg->set_anchor_round(closed.round + 1 + config_.max_staleness());
    msg->set_chunk_index(i);
    msg->set_num_chunks(num_chunks());
    msg->set_codec(v1::Codec(config_.downlink_codec()));
    msg->set_contributors(closed.contributors);
    std::string* payload = msg->mutable_payload();
    payload->resize(common::EncodedSize(codec, r.size()));
    common::Encode(codec, update, absl::MakeSpan(payload->data(), payload->size()));
    // Keep exactly the bits the workers will decode, so anchors stay
    // bit-identical on both sides.
    common::Decode(codec, *payload, update);
    auto anchor = absl::MakeSpan(anchor_).subspan(r.begin, r.size());
    for (size_t j = 0; j < r.size(); ++j) anchor[j] += update[j];
    chunks->push_back(std::move(msg));
  }
  return chunks;
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

}  // namespace co2::server
