#include "client/shard_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shard_calls.h"
#include "common/grpc_status.h"
#include "common/layout.h"
#include "common/logging.h"
#include "common/payload_pieces.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"

namespace co2::client {

struct ShardStream::Call {
  grpc::ClientContext context;
  std::unique_ptr<ExchangeStream> stream;
};

namespace {

// Codes that say the request itself is wrong: retrying cannot help.
bool IsTerminal(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

}  // namespace

ShardStream::ShardStream(const ShardStreamOptions& options,
                         std::shared_ptr<grpc::Channel> channel,
                         v1::Aggregator::Stub* stub)
    : options_(options),
      exchange_(std::move(channel)),
      stub_(stub),
      num_chunks_(
          static_cast<uint32_t>(common::NumChunks(options.shard_elements))),
      send_(options.uplink, options.shard_elements),
      resume_round_(options.first_contribution_round),
      recv_(num_chunks_),
      next_update_round_(options.first_update_round),
      recv_have_(num_chunks_, false) {
  {
    absl::MutexLock lock(&mu_);
    PublishReadyLocked();
  }
  reader_ = std::thread([this] { ReadLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
}

ShardStream::~ShardStream() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (call_) call_->context.TryCancel();
  }
  reader_.join();
  writer_.join();
}

absl::StatusOr<std::vector<absl::Span<char>>> ShardStream::BeginContribution(
    absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !error_.ok() || !has_contribution_ ||
           (next_send_ == num_chunks_ && !writing_ && ReadyLocked(send_round_));
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&free), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", options_.shard_index, ": contribution of round ",
                     send_round_, " still in flight at the deadline (",
                     next_send_, " of ", num_chunks_, " chunks written)"));
  }
  if (!error_.ok()) return error_;
  if (has_contribution_ && send_round_ == next_update_round_) {
    reported_ready_ = true;
  }
  has_contribution_ = false;
  return send_.Writable();
}

void ShardStream::CommitContribution(uint64_t round, double weight) {
  absl::MutexLock lock(&mu_);
  has_contribution_ = true;
  send_round_ = round;
  resume_round_ = round;
  send_weight_ = weight;
  next_send_ = 0;
}

bool ShardStream::ReadyLocked(uint64_t round) const {
  return round < next_update_round_ ||
         (round == next_update_round_ && recv_count_ == num_chunks_);
}

void ShardStream::PublishReadyLocked() {
  ready_before_.store(
      next_update_round_ + (recv_count_ == num_chunks_ ? 1 : 0),
      std::memory_order_release);
}

bool ShardStream::UpdateReady(uint64_t round) const {
  // Not yet arrived: the common answer between inner steps, without the lock
  // (a stale value only says "not yet" once more; every change is published
  // under mu_, before WaitForUpdate can see it).
  if (round >= ready_before_.load(std::memory_order_acquire)) return false;
  absl::MutexLock lock(&mu_);
  if (!ReadyLocked(round)) return false;
  if (round == next_update_round_) reported_ready_ = true;
  return true;
}

absl::Status ShardStream::WaitForUpdate(uint64_t round, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ReadyLocked(round) || !error_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", options_.shard_index, ": outer update of round ", round,
        " did not arrive by the deadline (", recv_count_, " of ", num_chunks_,
        " chunks of round ", next_update_round_, " received)"));
  }
  if (!ReadyLocked(round)) return error_;
  if (round == next_update_round_) reported_ready_ = true;
  return absl::OkStatus();
}

const std::vector<ReceivedUpdate>& ShardStream::UpdateChunks() const {
  return recv_;
}

void ShardStream::ReleaseUpdate(uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (round != next_update_round_) return;
  ++next_update_round_;
  DropUpdateLocked();
}

uint64_t ShardStream::NeededUpdateLocked() const {
  const bool kept = reported_ready_ && recv_count_ == num_chunks_;
  return next_update_round_ + (kept ? 1 : 0);
}

void ShardStream::DropUpdateLocked() {
  recv_count_ = 0;
  std::fill(recv_have_.begin(), recv_have_.end(), false);
  for (ReceivedUpdate& chunk : recv_) chunk = ReceivedUpdate();
  reported_ready_ = false;
  PublishReadyLocked();
}

ShardStreamStats ShardStream::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ShardStream::Fail(absl::Status status) {
  if (!error_.ok()) return;
  CO2_LOG(ERROR) << "shard " << options_.shard_index
                 << " stream failed: " << status;
  error_ = std::move(status);
}

