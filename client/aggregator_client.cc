#include "client/aggregator_client.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/casts.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/shard_calls.h"
#include "client/shard_stream.h"
#include "common/fnv_hash.h"
#include "common/grpc_status.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "common/logging.h"
#include "common/payload_pieces.h"
#include "common/status_macros.h"
#include "common/tls_probe.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"

namespace co2::client {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  context->set_deadline(absl::ToChronoTime(deadline));
}

absl::Status WithShard(uint32_t shard, const std::string& address,
                       absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("shard ", shard, " (", address, "): ", status.message()));
}

}  // namespace

class AggregatorClient::Impl : public AnchorSource {
 public:
  struct Shard {
    uint32_t index = 0;  // into ClientOptions::addresses
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Aggregator::Stub> stub;
    common::Range range;
    bool must_seed = false;
    uint64_t anchor_round = 0;
    // The round of the anchor range HealAnchor fetched when the shard had
    // moved past the round being healed: the updates up to that anchor are
    // in it already, and ApplyUpdate only checks their digests.
    uint64_t healed_to_round = 0;
    std::unique_ptr<ShardStream> stream;
    // The shard's last HeartbeatResponse.update_held (heartbeat thread).
    std::string update_held;
  };

  explicit Impl(ClientOptions options) : options_(std::move(options)) {}

  ~Impl() {
    StopHeartbeat();
    // The stream threads may read the anchor (ReadAnchor): stop them while
    // anchor_mu_ exists.
    for (Shard& shard : shards_) shard.stream.reset();
  }

  absl::Status Connect(absl::Span<float> anchor) {
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    CO2_RETURN_IF_ERROR(CheckJobConfig(anchor.size()));
    CO2_RETURN_IF_ERROR(TakeSlice(anchor.size()));
    CO2_RETURN_IF_ERROR(OpenChannels());
    CO2_RETURN_IF_ERROR(JoinShards(deadline));
    if (options_.resume_round.has_value()) {
      CO2_RETURN_IF_ERROR(ResumeAtRound(*options_.resume_round));
    } else {
      CO2_RETURN_IF_ERROR(DownloadAnchor(anchor, deadline));
    }
    OpenStreams();
    if (options_.uplink_codec != common::Codec::kFp32) {
      residual_.assign(anchor.size(), 0.0f);
    }
    CO2_LOG(INFO) << "worker " << options_.worker_id << " joined job "
                  << options_.job << " on " << shards_.size()
                  << " shards" << SliceNote() << "; starting at round "
                  << start_round_;
    return absl::OkStatus();
  }

