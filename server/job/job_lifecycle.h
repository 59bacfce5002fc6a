// JobLifecycle: whether one job on one shard is open, finished or abandoned
// (co2.v1.JobState), and since when. A job is FINISHED once its last round
// (JobConfig.rounds, when stated) closed and no worker is live; ABANDONED
// when no worker was live for `abandon_after` with rounds left. FINISHED is
// final; a Join brings an ABANDONED job back to OPEN.
//
// The rule only: no clock of its own, no locking (JobShard holds it under its
// mutex and feeds it the round and membership at every Poll).
#ifndef CO2_SERVER_JOB_JOB_LIFECYCLE_H_
#define CO2_SERVER_JOB_JOB_LIFECYCLE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "co2/v1/aggregator.pb.h"

namespace co2::server {

class JobLifecycle {
 public:
  // A job of `rounds` rounds (0: not stated, never finished by count) in
  // `state` (UNSPECIFIED reads as OPEN) as of `now`.
  JobLifecycle(uint64_t rounds, absl::Duration abandon_after, absl::Time now,
               v1::JobState state = v1::JOB_STATE_OPEN);

  v1::JobState state() const { return state_; }
  bool open() const { return state_ == v1::JOB_STATE_OPEN; }
  // When the job entered its state (its creation or restore for OPEN).
  absl::Time since() const { return since_; }

  // Whether `job` takes a Join now (`rejoin`: a member that restarted without
  // its state). FAILED_PRECONDITION for a fresh Join to a FINISHED job,
  // naming its final round and what to do instead. Admitting a Join to an
  // ABANDONED job makes it OPEN.
  absl::Status AdmitJoin(absl::string_view job, bool rejoin, absl::Time now);

  // Applies the rule to the job's closed rounds and live workers at `now`;
  // true when the state changed.
  bool Update(uint64_t rounds_closed, size_t live_workers, absl::Time now);

  // When Update would abandon the job if nobody joins; InfiniteFuture when
  // it is not OPEN or has live workers.
  absl::Time NextDeadline() const;

 private:
  void Enter(v1::JobState state, absl::Time now);

  uint64_t rounds_;
  absl::Duration abandon_after_;
  v1::JobState state_;
  absl::Time since_;
  // Since when an OPEN job has had no live worker (InfiniteFuture: it has).
  absl::Time empty_since_ = absl::InfiniteFuture();
};

// "open", "finished", "abandoned" (logs and co2-admin).
absl::string_view JobStateName(v1::JobState state);

// The FAILED_PRECONDITION a fresh Join to finished job `job` of `rounds`
// rounds gets: its final round, and what to do instead.
absl::Status FinishedJobError(absl::string_view job, uint64_t rounds);

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_JOB_LIFECYCLE_H_
