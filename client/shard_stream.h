// ShardStream: a worker's long-lived Exchange stream to one aggregator shard.
// It owns this shard's slice of the send buffer (the encoded chunks of the
// latest contribution) and of the receive buffer (the encoded chunks of one
// outer update), a writer thread that streams the contribution and a reader
// thread that fills the receive buffer. On UNAVAILABLE (shard restart, broken
// link) the reader reconnects with exponential backoff, asks the shard to
// replay the update it still needs, and the writer resends the contribution
// whose update has not arrived (contributions are idempotent per chunk).
// If the shard lost the job's state (JoinResponse.must_reseed), the stream
// re-seeds it with this shard's range of the worker's anchor, read through
// the AnchorSource, at that anchor's round.
//
// Threads: Begin/Commit/Take/Release come from the one trainer thread (via
// AggregatorClient); all other methods are safe from any thread. Every wait
// takes a deadline.
#ifndef CO2_CLIENT_SHARD_STREAM_H_
#define CO2_CLIENT_SHARD_STREAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/send_buffers.h"
#include "client/worker_wire.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/codec.h"
#include "grpcpp/channel.h"

namespace co2::client {

// The worker's anchor, lent to the streams so that a shard that lost its
// state can be re-seeded from it. Implemented by AggregatorClient.
class AnchorSource {
 public:
  virtual ~AnchorSource() = default;
  // Calls `read` with shard `shard`'s range of the anchor while no update is
  // being applied to it; FAILED_PRECONDITION if the worker lent no anchor.
  virtual absl::Status ReadAnchor(
      uint32_t shard,
      absl::FunctionRef<void(absl::Span<const float>)> read) = 0;
};

struct ShardStreamOptions {
  std::string job;
  std::string worker_id;
  uint32_t shard_index = 0;
  size_t shard_elements = 0;
  common::Codec uplink = common::Codec::kFp32;
  common::Codec downlink = common::Codec::kFp32;
  uint64_t first_update_round = 0;  // the first update this worker applies
  uint64_t first_contribution_round = 0;  // the worker's start round
  // The job's max_staleness: applying the update of round u gives the anchor
  // of round u + 1 + max_staleness.
  uint32_t max_staleness = 1;
  // The worker's anchor for re-seeding (borrowed, outlives the stream);
  // null: a shard that lost its state fails the stream.
  AnchorSource* anchor = nullptr;
  // Sent again before every reconnect, with resume_round set, so that a
  // restarted shard knows the worker and the round it is in.
  v1::JoinRequest join;
  absl::Duration rpc_timeout = absl::Seconds(30);
  absl::Duration reconnect_timeout = absl::Seconds(60);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

struct ShardStreamStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t broken_streams = 0;  // broken streams it reconnects after
  uint64_t reconnects = 0;
};

class ShardStream {
 public:
  // `stub` (for Join and re-seeding) is borrowed and must outlive the
  // stream; it and `channel` lead to the same shard. Starts the threads.
  ShardStream(const ShardStreamOptions& options,
              std::shared_ptr<grpc::Channel> channel,
              v1::Aggregator::Stub* stub);
  ~ShardStream();  // cancels the stream and joins the threads
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;

  // Waits until the previous contribution is fully written and its update
  // has arrived (or was applied), then hands out the send chunks to encode
  // into (sized for the uplink codec), valid until CommitContribution.
  // Errors: the stream's terminal error, or DEADLINE_EXCEEDED.
  absl::StatusOr<std::vector<absl::Span<char>>> BeginContribution(
      absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the chunks filled since BeginContribution as round `round`.
  void CommitContribution(uint64_t round, double weight)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether update `round` has fully arrived. While it has not, one atomic
  // load (the test between inner steps, AnchorExchange::UpdateArrived).
  bool UpdateReady(uint64_t round) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WaitForUpdate(uint64_t round, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The received chunks of update `round` (which must be ready), payloads
  // validated for their chunk's size; valid until ReleaseUpdate.
  const std::vector<ReceivedUpdate>& UpdateChunks() const;
  // Frees the receive buffer: the next update may arrive.
  void ReleaseUpdate(uint64_t round) ABSL_LOCKS_EXCLUDED(mu_);

  ShardStreamStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Call;  // one attempt: context + stream

  void ReadLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WriteLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Opens a new call (with backoff) and installs it; false when giving up.
  bool Reconnect() ABSL_LOCKS_EXCLUDED(mu_);
  // Joins again as a worker resuming at its current round; re-seeds the
  // shard if it lost its state, or checks that it can follow the shard.
  // Only after a broken stream, which dropped chunks the trainer had not
  // taken.
  absl::Status Rejoin() ABSL_LOCKS_EXCLUDED(mu_);
  // Uploads this shard's range of the worker's anchor (plus a received
  // update the worker keeps, see NeededUpdateLocked) at its round.
  absl::Status Reseed() ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION if the shard (open round `open_round`, replaying
  // updates from `oldest_update_round`) cannot give this worker the updates
  // it needs.
  absl::Status CheckResumable(uint64_t open_round, uint64_t oldest_update_round)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The round of the first update this worker still needs from the shard:
  // the one it waits for, or the next one if that update arrived whole and
  // the trainer was already told it is ready (it is never taken back).
  uint64_t NeededUpdateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the received chunks of the update waited for.
  void DropUpdateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ready_before_ <- what next_update_round_ and recv_count_ say now.
  void PublishReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleUpdate(ReceivedUpdate update) ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadyLocked(uint64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardStreamOptions options_;
  const ExchangeMethod exchange_;
  v1::Aggregator::Stub* const stub_;
  const uint32_t num_chunks_;

  mutable absl::Mutex mu_;
  std::shared_ptr<Call> call_ ABSL_GUARDED_BY(mu_);
  // call_'s open message has been written: only then may the writer use it
  // (a sync stream takes one Write at a time, and open must come first).
  bool call_open_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumps on every new call
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // terminal; OK while healthy

  // Send side. The writer lends send_'s chunks [next_send_..] while
  // sending; BeginContribution hands them to the trainer only when no
  // contribution is in flight.
  SendBuffers send_;
  bool has_contribution_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t send_round_ ABSL_GUARDED_BY(mu_) = 0;
  double send_weight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resume_round_ ABSL_GUARDED_BY(mu_);  // the last committed round
  uint32_t next_send_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t failed_write_generation_ ABSL_GUARDED_BY(mu_) = 0;

  // Receive side: one update at a time, in gRPC's receive buffers.
  std::vector<ReceivedUpdate> recv_;
  uint64_t next_update_round_ ABSL_GUARDED_BY(mu_);  // the one we wait for
  uint32_t recv_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> recv_have_ ABSL_GUARDED_BY(mu_);
  // Every update before this round has fully arrived: next_update_round_,
  // plus one when its chunks are all in. Stored under mu_ wherever either
  // changes (PublishReadyLocked), read without it by UpdateReady.
  std::atomic<uint64_t> ready_before_{0};
  // The trainer was told the update of next_update_round_ is ready
  // (UpdateReady, WaitForUpdate or BeginContribution), so it may apply it at
  // any moment: a re-seed keeps it.
  mutable bool reported_ready_ ABSL_GUARDED_BY(mu_) = false;

  ShardStreamStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
  std::thread writer_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_SHARD_STREAM_H_
