// ShardReporter: a JobShard's reports of its rounds and polls to its
// ShardObserver (metrics), with the state they need: when the open round
// opened (the last close, the anchor's seed, or the shard's creation) and
// the quorum misses already reported. Without an observer nothing is
// reported, but the opening time is still kept.
//
// Not thread-safe: the owner serialises calls (server::JobShard calls it
// under its mutex). The observer is called synchronously; see
// shard_observer.h for what that asks of it.
#ifndef CO2_SERVER_JOB_SHARD_REPORTER_H_
#define CO2_SERVER_JOB_SHARD_REPORTER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "server/job/outer_optimizer.h"
#include "server/job/round_state.h"
#include "server/job/shard_observer.h"

namespace co2::server {

class ShardReporter {
 public:
  // `observer` (nullable) and `clock` are borrowed. The open round opens now.
  ShardReporter(std::string job, ShardObserver* observer, common::Clock* clock);

  // The anchor was seeded: the open round opens now.
  void RoundOpened();
  // `closed` closed and its step gave `step` on a range of `elements`;
  // the next round opens now.
  void RoundClosed(const ClosedRound& closed, const OuterStepStats& step,
                   size_t elements);
  // A Poll: the open round is aged only once there is an anchor.
  // `quorum_misses` counts every miss so far; the new ones are reported.
  // `round_deadline`: how long the next round may wait after its first chunk.
  void Polled(size_t live_workers, uint64_t open_round, bool anchor_ready,
              uint64_t quorum_misses, absl::Duration round_deadline);
  // The job left OPEN (finished or abandoned).
  void Closed();

 private:
  const std::string job_;
  ShardObserver* const observer_;
  common::Clock* const clock_;
  absl::Time round_opened_;
  uint64_t reported_quorum_misses_ = 0;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SHARD_REPORTER_H_