  absl::Status Push(uint64_t round, absl::Span<const float> delta,
                    double weight, absl::Time deadline) {
    if (delta.size() != anchor_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta has ", delta.size(), " elements, ",
                       SizeOwner(), " has ", anchor_size()));
    }
    if (!(weight > 0) || !std::isfinite(weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight must be finite and > 0, got ", weight));
    }
    const absl::Time start = absl::Now();
    for (Shard& shard : shards_) {
      CO2_ASSIGN_OR_RETURN(const std::vector<absl::Span<char>> chunks,
                           shard.stream->BeginContribution(deadline));
      for (size_t c = 0; c < chunks.size(); ++c) {
        const common::Range r = common::ChunkRange(shard.range.size(), c);
        auto in = delta.subspan(Offset(shard) + r.begin, r.size());
        const absl::Span<char> out = chunks[c];
        if (residual_.empty()) {
          common::Encode(options_.uplink_codec, in, out);
        } else {
          common::EncodeWithFeedback(options_.uplink_codec, in,
                                     absl::MakeSpan(residual_).subspan(
                                         Offset(shard) + r.begin, r.size()),
                                     out);
        }
      }
      shard.stream->CommitContribution(round, weight);
    }
    absl::MutexLock lock(&mu_);
    ++stats_.rounds_pushed;
    stats_.push_wait += absl::Now() - start;
    return absl::OkStatus();
  }

  bool UpdateReady(uint64_t round) const {
    return std::all_of(shards_.begin(), shards_.end(), [&](const Shard& s) {
      return s.stream->UpdateReady(round);
    });
  }

  absl::Status WaitForUpdate(uint64_t round, absl::Time deadline) {
    const absl::Time start = absl::Now();
    for (const Shard& shard : shards_) {
      CO2_RETURN_IF_ERROR(shard.stream->WaitForUpdate(round, deadline));
    }
    absl::MutexLock lock(&mu_);
    stats_.update_wait += absl::Now() - start;
    return absl::OkStatus();
  }

  absl::Status TrackAnchor(absl::Span<const float> anchor) {
    if (anchor.size() != anchor_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("anchor has ", anchor.size(), " elements, ",
                       SizeOwner(), " has ", anchor_size()));
    }
    absl::MutexLock lock(&anchor_mu_);
    tracked_anchor_ = anchor;
    return absl::OkStatus();
  }

  absl::Status ReadAnchor(
      uint32_t shard,
      absl::FunctionRef<void(absl::Span<const float>)> read) override {
    absl::MutexLock lock(&anchor_mu_);
    if (tracked_anchor_.data() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard,
                       " lost the job's state and this worker lent no "
                       "anchor to re-seed it (AggregatorClient::TrackAnchor)"));
    }
    const Shard& owned = shards_[shard - shards_[0].index];
    read(tracked_anchor_.subspan(Offset(owned), owned.range.size()));
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> ApplyUpdate(uint64_t round,
                                       absl::Span<float> anchor) {
    // Held while the anchor changes, so a stream re-seeding a shard reads
    // either the anchor before this update or the one after it.
    absl::MutexLock anchor_lock(&anchor_mu_);
    if (tracked_anchor_.data() != nullptr &&
        (anchor.data() != tracked_anchor_.data() ||
         anchor.size() != tracked_anchor_.size())) {
      return absl::InvalidArgumentError(
          "ApplyUpdate was given another span than the tracked anchor");
    }
    if (!UpdateReady(round)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the outer update of round ", round, " has not arrived yet"));
    }
    const common::Codec codec =
        common::Codec(options_.job_config.downlink_codec());
    const uint64_t anchor_round =
        round + 1 + options_.job_config.max_staleness();
    // a += 1·decode(u) in one pass, no temporary: 1·x is exactly x, so this
    // is the shard's decode-then-add and both hold the same bits. Each
    // chunk's digest is taken right after, while it is in cache.
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      Shard& shard = shards_[i];
      const std::vector<ReceivedUpdate>& chunks = shard.stream->UpdateChunks();
      std::optional<size_t> mismatch;
      const bool included = anchor_round <= shard.healed_to_round;
      for (size_t c = 0; c < chunks.size(); ++c) {
        const common::Range r = common::ChunkRange(shard.range.size(), c);
        const absl::Span<float> values =
            anchor.subspan(Offset(shard) + r.begin, r.size());
        if (!included) {
          common::AccumulatePieces(codec, chunks[c].payload, 1.0f, values);
        }
        if (corrupt_next_update_ && !values.empty()) {
          corrupt_next_update_ = false;
          values[0] =
              absl::bit_cast<float>(absl::bit_cast<uint32_t>(values[0]) ^ 1u);
        }
        if (chunks[c].anchor_digest != 0 && !mismatch.has_value() &&
            common::AnchorDigest(values) != chunks[c].anchor_digest) {
          mismatch = c;
        }
      }
      shard.stream->ReleaseUpdate(round);
      if (mismatch.has_value()) {
        CO2_RETURN_IF_ERROR(HealAnchor(i, *mismatch, anchor_round, anchor));
      }
    }
    absl::MutexLock lock(&mu_);
    ++stats_.updates_received;
    return anchor_round;
  }

  void CorruptNextUpdateForTesting() {
    absl::MutexLock anchor_lock(&anchor_mu_);
    corrupt_next_update_ = true;
  }

  absl::Status VerifyAnchor(absl::Span<const float> anchor,
                            uint64_t anchor_round, absl::Time deadline) {
    if (anchor.size() != anchor_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("VerifyAnchor: the anchor has ", anchor.size(),
                       " elements, ", SizeOwner(), " ", anchor_size()));
    }
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      const Shard& shard = shards_[i];
      const absl::Span<const float> range =
          anchor.subspan(Offset(shard), shard.range.size());
      AnchorComparison theirs;
      CO2_RETURN_IF_ERROR(WithShard(
          shard.index, shard.address,
          RetryUnavailable(deadline, [&](absl::Time call) {
            absl::StatusOr<AnchorComparison> compared =
                CompareAnchor(shard.stub.get(), options_.job,
                              options_.worker_id, range, call);
            if (compared.ok()) theirs = *compared;
            return compared.status();
          })));
      if (theirs.anchor_round == anchor_round &&
          theirs.first_difference == SIZE_MAX) {
        continue;
      }
      std::vector<float> fetched(range.size());
      absl::StatusOr<uint64_t> round =
          FetchAnchor(shard.stub.get(), options_.job, options_.worker_id,
                      absl::MakeSpan(fetched), deadline);
      const std::string their_hash =
          round.ok() ? absl::StrCat(
                           absl::Hex(common::Fnv1a(fetched), absl::kZeroPad16))
                     : "unknown";
      return absl::DataLossError(absl::StrCat(
          "shard ", shard.index, " (", shard.address,
          ") holds the anchor of round ",
          theirs.anchor_round, ", this worker that of round ", anchor_round,
          theirs.first_difference == SIZE_MAX
              ? std::string(" with the same bits")
              : absl::StrCat(", first different at element ",
                             shard.range.begin + theirs.first_difference),
          "; FNV-1a of the range [", shard.range.begin, ", ", shard.range.end,
          "): shard ", their_hash, ", worker ",
          absl::Hex(common::Fnv1a(range), absl::kZeroPad16)));
    }
    return absl::OkStatus();
  }

  absl::Status Leave(absl::Time deadline) {
    // A lease renewed after the Leave would be refused: the worker is no
    // longer a member, and the end of a job is no error.
    StopHeartbeat();
    absl::Status result;
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      grpc::ClientContext context;
      SetDeadline(&context, deadline);
      v1::LeaveRequest request;
      request.set_job(options_.job);
      request.set_worker_id(options_.worker_id);
      v1::LeaveResponse response;
      absl::Status s = common::FromGrpcStatus(
          shards_[i].stub->Leave(&context, request, &response));
      if (result.ok()) {
        result = WithShard(shards_[i].index, shards_[i].address, s);
      }
    }
    return result;
  }

  absl::Span<const float> residual() const { return residual_; }
  absl::Status RestoreResidual(absl::Span<const float> residual) {
    if (residual.size() != residual_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the residual has ", residual.size(), " elements; this client's ",
          std::string(common::CodecName(options_.uplink_codec)),
          " uplink keeps ", residual_.size()));
    }
    std::copy(residual.begin(), residual.end(), residual_.begin());
    return absl::OkStatus();
  }

  ClientStats stats() const {
    absl::MutexLock lock(&mu_);
    ClientStats s = stats_;
    for (const Shard& shard : shards_) {
      if (!shard.stream) continue;
      const ShardStreamStats ss = shard.stream->stats();
      s.bytes_sent += ss.bytes_sent;
      s.bytes_received += ss.bytes_received;
      s.broken_streams += ss.broken_streams;
      s.reconnects += ss.reconnects;
    }
    return s;
  }

  uint64_t start_round() const { return start_round_; }
  const v1::JobConfig& job_config() const { return options_.job_config; }
  common::Range slice() const { return slice_; }

 private:
  // The job's settings with this model's size and the shards' count.
  absl::Status CheckJobConfig(size_t anchor_elements) {
    v1::JobConfig& config = options_.job_config;
    if (options_.owned_shards.has_value() && options_.num_parameters == 0) {
      return absl::InvalidArgumentError(
          "owned_shards needs num_parameters, the whole model's size");
    }
    config.set_num_parameters(options_.num_parameters != 0
                                  ? options_.num_parameters
                                  : anchor_elements);
    config.set_num_shards(static_cast<uint32_t>(options_.addresses.size()));
    if (options_.addresses.empty()) {
      return absl::InvalidArgumentError("no aggregator addresses given");
    }
    if (options_.worker_id.empty()) {
      return absl::InvalidArgumentError("worker_id is empty");
    }
    return common::ValidateJobConfig(config);
  }

  // The owned shards (all by default) and the slice of the model they
  // serve, which the anchor must fill.
  absl::Status TakeSlice(size_t anchor_elements) {
    const size_t p = options_.job_config.num_parameters();
    const size_t s = options_.addresses.size();
    const common::Range owned = options_.owned_shards.value_or(
        common::Range{0, s});
    if (owned.begin >= owned.end || owned.end > s) {
      return absl::InvalidArgumentError(
          absl::StrCat("owned_shards [", owned.begin, ", ", owned.end,
                       ") is not a non-empty range of the ", s, " shards"));
    }
    CO2_ASSIGN_OR_RETURN(const common::Range first,
                         common::ShardRangeFor(p, s, owned.begin));
    CO2_ASSIGN_OR_RETURN(const common::Range last,
                         common::ShardRangeFor(p, s, owned.end - 1));
    slice_ = common::Range{first.begin, last.end};
    if (anchor_elements != slice_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the anchor has ", anchor_elements, " elements, but shards [",
          owned.begin, ", ", owned.end, ") of ", s, " serve [", slice_.begin,
          ", ", slice_.end, ") of the job's ", p, " parameters"));
    }
    shards_.resize(owned.size());
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      shards_[i].index = static_cast<uint32_t>(owned.begin + i);
    }
    return absl::OkStatus();
  }

  // Where shard `shard`'s range starts in this client's spans.
  size_t Offset(const Shard& shard) const {
    return shard.range.begin - slice_.begin;
  }

  // Whose size the spans must have, for errors.
  std::string SizeOwner() const {
    if (slice_.size() == options_.job_config.num_parameters()) return "the job";
    return absl::StrCat("this client's slice [", slice_.begin, ", ",
                        slice_.end, ")");
  }

  std::string SliceNote() const {
    if (slice_.size() == options_.job_config.num_parameters()) return "";
    return absl::StrCat(" (", shards_.front().index, " to ",
                        shards_.back().index, ", parameters [", slice_.begin,
                        ", ", slice_.end, "))");
  }

  absl::Status OpenChannels() {
    CO2_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         common::MakeChannelCredentials(
                             options_.tls, options_.token, options_.job));
    for (Shard& shard : shards_) {
      shard.address = options_.addresses[shard.index];
      shard.channel =
          MakeShardChannel(shard.address, credentials, options_.initial_backoff,
                           options_.max_backoff);
      shard.stub = v1::Aggregator::NewStub(shard.channel);
    }
    return absl::OkStatus();
  }

  // A lease runs from the Join: the rest of Connect can outlast it (a shard
  // that is restarting, a seeder that is slow), so heartbeats start first.
  absl::Status JoinShards(absl::Time deadline) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      Shard& shard = shards_[i];
      CO2_RETURN_IF_ERROR(WithShard(
          shard.index, shard.address,
          common::WithTransportHint(Join(shard, deadline), options_.tls)));
      absl::MutexLock lock(&mu_);
      joined_shards_ = i + 1;
    }
    return absl::OkStatus();
  }

  // A resuming worker starts at its own round with its own anchor, which
  // every shard must still hold the job for.
  absl::Status ResumeAtRound(uint64_t round) {
    for (const Shard& shard : shards_) {
      if (shard.must_seed) {
        return WithShard(
            shard.index, shard.address,
            absl::FailedPreconditionError(absl::StrCat(
                "the shard does not hold job \"", options_.job,
                "\" any more, so it cannot resume at round ", round,
                " (shards keep jobs across restarts with --checkpoint_dir)")));
      }
    }
    start_round_ = round;
    return absl::OkStatus();
  }

  // Seeds the shards that ask for it with `anchor`'s ranges, fetches the
  // others' into it, and starts at the anchor's round.
  absl::Status DownloadAnchor(absl::Span<float> anchor, absl::Time deadline) {
    for (Shard& shard : shards_) {
      absl::Status status = shard.must_seed ? Seed(shard, anchor, deadline)
                                            : Fetch(shard, anchor, deadline);
      CO2_RETURN_IF_ERROR(WithShard(shard.index, shard.address, status));
    }
    CO2_RETURN_IF_ERROR(AgreeOnAnchorRound(anchor, deadline));
    start_round_ = shards_[0].anchor_round;
    return absl::OkStatus();
  }

  // One ShardStream a shard, from the first update a worker starting at
  // start_round_ applies.
  void OpenStreams() {
    const v1::JobConfig& config = options_.job_config;
    const uint64_t staleness = config.max_staleness();
    const uint64_t first_update =
        start_round_ >= staleness ? start_round_ - staleness : 0;
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      ShardStreamOptions so;
      so.job = options_.job;
      so.worker_id = options_.worker_id;
      so.shard_index = shards_[i].index;
      so.shard_elements = shards_[i].range.size();
      so.uplink = options_.uplink_codec;
      so.downlink = common::Codec(config.downlink_codec());
      so.first_update_round = first_update;
      so.first_contribution_round = start_round_;
      so.max_staleness = config.max_staleness();
      so.anchor = this;
      so.join = JoinRequest();
      so.rpc_timeout = options_.rpc_timeout;
      so.reconnect_timeout = options_.reconnect_timeout;
      so.initial_backoff = options_.initial_backoff;
      so.max_backoff = options_.max_backoff;
      shards_[i].stream = std::make_unique<ShardStream>(so, shards_[i].channel,
                                                        shards_[i].stub.get());
    }
  }

  v1::JoinRequest JoinRequest() const {
    v1::JoinRequest request;
    request.set_job(options_.job);
    request.set_worker_id(options_.worker_id);
    *request.mutable_config() = options_.job_config;
    request.set_uplink_codec(v1::Codec(options_.uplink_codec));
    request.set_rejoin(options_.rejoin);
    if (options_.resume_round) request.set_resume_round(*options_.resume_round);
    return request;
  }

  // Shard `i`'s range of `anchor` differed from its digest after the update
  // that made `anchor_round` (first at chunk `chunk`): counts and logs it and
  // fetches the range again. The shard may hold a later anchor by then (it
  // closed the next round meanwhile, at most max_staleness + 1 rounds on):
  // that range is then ahead of the rest, and the updates it includes are
  // not added again (Shard::healed_to_round). DATA_LOSS if the fetch fails
  // or returns an older anchor or one further ahead.
  absl::Status HealAnchor(uint32_t i, size_t chunk, uint64_t anchor_round,
                          absl::Span<float> anchor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(anchor_mu_) {
    Shard& shard = shards_[i];
    {
      absl::MutexLock lock(&mu_);
      ++stats_.anchor_mismatches;
    }
    CO2_LOG(WARNING) << "worker " << options_.worker_id << ": the anchor of "
                     << "round " << anchor_round << " differs from shard "
                     << shard.index
                     << "'s digest (chunk " << chunk << ", elements from "
                     << shard.range.begin +
                            common::ChunkRange(shard.range.size(), chunk).begin
                     << "); fetching the shard's range [" << shard.range.begin
                     << ", " << shard.range.end << ") again";
    absl::StatusOr<uint64_t> fetched =
        FetchAnchor(shard.stub.get(), options_.job, options_.worker_id,
                    anchor.subspan(Offset(shard), shard.range.size()),
                    absl::Now() + options_.rpc_timeout);
    auto cannot_mend = [&](const std::string& why) {
      return WithShard(shard.index, shard.address,
                       absl::DataLossError(absl::StrCat(
                           "the anchor of round ", anchor_round,
                           " differs from the shard's digest", why)));
    };
    if (!fetched.ok()) {
      return cannot_mend(absl::StrCat(" and fetching it again failed: ",
                                      fetched.status().ToString()));
    }
    const uint64_t ahead = options_.job_config.max_staleness() + 1;
    if (*fetched < anchor_round || *fetched > anchor_round + ahead) {
      return cannot_mend(
          absl::StrCat(", and the shard holds the anchor of round ", *fetched,
                       ": this worker cannot mend it; restart it"));
    }
    shard.healed_to_round = *fetched;
    CO2_LOG(INFO) << "worker " << options_.worker_id << ": shard "
                  << shard.index << "'s range fetched again, the anchor of round " << *fetched;
    return absl::OkStatus();
  }

  // Join, retrying while the shard is unavailable (e.g. still starting).
  absl::Status Join(Shard& shard, absl::Time deadline) {
    const v1::JoinRequest request = JoinRequest();
    v1::JoinResponse response;
    bool probed = false;
    CO2_RETURN_IF_ERROR(
        RetryUnavailable(deadline, [&](absl::Time call_deadline) {
          grpc::ClientContext context;
          SetDeadline(&context, call_deadline);
          absl::Status status = common::FromGrpcStatus(
              shard.stub->Join(&context, request, &response));
          if (status.code() == absl::StatusCode::kUnavailable &&
              options_.tls.enabled() && !probed) {
            // gRPC says UNAVAILABLE for a shard that is down and for one
            // that refuses this worker's TLS alike; only the first is worth
            // waiting for.
            probed = true;
            absl::Status tls = common::ProbeTlsHandshake(
                shard.address, options_.tls,
                std::min(options_.rpc_timeout, absl::Seconds(5)));
            if (tls.code() == absl::StatusCode::kUnauthenticated ||
                tls.code() == absl::StatusCode::kInvalidArgument) {
              return tls;
            }
          }
          return status;
        }));
    CO2_ASSIGN_OR_RETURN(
        shard.range,
        common::ShardRangeFor(options_.job_config.num_parameters(),
                              shards_size(), shard.index));
    if (response.range_begin() != shard.range.begin ||
        response.range_end() != shard.range.end) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard serves [", response.range_begin(), ", ",
                       response.range_end(), ") but this worker expects [",
                       shard.range.begin, ", ", shard.range.end, ")"));
    }
    shard.must_seed = response.must_seed();
    return absl::OkStatus();
  }

  absl::Status Seed(Shard& shard, absl::Span<const float> anchor,
                    absl::Time deadline) {
    CO2_ASSIGN_OR_RETURN(
        shard.anchor_round,
        SeedAnchor(shard.stub.get(), options_.job, options_.worker_id,
                   /*anchor_round=*/0,
                   anchor.subspan(Offset(shard), shard.range.size()),
                   deadline));
    return absl::OkStatus();
  }

  // Downloads the shard's anchor into its range of `anchor`, retrying while
  // the shard says it is not seeded yet.
  absl::Status Fetch(Shard& shard, absl::Span<float> anchor,
                     absl::Time deadline) {
    return RetryUnavailable(deadline, [&](absl::Time call_deadline) {
      absl::StatusOr<uint64_t> round = FetchAnchor(
          shard.stub.get(), options_.job, options_.worker_id,
          anchor.subspan(Offset(shard), shard.range.size()), call_deadline);
      if (round.ok()) shard.anchor_round = *round;
      return round.status();
    });
  }

  // Shards may close a round between our fetches; refetch until all agree.
  absl::Status AgreeOnAnchorRound(absl::Span<float> anchor,
                                  absl::Time deadline) {
    while (true) {
      uint64_t newest = 0;
      for (const Shard& s : shards_) newest = std::max(newest, s.anchor_round);
      bool agreed = true;
      for (Shard& s : shards_) {
        if (s.anchor_round == newest) continue;
        agreed = false;
        if (s.must_seed) {
          return absl::AbortedError(absl::StrCat(
              "seeded shard at round 0 but others are at round ", newest));
        }
        CO2_RETURN_IF_ERROR(Fetch(s, anchor, deadline));
      }
      if (agreed) return absl::OkStatus();
    }
  }

  // Retries `call` on UNAVAILABLE, and on CANCELLED: a shard that shuts down
  // (to restart) cancels the calls in flight. (Where Fetch cancels its own
  // call, it returns the reason instead.)
  template <typename Call>
  absl::Status RetryUnavailable(absl::Time deadline, Call call) {
    absl::Duration backoff = options_.initial_backoff;
    while (true) {
      const absl::Time call_deadline =
          std::min(deadline, absl::Now() + options_.rpc_timeout);
      absl::Status status = call(call_deadline);
      if (status.code() != absl::StatusCode::kUnavailable &&
          status.code() != absl::StatusCode::kCancelled) {
        return status;
      }
      if (absl::Now() + backoff >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "gave up after ", absl::FormatDuration(options_.connect_timeout),
            ": ", status.message()));
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff);
      if (stop_) return absl::CancelledError("client shutting down");
      backoff = std::min(2 * backoff, options_.max_backoff);
    }
  }

  // Renews the leases of the shards joined so far, every lease / 3. A call
  // gets no longer than that interval, so that one unreachable shard (a cut
  // link answers nothing) cannot let the others' leases run out.
  void StopHeartbeat() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void HeartbeatLoop() {
    absl::Duration interval = absl::Seconds(1);
    while (true) {
      uint32_t joined;
      {
        absl::MutexLock lock(&mu_);
        joined = joined_shards_;
      }
      const absl::Duration call_timeout =
          std::min(options_.rpc_timeout, interval);
      interval = absl::Seconds(1);
      for (uint32_t i = 0; i < joined; ++i) {
        const absl::StatusOr<LeaseRenewal> renewed =
            RenewLease(shards_[i].stub.get(), options_.job, options_.worker_id,
                       absl::Now() + call_timeout);
        if (renewed.ok()) {
          interval = std::min(interval, renewed->lease / 3);
          SetUpdateHeld(i, renewed->update_held);
        } else {
          CO2_LOG(WARNING) << "heartbeat to shard " << shards_[i].index
                           << " failed: " << renewed.status().message();
        }
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), interval);
      if (stop_) return;
    }
  }

  // What shard `i` said about updates it holds back, told to whoever waits:
  // a WARNING when it starts holding them or its reason changes, a line
  // when it stops. Heartbeat thread only.
  void SetUpdateHeld(uint32_t i, const std::string& held) {
    std::string& was = shards_[i].update_held;
    if (held == was) return;
    if (!held.empty()) {
      CO2_LOG(WARNING) << "shard " << shards_[i].index << " ("
                       << shards_[i].address
                       << "): update held: " << held
                       << "; this worker waits for it";
    } else {
      CO2_LOG(INFO) << "shard " << shards_[i].index << " ("
                    << shards_[i].address
                    << "): no update held any more";
    }
    was = held;
  }

  // The size of every span: the slice's.
  size_t anchor_size() const { return slice_.size(); }
  size_t shards_size() const { return options_.addresses.size(); }

  ClientOptions options_;
  common::Range slice_;  // of the whole model's elements
  std::vector<Shard> shards_;  // the owned ones, in index order
  uint64_t start_round_ = 0;
  std::vector<float> residual_;  // error feedback; empty for fp32
  std::thread heartbeat_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Shards [0, joined_shards_) have been joined: the heartbeat renews them.
  uint32_t joined_shards_ ABSL_GUARDED_BY(mu_) = 0;
  ClientStats stats_ ABSL_GUARDED_BY(mu_);
  // Taken before a stream's lock, never after it.
  absl::Mutex anchor_mu_;
  absl::Span<const float> tracked_anchor_ ABSL_GUARDED_BY(anchor_mu_);
  bool corrupt_next_update_ ABSL_GUARDED_BY(anchor_mu_) = false;
};

