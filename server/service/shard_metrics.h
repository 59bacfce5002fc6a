// ShardMetrics: the Prometheus implementation of ShardObserver for one
// aggregator shard. It registers its metric families in a borrowed registry
// (normally common::MetricsServer's) with a constant `shard` label, and adds
// one child per training job (label `co2_job`: Prometheus keeps `job` for
// the scrape job) on first use. The names are the contract with deploy/
// (dashboard, alert rules) and docs/operations.md; tests/deploy_test.py checks
// that every co2_* name used there is one of these.
//
// Counters:
//   co2_aggregator_rounds_completed_total          rounds closed
//   co2_aggregator_contributions_total             complete, in closed rounds
//   co2_aggregator_contribution_chunks_total       accepted chunks (codec)
//   co2_aggregator_late_chunks_total               folded into the next round
//   co2_aggregator_duplicate_chunks_total          resends, ignored
//   co2_aggregator_rejected_chunks_total           refused (reason)
//   co2_aggregator_bytes_in_total                  accepted payload (codec)
//   co2_aggregator_bytes_out_total                 update payload (codec)
//   co2_aggregator_quorum_closes_total             closed at the deadline
//   co2_aggregator_quorum_misses_total             deadline without quorum
//   co2_aggregator_reseeds_total                   state lost, re-seeded
//                                                  from a worker (reason)
//   co2_aggregator_refused_step_chunks_total       outer steps refused:
//                                                  m, U or A would not be
//                                                  finite
//   co2_aggregator_refused_calls_total             refused credentials
//                                                  (code), from start: 0
//   co2_aggregator_checkpoint_failures_total       failed durable writes
//                                                  (checkpoints, journal)
//                                                  of every job, by errno
//                                                  class (reason), from
//                                                  start: 0
// Gauges:
//   co2_aggregator_jobs                            open jobs (from start: 0)
//   co2_aggregator_workers                         live leases, every job
//   co2_aggregator_active_workers                  live leases
//   co2_aggregator_open_round                      round accepting chunks
//   co2_aggregator_open_round_age_seconds          since it opened
//   co2_aggregator_round_deadline_seconds          a round's wait for the
//                                                  missing after its first
//                                                  chunk (fixed or adapted)
//   co2_aggregator_round_contributors              of the last closed round
//   co2_aggregator_gap_penalty_mean                mean Λ, last outer step
//   co2_aggregator_outer_momentum_norm             ||m|| of this shard
//   co2_aggregator_clipped_fraction                of m's elements, last step
//   co2_aggregator_contribution_norm_ratio         largest norm / its
//                                                  chunk's median, last
//                                                  round (outlier_ratio)
// Histograms:
//   co2_aggregator_round_duration_seconds          opening to close
//   co2_aggregator_checkpoint_duration_seconds     checkpoint made durable
//
// Thread-safe (prometheus-cpp metrics are); the registry must outlive it.
#ifndef CO2_SERVER_SERVICE_SHARD_METRICS_H_
#define CO2_SERVER_SERVICE_SHARD_METRICS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/job/shard_observer.h"

namespace co2::server {

class ShardMetrics : public ShardObserver {
 public:
  ShardMetrics(prometheus::Registry& registry, uint32_t shard_index);

  void OnContribution(const std::string& job, common::Codec codec, size_t bytes,
                      bool late, bool duplicate) override;
  void OnRejected(const std::string& job, RejectReason reason) override;
  void OnRoundClosed(const std::string& job,
                     const RoundClosedEvent& event) override;
  void OnUpdatePublished(const std::string& job, common::Codec codec,
                         size_t bytes, size_t streams) override;
  void OnPoll(const std::string& job, const ShardPollEvent& event) override;
  void OnCheckpointWritten(const std::string& job,
                           absl::Duration duration) override;
  void OnReseeded(const std::string& job, ReseedReason reason) override;
  void OnCheckpointFailed(const std::string& job,
                          WriteFailure reason) override;
  // Removes every series of the job, and the job from the jobs and workers
  // gauges.
  void OnJobClosed(const std::string& job) override;
  void OnCallRefused(absl::StatusCode code) override;

  // OnCheckpointWritten under a name for callers outside the observer
  // interface (a checkpoint writer that holds the ShardMetrics itself).
  void ObserveCheckpointDuration(const std::string& job,
                                 absl::Duration duration) {
    OnCheckpointWritten(job, duration);
  }

 private:
  using Counters = prometheus::Family<prometheus::Counter>;
  using Gauges = prometheus::Family<prometheus::Gauge>;
  using Histograms = prometheus::Family<prometheus::Histogram>;

  prometheus::Histogram& RoundDuration(const std::string& job);
  prometheus::Histogram& CheckpointDuration(const std::string& job);
  // Creates the job's counters (and checkpoint histogram) at 0.
  void RegisterJobSeries(const std::string& job);
  // The jobs and workers gauges from live_by_job_.
  void SetTotalsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Counters& rounds_completed_;
  Histograms& round_duration_;
  Counters& contributions_;
  Counters& contribution_chunks_;
  Counters& late_chunks_;
  Counters& duplicate_chunks_;
  Counters& rejected_chunks_;
  Counters& bytes_in_;
  Counters& bytes_out_;
  Gauges& active_workers_;
  Gauges& open_round_;
  Gauges& open_round_age_;
  Gauges& round_deadline_;
  Gauges& round_contributors_;
  Counters& quorum_closes_;
  Counters& refused_step_chunks_;
  Counters& quorum_misses_;
  Counters& reseeds_;
  Histograms& checkpoint_duration_;
  Gauges& gap_penalty_mean_;
  Gauges& momentum_norm_;
  Gauges& clipped_fraction_;
  Gauges& norm_ratio_;
  Counters& refused_calls_;
  Counters& checkpoint_failures_;
  prometheus::Gauge& jobs_;
  prometheus::Gauge& workers_;
  absl::Mutex mu_;
  // Live workers of each job at its last Poll.
  std::map<std::string, size_t> live_by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_SHARD_METRICS_H_
