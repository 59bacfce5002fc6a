// ShardObserver: what a JobShard reports about its work, for monitoring. The
// JobShard calls it (through the nullable JobShardOptions::observer) and knows
// nothing of Prometheus; server::ShardMetrics is the Prometheus
// implementation, and tests can record the events with a fake.
//
// Threads and locks: methods are called from the gRPC reactor threads and the
// registry's poller, some with the JobShard's lock held. An implementation must
// be thread-safe, fast (counters and gauges only), must not block and must not
// call back into the JobShard. Every method has an empty default, so an
// implementation overrides only what it records.
#ifndef CO2_SERVER_JOB_SHARD_OBSERVER_H_
#define CO2_SERVER_JOB_SHARD_OBSERVER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "server/job/outer_optimizer.h"
#include "server/storage/write_failure.h"

namespace co2::server {

// Why a contribution chunk was refused (the `reason` label of the metric).
enum class RejectReason {
  kInvalidArgument,    // malformed: chunk index, size, codec, weight
  kNonFinite,          // a NaN or Inf element, or one too large for the
                       // exact sum (INVALID_ARGUMENT on the wire)
  kStale,              // round older than the open round − 1 (ABORTED)
  kAhead,              // round newer than the open round + 1
  kNotMember,          // the worker is not a live member (lease expired?)
  kEvicted,            // the worker was evicted (FAILED_PRECONDITION)
  kResourceExhausted,  // a limit
  kOutlier,            // held out of its chunk's mean: norm > k × median
  kOther,              // the last: ShardMetrics registers every reason up to it
};

// The reason for a status a JobShard returned from Contribute (not OK).
RejectReason RejectReasonOf(const absl::Status& status);
// "invalid_argument", "non_finite", "stale", "ahead", "not_member",
// "evicted", "resource_exhausted", "outlier", "other".
absl::string_view RejectReasonName(RejectReason reason);

// Why a shard had no state for a job that a resuming worker joined, and was
// re-seeded from that worker's anchor (the `reason` label of the metric).
enum class ReseedReason {
  kMissing,  // no checkpoint of the job (none written, or the file is gone)
  kCorrupt,  // its checkpoint failed verification and was set aside
};
// "missing", "corrupt".
absl::string_view ReseedReasonName(ReseedReason reason);

struct RoundClosedEvent {
  uint64_t round = 0;
  // From the round's opening (the previous round's close; for the first round
  // the moment the anchor was seeded) to its close.
  absl::Duration duration;
  uint32_t contributors = 0;  // complete contributions in the mean
  bool quorum_close = false;  // closed at the deadline, not by completeness
  OuterStepStats step;        // Λ, ||m||², clipped elements of this shard
  size_t elements = 0;        // this shard's range size (for fractions)
  // The largest contribution norm / its chunk's median (ClosedRound).
  double max_norm_ratio = 0;
};

// A snapshot taken at every Poll (at least every max_poll_interval).
struct ShardPollEvent {
  size_t live_workers = 0;
  uint64_t open_round = 0;
  absl::Duration open_round_age;   // since the open round opened (0: no anchor)
  uint64_t new_quorum_misses = 0;  // rounds that missed quorum since last Poll
  // How long the next round may wait after its first chunk: the job's
  // round_timeout, or less once adapted (server/job/round_deadline.h).
  absl::Duration round_deadline;
};

class ShardObserver {
 public:
  virtual ~ShardObserver() = default;

  // An accepted contribution chunk of `bytes` payload bytes. `late`: a
  // straggler's chunk folded into the open round; `duplicate`: already counted.
  virtual void OnContribution(const std::string& /*job*/,
                              common::Codec /*codec*/, size_t /*bytes*/,
                              bool /*late*/, bool /*duplicate*/) {}
  // A contribution chunk refused with an error status.
  virtual void OnRejected(const std::string& /*job*/, RejectReason /*reason*/) {
  }
  // A round closed and its outer step ran.
  virtual void OnRoundClosed(const std::string& /*job*/,
                             const RoundClosedEvent& /*event*/) {}
  // An outer update of `bytes` payload bytes was queued on `streams` worker
  // streams (bytes out = bytes × streams).
  virtual void OnUpdatePublished(const std::string& /*job*/,
                                 common::Codec /*codec*/, size_t /*bytes*/,
                                 size_t /*streams*/) {}
  // Membership and progress, at every Poll.
  virtual void OnPoll(const std::string& /*job*/,
                      const ShardPollEvent& /*event*/) {}
  // A checkpoint of the job's shard state became durable after `duration`
  // (JobShard::Poll, after each successful write).
  virtual void OnCheckpointWritten(const std::string& /*job*/,
                                   absl::Duration /*duration*/) {}
  // A durable write of the job's state (a checkpoint or the round
  // journal) failed; `reason` is its errno's class. Retried every
  // JobShardOptions::checkpoint_retry, each retry told again.
  virtual void OnCheckpointFailed(const std::string& /*job*/,
                                  WriteFailure /*reason*/) {}
  // The job's state on this shard was lost and a worker re-seeded it.
  virtual void OnReseeded(const std::string& /*job*/,
                          ReseedReason /*reason*/) {}
  // The job left OPEN (finished or abandoned): it no longer has rounds,
  // workers or alerts. Its series come back if it opens again (OnPoll).
  virtual void OnJobClosed(const std::string& /*job*/) {}
  // A call refused for its credentials (UNAUTHENTICATED: a client
  // certificate or bearer token the shard does not accept; PERMISSION_DENIED:
  // a token for another job), of any job or none (server/service/refused_calls.h).
  virtual void OnCallRefused(absl::StatusCode /*code*/) {}
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SHARD_OBSERVER_H_