absl::Status ShardStream::Rejoin() {
  v1::JoinRequest request = options_.join;
  {
    absl::MutexLock lock(&mu_);
    request.set_resume_round(resume_round_);
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::JoinResponse response;
  CO2_RETURN_IF_ERROR(
      common::FromGrpcStatus(stub_->Join(&context, request, &response)));
  if (response.must_reseed()) return Reseed();
  return CheckResumable(response.open_round(), response.oldest_update_round());
}

absl::Status ShardStream::Reseed() {
  if (options_.anchor == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_index,
        " lost the job's state and this worker lent no anchor to re-seed it "
        "(AggregatorClient::TrackAnchor)"));
  }
  // Every worker at this round holds the same anchor bits, so this copy is
  // the anchor the shard would have had. A received update the trainer will
  // apply is added as ApplyUpdate adds it, so the result is bit-identical to
  // the anchor this worker holds after applying it. Chunks of one it had not
  // taken were dropped when the stream broke (ReadLoop): the shard computes
  // that update afresh.
  std::vector<float> range(options_.shard_elements);
  uint64_t anchor_round = 0;
  CO2_RETURN_IF_ERROR(options_.anchor->ReadAnchor(
      options_.shard_index, [&](absl::Span<const float> anchor) {
        absl::MutexLock lock(&mu_);
        std::copy(anchor.begin(), anchor.end(), range.begin());
        const uint64_t needed = NeededUpdateLocked();
        if (needed > next_update_round_) {
          for (uint32_t c = 0; c < num_chunks_; ++c) {
            const common::Range r =
                common::ChunkRange(options_.shard_elements, c);
            common::AccumulatePieces(
                options_.downlink, recv_[c].payload, 1.0f,
                absl::MakeSpan(range).subspan(r.begin, r.size()));
          }
        }
        anchor_round = needed + options_.max_staleness;
      }));
  CO2_ASSIGN_OR_RETURN(
      const uint64_t seeded,
      SeedAnchor(stub_, options_.job, options_.worker_id, anchor_round, range,
                 absl::Now() + options_.reconnect_timeout));
  CO2_LOG(WARNING) << "shard " << options_.shard_index
                   << " lost the job's state; re-seeded it with this worker's"
                   << " anchor of round " << seeded;
  return absl::OkStatus();
}

absl::Status ShardStream::CheckResumable(uint64_t open_round,
                                         uint64_t oldest_update_round) {
  absl::MutexLock lock(&mu_);
  const uint64_t needed = NeededUpdateLocked();
  if (needed < oldest_update_round || needed > open_round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_index, " is at open round ", open_round,
        " and can replay updates from round ", oldest_update_round,
        ", but this worker needs the update of round ", needed,
        ": it cannot follow the shard (which restarted, or lost its state, "
        "while the workers were at different rounds); restart this worker "
        "so that it fetches the anchor"));
  }
  // Chunks of an update the trainer had not taken were dropped when the
  // stream broke (ReadLoop), so none from a shard that lost it are mixed
  // with the one it computes again.
  return absl::OkStatus();
}

bool ShardStream::Reconnect() {
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = generation_ == 0;
    }
    absl::Status joined = first ? absl::OkStatus() : Rejoin();
    if (!joined.ok() && IsTerminal(joined.code())) {
      absl::MutexLock lock(&mu_);
      Fail(joined);
      return false;
    }
    absl::Status status = joined;
    if (joined.ok()) {
      auto call = std::make_shared<Call>();
      v1::ExchangeOpen open;
      open.set_job(options_.job);
      open.set_worker_id(options_.worker_id);
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return false;
        open.set_replay_from_round(next_update_round_);
        // Installed before the first write so that shutdown can cancel it.
        call->stream = exchange_.Open(&call->context);
        call_ = call;
        call_open_ = false;
      }
      if (call->stream->Write(SerializeOpen(open))) {
        absl::MutexLock lock(&mu_);
        if (generation_ > 0) ++stats_.reconnects;
        ++generation_;
        call_open_ = true;
        // The shard may have lost what we sent: resend unless answered.
        if (has_contribution_ && !ReadyLocked(send_round_)) next_send_ = 0;
        return true;
      }
      status = common::FromGrpcStatus(call->stream->Finish());
    }
    absl::MutexLock lock(&mu_);
    if (IsTerminal(status.code())) {
      Fail(status);
      return false;
    }
    if (absl::Now() + backoff > give_up) {
      Fail(absl::UnavailableError(
          absl::StrCat("shard ", options_.shard_index, " unreachable for ",
                       absl::FormatDuration(options_.reconnect_timeout), ": ",
                       status.ToString())));
      return false;
    }
    auto stopping = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    // The destructor's stop_ ends the backoff and the reconnect.
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff)) return false;
    backoff = std::min(2 * backoff, options_.max_backoff);
  }
}