absl::StatusOr<std::unique_ptr<AggregatorClient>> AggregatorClient::Connect(
    ClientOptions options, absl::Span<float> anchor) {
  auto impl = std::make_unique<Impl>(std::move(options));
  CO2_RETURN_IF_ERROR(impl->Connect(anchor));
  return std::unique_ptr<AggregatorClient>(
      new AggregatorClient(std::move(impl)));
}

AggregatorClient::AggregatorClient(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
AggregatorClient::~AggregatorClient() = default;

uint64_t AggregatorClient::start_round() const { return impl_->start_round(); }
const v1::JobConfig& AggregatorClient::job_config() const {
  return impl_->job_config();
}
common::Range AggregatorClient::slice() const { return impl_->slice(); }
absl::Status AggregatorClient::Push(uint64_t round,
                                    absl::Span<const float> delta,
                                    double weight, absl::Time deadline) {
  return impl_->Push(round, delta, weight, deadline);
}
bool AggregatorClient::UpdateReady(uint64_t round) const {
  return impl_->UpdateReady(round);
}
absl::Status AggregatorClient::WaitForUpdate(uint64_t round,
                                             absl::Time deadline) {
  return impl_->WaitForUpdate(round, deadline);
}
absl::StatusOr<uint64_t> AggregatorClient::ApplyUpdate(
    uint64_t round, absl::Span<float> anchor) {
  return impl_->ApplyUpdate(round, anchor);
}
absl::Status AggregatorClient::TrackAnchor(absl::Span<const float> anchor) {
  return impl_->TrackAnchor(anchor);
}
absl::Status AggregatorClient::VerifyAnchor(absl::Span<const float> anchor,
                                            uint64_t anchor_round,
                                            absl::Time deadline) {
  return impl_->VerifyAnchor(anchor, anchor_round, deadline);
}
void AggregatorClient::CorruptNextUpdateForTesting() {
  impl_->CorruptNextUpdateForTesting();
}
absl::Status AggregatorClient::Leave(absl::Time deadline) {
  return impl_->Leave(deadline);
}
absl::Span<const float> AggregatorClient::residual() const {
  return impl_->residual();
}
absl::Status AggregatorClient::RestoreResidual(
    absl::Span<const float> residual) {
  return impl_->RestoreResidual(residual);
}
ClientStats AggregatorClient::stats() const { return impl_->stats(); }

}  // namespace co2::client
