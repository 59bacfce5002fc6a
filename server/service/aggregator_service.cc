#include "server/service/aggregator_service.h"

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/codec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/service/call_auth.h"
#include "server/service/exchange_wire.h"
#include "server/service/reaction_order.h"
#include "server/service/rpc_wire.h"

namespace co2::server {
namespace {

absl::Status ValidateId(absl::string_view what, const std::string& id) {
  if (id.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (id.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", id.size(), " bytes long (limit ", kMaxIdLength, ")"));
  }
  return absl::OkStatus();
}

// The call's credentials must be good for `job` (a refusal is logged and
// counted by `refused`).
absl::Status Authorize(const grpc::CallbackServerContext* context,
                       RefusedCalls* refused, const std::string& job) {
  return refused->Check(CheckJobAccess(*context, job), context->peer());
}

absl::StatusOr<std::shared_ptr<JobShard>> FindJob(
    const grpc::CallbackServerContext* context, JobRegistry* registry,
    RefusedCalls* refused, const std::string& job, const std::string& worker) {
  CO2_RETURN_IF_ERROR(ValidateId("job", job));
  CO2_RETURN_IF_ERROR(ValidateId("worker_id", worker));
  CO2_RETURN_IF_ERROR(Authorize(context, refused, job));
  return registry->Find(job);
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

// A unary call: parses the request, runs `handle` on it, and finishes with
// its status and, when OK, the response it filled in serialised into `out`.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer& in,
                                grpc::ByteBuffer* out, Handle handle) {
  Request request;
  Response response;
  absl::Status status = ParseRequest(in, &request);
  if (status.ok()) status = handle(request, &response);
  if (status.ok()) *out = SerializeMessage(response);
  return FinishUnary(context, status);
}

absl::Status DoJoin(const grpc::CallbackServerContext* context,
                    JobRegistry* registry, RefusedCalls* refused,
                    const v1::JoinRequest& request,
                    v1::JoinResponse* response) {
  CO2_ASSIGN_OR_RETURN(common::Codec uplink,
                       common::CodecFromWire(request.uplink_codec()));
  CO2_RETURN_IF_ERROR(ValidateId("job", request.job()));
  CO2_RETURN_IF_ERROR(ValidateId("worker_id", request.worker_id()));
  CO2_RETURN_IF_ERROR(Authorize(context, refused, request.job()));
  const v1::JobConfig config = registry->WithDefaults(request.config());
  CO2_ASSIGN_OR_RETURN(std::shared_ptr<JobShard> job,
                       registry->GetOrCreate(request.job(), config, request.rejoin()));
  CO2_ASSIGN_OR_RETURN(JoinResult joined,
                       job->Join(request.worker_id(), config, uplink,
                                 request.has_resume_round()
                                     ? std::optional<uint64_t>(request.resume_round())
                                     : std::nullopt,
                                 request.rejoin()));
  response->set_shard_index(registry->options().shard_index);
  response->set_range_begin(job->range().begin);
  response->set_range_end(job->range().end);
  response->set_num_chunks(job->num_chunks());
  response->set_must_seed(joined.must_seed);
  response->set_must_reseed(joined.must_reseed);
  response->set_open_round(joined.open_round);
  response->set_oldest_update_round(joined.oldest_update_round);
  response->set_lease_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(registry->options().shard.lease)));
  return absl::OkStatus();
}

// Receives A_0 (or a re-seed) chunk by chunk from the worker told to seed.
// All or nothing: a stream that ends before its last chunk, or with an
// error, leaves none of its chunks counted, so the seeder can retry.
class SeedReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  SeedReactor(const grpc::CallbackServerContext* context, JobRegistry* registry,
              RefusedCalls* refused, grpc::ByteBuffer* response)
      : context_(context),
        registry_(registry),
        refused_(refused),
        response_(response) {
    ReactionOrderStarting(this);
    StartRead(&body_);
  }

  void OnReadDone(bool ok) override {
    ReactionOrderReacting(this);
    if (!ok) {
      absl::Status complete = Complete();
      if (!complete.ok()) {
        Fail(complete);
        return;
      }
      // The seed is acknowledged once the anchor is durable, so a shard that
      // restarts right after cannot have forgotten the job.
      job_->NotifyWhenDurable(
          [this](absl::Status s) {
            ReactionOrderStarting(this);
            Finish(common::ToGrpcStatus(s));
          });
      registry_->Wake();
      return;
    }
    absl::Status status = Accept();
    if (!status.ok()) {
      Fail(status);
      return;
    }
    ReactionOrderStarting(this);
    StartRead(&body_);
  }

