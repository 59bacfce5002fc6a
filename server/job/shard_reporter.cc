#include "server/job/shard_reporter.h"

#include <utility>

namespace co2::server {

ShardReporter::ShardReporter(std::string job, ShardObserver* observer,
                             common::Clock* clock)
    : job_(std::move(job)),
      observer_(observer),
      clock_(clock),
      round_opened_(clock->Now()) {}

void ShardReporter::RoundOpened() { round_opened_ = clock_->Now(); }

void ShardReporter::Closed() {
  if (observer_ != nullptr) observer_->OnJobClosed(job_);
}

void ShardReporter::RoundClosed(const ClosedRound& closed,
                                const OuterStepStats& step, size_t elements) {
  const absl::Time now = clock_->Now();
  if (observer_ != nullptr) {
    RoundClosedEvent event;
    event.round = closed.round;
    event.duration = now - round_opened_;
    event.contributors = closed.contributors;
    event.quorum_close = closed.quorum_close;
    event.step = step;
    event.elements = elements;
    event.max_norm_ratio = closed.max_norm_ratio;
    observer_->OnRoundClosed(job_, event);
  }
  round_opened_ = now;
}

void ShardReporter::Polled(size_t live_workers, uint64_t open_round,
                           bool anchor_ready, uint64_t quorum_misses,
                           absl::Duration round_deadline) {
  if (observer_ == nullptr) return;
  ShardPollEvent event;
  event.live_workers = live_workers;
  event.open_round = open_round;
  event.open_round_age =
      anchor_ready ? clock_->Now() - round_opened_ : absl::ZeroDuration();
  event.new_quorum_misses = quorum_misses - reported_quorum_misses_;
  reported_quorum_misses_ = quorum_misses;
  event.round_deadline = round_deadline;
  observer_->OnPoll(job_, event);
}

}  // namespace co2::server