void ShardStream::ReadLoop() {
  while (Reconnect()) {
    std::shared_ptr<Call> call;
    {
      absl::MutexLock lock(&mu_);
      call = call_;
    }
    grpc::ByteBuffer message;
    while (call->stream->Read(&message)) {
      absl::StatusOr<ReceivedUpdate> update = ParseOuterUpdate(&message);
      if (!update.ok()) {
        absl::MutexLock lock(&mu_);
        Fail(absl::InternalError(absl::StrCat("shard ", options_.shard_index,
                                              " sent ",
                                              update.status().message())));
        continue;
      }
      HandleUpdate(*std::move(update));
    }
    call->context.TryCancel();  // unblocks a writer stuck on this call
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
      mu_.Await(absl::Condition(&idle));
    }
    const absl::Status status = common::FromGrpcStatus(call->stream->Finish());
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    if (IsTerminal(status.code())) {
      Fail(status);
      return;
    }
    CO2_LOG(WARNING) << "shard " << options_.shard_index << " stream broken ("
                     << status << "); reconnecting";
    ++stats_.broken_streams;
    // Chunks of an update the trainer has not taken yet may come from a
    // shard that then lost the state they were computed from: after a
    // re-seed it computes that round again, from the contributions of the
    // workers that rejoined it first. Ask for them again on the new stream
    // (a shard that kept its state replays the same bits). This is the one
    // place they are dropped: Rejoin runs only after a break.
    if (!reported_ready_) DropUpdateLocked();
  }
}

void ShardStream::HandleUpdate(ReceivedUpdate update) {
  const uint32_t index = update.chunk_index;
  for (const v1::HeldOutContribution& out : update.held_out) {
    if (out.worker_id() != options_.worker_id) continue;
    CO2_LOG(WARNING) << "shard " << options_.shard_index
                     << " held this worker's contribution to round "
                     << update.round << " chunk " << index
                     << " out of the mean: " << out.reason();
  }
  absl::Status valid;
  if (index >= num_chunks_ || update.codec != int(options_.downlink)) {
    valid = absl::InternalError(
        absl::StrCat("shard ", options_.shard_index, " sent update chunk ",
                     index, " with codec ", update.codec, "; expected < ",
                     num_chunks_, " chunks of codec ", int(options_.downlink)));
  } else {
    valid = common::ValidatePieces(
        options_.downlink, update.payload,
        common::ChunkRange(options_.shard_elements, index).size());
  }
  absl::MutexLock lock(&mu_);
  if (!valid.ok()) {
    Fail(valid);
    return;
  }
  // Hold a newer update until the trainer has applied the one before it, or
  // until a write on this call fails: the trainer may be waiting for its
  // contribution to go out, and only the reader, by reading this call to its
  // end, reconnects (or reports why the shard ended it). A dropped update is
  // replayed by the shard after the reconnect.
  const uint64_t generation = generation_;
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || update.round <= next_update_round_ ||
           failed_write_generation_ == generation;
  };
  mu_.Await(absl::Condition(&room));
  if (stop_ || update.round != next_update_round_ || recv_have_[index]) {
    return;
  }
  stats_.bytes_received += common::TotalSize(update.payload);
  recv_[index] = std::move(update);
  recv_have_[index] = true;
  ++recv_count_;
  PublishReadyLocked();
}

void ShardStream::WriteLoop() {
  while (true) {
    std::shared_ptr<Call> call;
    uint32_t index = 0;
    uint64_t generation = 0;
    ContributionHeader header;
    std::shared_ptr<const std::string> payload;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (call_ && call_open_ && error_.ok() &&
                         has_contribution_ && next_send_ < num_chunks_ &&
                         failed_write_generation_ != generation_);
      };
      mu_.Await(absl::Condition(&work));
      if (stop_) return;
      call = call_;
      generation = generation_;
      index = next_send_;
      writing_ = true;
      header.round = send_round_;
      header.chunk_index = index;
      header.codec = v1::Codec(options_.uplink);
      header.weight = send_weight_;
      payload = send_.Lend(index);
    }
    const size_t bytes = payload->size();
    const bool ok =
        call->stream->Write(SerializeContribution(header, std::move(payload)));
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      failed_write_generation_ =
          generation;  // wait for the reader to reconnect
    } else if (generation == generation_ && next_send_ == index) {
      next_send_ = index + 1;
      stats_.bytes_sent += bytes;
    }
  }
}

}  // namespace co2::client