  void OnDone() override {
    ReactionOrderReacting(this);
    delete this;
  }

 private:
  // Ends the call with `status`; the chunks this stream sent no longer count.
  void Fail(const absl::Status& status) {
    if (job_ != nullptr) job_->AbandonSeed(attempt_);
    ReactionOrderStarting(this);
    Finish(common::ToGrpcStatus(status));
  }

  absl::Status Accept() {
    CO2_RETURN_IF_ERROR(ParseRequest(body_, &chunk_));
    if (job_ == nullptr) {
      CO2_ASSIGN_OR_RETURN(job_,
                           FindJob(context_, registry_, refused_, chunk_.job(),
                                   chunk_.worker_id()));
      worker_ = chunk_.worker_id();
    }
    CO2_RETURN_IF_ERROR(job_->SeedChunk(worker_, chunk_.chunk_index(),
                                        chunk_.anchor_round(),
                                        chunk_.payload(), &attempt_));
    anchor_round_ = chunk_.anchor_round();
    ++received_;
    return absl::OkStatus();
  }

  absl::Status Complete() {
    if (job_ == nullptr || received_ != job_->num_chunks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "seed ended after ", received_, " chunks of ",
          job_ == nullptr ? 0 : job_->num_chunks(),
          "; nothing of it was kept: send the whole seed again"));
    }
    v1::SeedResponse response;
    response.set_anchor_round(anchor_round_);
    *response_ = SerializeMessage(response);
    return absl::OkStatus();
  }

  const grpc::CallbackServerContext* const context_;
  JobRegistry* const registry_;
  RefusedCalls* const refused_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer body_;
  v1::AnchorChunk chunk_;
  std::shared_ptr<JobShard> job_;
  std::string worker_;
  uint64_t attempt_ = 0;  // this stream's seed (SeedState::Accept)
  uint32_t received_ = 0;
  uint64_t anchor_round_ = 0;  // of the chunks received (JobShard checks them)
};

// Streams a snapshot of the anchor, one chunk per write. The snapshot is
// shared with the other fetches of the same anchor, and each write's payload
// slice aliases it (rpc_wire.h): a fetch costs no copy of the anchor.
class FetchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(const grpc::CallbackServerContext* context,
               JobRegistry* registry, RefusedCalls* refused,
               const grpc::ByteBuffer& request) {
    absl::StatusOr<std::shared_ptr<const AnchorSnapshot>> snapshot =
        Snapshot(context, registry, refused, request);
    if (!snapshot.ok()) {
      ReactionOrderStarting(this);
      Finish(common::ToGrpcStatus(snapshot.status()));
      return;
    }
    snapshot_ = *std::move(snapshot);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    ReactionOrderReacting(this);
    if (!ok) {
      ReactionOrderStarting(this);
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled"));
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    ReactionOrderReacting(this);
    delete this;
  }

 private:
  static absl::StatusOr<std::shared_ptr<const AnchorSnapshot>> Snapshot(
      const grpc::CallbackServerContext* context, JobRegistry* registry,
      RefusedCalls* refused, const grpc::ByteBuffer& body) {
    v1::FetchRequest request;
    CO2_RETURN_IF_ERROR(ParseRequest(body, &request));
    CO2_ASSIGN_OR_RETURN(std::shared_ptr<JobShard> job, FindJob(context, registry, refused,
                                                 request.job(),
                                                 request.worker_id()));
    return job->Fetch(request.worker_id());
  }

  void WriteNext() {
    if (next_ == snapshot_->chunks.size()) {
      ReactionOrderStarting(this);
      Finish(grpc::Status::OK);
      return;
    }
    in_flight_ = SerializeAnchorChunk(snapshot_, next_++);
    ReactionOrderStarting(this);
    StartWrite(&in_flight_);
  }

  std::shared_ptr<const AnchorSnapshot> snapshot_;
  size_t next_ = 0;
  grpc::ByteBuffer in_flight_;  // lives until its OnWriteDone
};

