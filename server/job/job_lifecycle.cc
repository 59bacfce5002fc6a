#include "server/job/job_lifecycle.h"

#include "absl/strings/str_cat.h"

namespace co2::server {

JobLifecycle::JobLifecycle(uint64_t rounds, absl::Duration abandon_after,
                           absl::Time now, v1::JobState state)
    : rounds_(rounds),
      abandon_after_(abandon_after),
      state_(state == v1::JOB_STATE_UNSPECIFIED ? v1::JOB_STATE_OPEN : state),
      since_(now) {}

absl::Status JobLifecycle::AdmitJoin(absl::string_view job, bool rejoin,
                                     absl::Time now) {
  switch (state_) {
    case v1::JOB_STATE_FINISHED:
      return rejoin ? absl::OkStatus() : FinishedJobError(job, rounds_);
    case v1::JOB_STATE_ABANDONED:
      Enter(v1::JOB_STATE_OPEN, now);
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

bool JobLifecycle::Update(uint64_t rounds_closed, size_t live_workers,
                          absl::Time now) {
  if (state_ == v1::JOB_STATE_FINISHED) return false;
  if (live_workers > 0) {
    empty_since_ = absl::InfiniteFuture();
    if (state_ == v1::JOB_STATE_ABANDONED) {
      Enter(v1::JOB_STATE_OPEN, now);
      return true;
    }
    return false;
  }
  if (rounds_ > 0 && rounds_closed >= rounds_) {
    Enter(v1::JOB_STATE_FINISHED, now);
    return true;
  }
  if (state_ != v1::JOB_STATE_OPEN) return false;
  if (empty_since_ == absl::InfiniteFuture()) empty_since_ = now;
  if (now - empty_since_ < abandon_after_) return false;
  Enter(v1::JOB_STATE_ABANDONED, now);
  return true;
}

absl::Time JobLifecycle::NextDeadline() const {
  if (state_ != v1::JOB_STATE_OPEN || empty_since_ == absl::InfiniteFuture()) {
    return absl::InfiniteFuture();
  }
  return empty_since_ + abandon_after_;
}

void JobLifecycle::Enter(v1::JobState state, absl::Time now) {
  state_ = state;
  since_ = now;
  empty_since_ = absl::InfiniteFuture();
}

absl::Status FinishedJobError(absl::string_view job, uint64_t rounds) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job \"", job, "\" is finished: all its ", rounds,
      " rounds closed (the final round is ", rounds - 1,
      ") and every worker left; its final anchor is in the shards' "
      "checkpoints. Start a new job under another name, or delete this one "
      "first (co2-admin delete) to use the name again"));
}

absl::string_view JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_FINISHED:
      return "finished";
    case v1::JOB_STATE_ABANDONED:
      return "abandoned";
    default:
      return "open";
  }
}

}  // namespace co2::server