// One worker's long-lived stream to this shard: reads contributions, writes
// every outer update of the job. Writes are queued in an Outbox that the
// JobShard holds weakly; at most one write is in flight, and Finish waits for
// it, so a write is never started on a finished reactor. The queue holds the
// update chunks every stream shares; each write's ByteBuffer aliases the
// shared payload (exchange_wire.h), so a stream costs no copy of an update.
// An update replayed from its checkpoint is read one chunk at a time, as its
// turn comes, on the ReadThread (never in a reaction or under the shard's
// lock): a reconnecting worker costs one chunk of memory, not a round.
class ExchangeReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ExchangeReactor(const grpc::CallbackServerContext* context,
                  JobRegistry* registry, RefusedCalls* refused,
                  ReadThread* reads)
      : context_(context),
        registry_(registry),
        refused_(refused),
        outbox_(std::make_shared<Outbox>(this, reads)) {
    ReactionOrderStarting(this);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    ReactionOrderReacting(this);
    if (!ok) {  // the worker closed its side (or the call was cancelled)
      outbox_->RequestFinish(absl::OkStatus());
      return;
    }
    absl::Status status = Handle();
    if (!status.ok()) {
      outbox_->RequestFinish(status);
      return;
    }
    ReactionOrderStarting(this);
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    ReactionOrderReacting(this);
    outbox_->WriteDone(ok);
  }

  void OnDone() override {
    ReactionOrderReacting(this);
    delete this;
  }

 private:
  class Outbox : public UpdateSink,
                 public std::enable_shared_from_this<Outbox> {
   public:
    Outbox(ExchangeReactor* reactor, ReadThread* reads)
        : reactor_(reactor), reads_(reads) {}

    void Send(std::shared_ptr<const UpdateChunks> update) override
        ABSL_LOCKS_EXCLUDED(mu_) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        if (finishing_) return;
        for (const auto& chunk : *update) queue_.push_back({chunk, {}, 0});
        action = NextLocked();
      }
      Take(action);
    }

    void Replay(const KeptUpdate& update) override ABSL_LOCKS_EXCLUDED(mu_) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        if (finishing_) return;
        for (uint32_t i = 0; i < update.num_chunks(); ++i) {
          queue_.push_back({nullptr, update, i});
        }
        action = NextLocked();
      }
      Take(action);
    }

    void WriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        queue_.pop_front();
        if (!ok) Stop(absl::CancelledError("worker stream broken"));
        action = NextLocked();
      }
      Take(action);
    }

    // The ReadThread's result for the chunk at the front of the queue.
    void ChunkRead(absl::StatusOr<std::shared_ptr<const v1::OuterUpdate>> read)
        ABSL_LOCKS_EXCLUDED(mu_) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        reading_ = false;
        if (!finishing_) {
          if (read.ok()) {
            queue_.front().message = *std::move(read);
            queue_.front().kept.reset();
          } else {
            Stop(read.status());
          }
        }
        action = NextLocked();
      }
      Take(action);
    }

    // Finishes once the write in flight (if any) is done.
    void RequestFinish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        if (finishing_) return;
        Stop(std::move(status));
        action = NextLocked();
      }
      Take(action);
    }

   private:
    // One chunk to write: its message, or where to take it from (`kept`, a
    // replayed update, perhaps only in its checkpoint) when its turn comes.
    struct QueuedChunk {
      std::shared_ptr<const v1::OuterUpdate> message;
      std::optional<KeptUpdate> kept;
      uint32_t chunk = 0;
    };
    // What to do once the lock is released: start a write, read a replayed
    // chunk, finish, or nothing (a write or read is in flight, or the queue
    // is empty).
    struct Action {
      const grpc::ByteBuffer* write = nullptr;
      std::optional<KeptUpdate> read;  // ... chunk `read_chunk` of it
      uint32_t read_chunk = 0;
      bool finish = false;
      absl::Status status;
    };

    // No more writes: the stream finishes with `status` once the write or
    // read in flight is done (a write's buffer must live until its
    // OnWriteDone, and a read calls back into this stream).
    void Stop(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      finishing_ = true;
      status_ = std::move(status);
      queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
    }

    // Decided under the lock, so that exactly one caller finishes. A
    // replayed chunk that cannot be read back ends the stream with the
    // error; the worker reconnects.
    Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (writing_ || reading_) return {};
      if (!finishing_ && !queue_.empty() && queue_.front().message == nullptr) {
        reading_ = true;
        Action action;
        action.read = queue_.front().kept;
        action.read_chunk = queue_.front().chunk;
        return action;
      }
      if (finishing_) {
        if (finished_) return {};
        finished_ = true;
        Action action;
        action.finish = true;
        action.status = status_;
        return action;
      }
      if (queue_.empty()) return {};
      writing_ = true;
      in_flight_ = SerializeUpdate(queue_.front().message);
      Action action;
      action.write = &in_flight_;
      return action;
    }

    void Take(const Action& action) {
      // Read before the release: OnDone may free this Outbox once the
      // write or the finish has started.
      ExchangeReactor* const reactor = reactor_;
      if (action.write != nullptr || action.finish) {
        ReactionOrderStarting(reactor);
      }
      if (action.write != nullptr) {
        reactor->StartWrite(action.write);
      } else if (action.read) {
        // The stream cannot finish while the read is in flight (reading_),
        // so the reactor outlives it.
        reads_->Post(
            [self = shared_from_this(), kept = *action.read,
             chunk = action.read_chunk] { self->ChunkRead(kept.Chunk(chunk)); });
      } else if (action.finish) {
        reactor->Finish(common::ToGrpcStatus(action.status));
      }
    }

    ExchangeReactor* const reactor_;  // outlives every write it starts
    ReadThread* const reads_;         // outlives the server
    absl::Mutex mu_;
    std::deque<QueuedChunk> queue_ ABSL_GUARDED_BY(mu_);
    // The write in flight (queue_.front()); lives until its OnWriteDone.
    grpc::ByteBuffer in_flight_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a ReadThread task pending
    bool finishing_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
    absl::Status status_ ABSL_GUARDED_BY(mu_);
  };

  absl::Status Handle() {
    CO2_ASSIGN_OR_RETURN(ExchangeMessage request,
                         ParseExchangeRequest(&request_));
    if (request.open) {
      if (job_ != nullptr) {
        return absl::InvalidArgumentError("the stream is already open");
      }
      const v1::ExchangeOpen& open = *request.open;
      CO2_ASSIGN_OR_RETURN(job_,
                           FindJob(context_, registry_, refused_, open.job(),
                                   open.worker_id()));
      worker_ = open.worker_id();
      CO2_RETURN_IF_ERROR(job_->UplinkCodec(worker_).status());
      return job_->Subscribe(outbox_, open.replay_from_round());
    }
    if (job_ == nullptr) {
      return absl::InvalidArgumentError(
          "the first message of an Exchange stream must be open");
    }
    CO2_RETURN_IF_ERROR(job_->Contribute(worker_, *request.contribution));
    registry_->Wake();
    return absl::OkStatus();
  }

  const grpc::CallbackServerContext* const context_;
  JobRegistry* const registry_;
  RefusedCalls* const refused_;
  const std::shared_ptr<Outbox> outbox_;
  grpc::ByteBuffer request_;
  std::shared_ptr<JobShard> job_;
  std::string worker_;
};

}  // namespace

grpc::ServerUnaryReactor* AggregatorService::Join(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Unary<v1::JoinRequest, v1::JoinResponse>(
      context, *request, response,
      [&](const v1::JoinRequest& join, v1::JoinResponse* joined) {
        return DoJoin(context, registry_, refused_, join, joined);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* AggregatorService::Seed(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new SeedReactor(context, registry_, refused_, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* AggregatorService::Fetch(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new FetchReactor(context, registry_, refused_, *request);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
AggregatorService::Exchange(grpc::CallbackServerContext* context) {
  return new ExchangeReactor(context, registry_, refused_, &reads_);
}

grpc::ServerUnaryReactor* AggregatorService::Heartbeat(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      context, *request, response,
      [&](const v1::HeartbeatRequest& beat,
          v1::HeartbeatResponse* renewed) -> absl::Status {
        CO2_ASSIGN_OR_RETURN(std::shared_ptr<JobShard> job, FindJob(context, registry_, refused_,
                                                     beat.job(),
                                                     beat.worker_id()));
        CO2_RETURN_IF_ERROR(job->Heartbeat(beat.worker_id()));
        renewed->set_lease_ms(static_cast<uint32_t>(
            absl::ToInt64Milliseconds(registry_->options().shard.lease)));
        renewed->set_open_round(job->stats().rounds_closed);
        renewed->set_update_held(job->UpdateHeld());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AggregatorService::Leave(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Unary<v1::LeaveRequest, v1::LeaveResponse>(
      context, *request, response,
      [&](const v1::LeaveRequest& leave, v1::LeaveResponse*) -> absl::Status {
        CO2_ASSIGN_OR_RETURN(std::shared_ptr<JobShard> job, FindJob(context, registry_, refused_,
                                                     leave.job(),
                                                     leave.worker_id()));
        CO2_RETURN_IF_ERROR(job->Leave(leave.worker_id()));
        registry_->Wake();  // a round may now be complete
        return absl::OkStatus();
      });
}

}  // namespace co2::server
