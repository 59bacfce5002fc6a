// WorkerMetrics: the Prometheus metrics of one worker leader (the process of a
// node that talks to the aggregator). The trainer reports each round boundary;
// WorkerMetrics turns it into these series, labelled with the training job
// (`co2_job`; Prometheus keeps `job` for the scrape job) and the worker id:
//
//   co2_worker_rounds_total                counter    boundaries passed
//   co2_worker_inner_step_seconds          histogram  one sample per inner
//                                                     step: the round's mean
//                                                     of a whole step (batch,
//                                                     forward, backward,
//                                                     gradient averaging,
//                                                     optimizer step)
//   co2_worker_exposed_comm_seconds        histogram  per round: the wait
//                                                     for outer updates
//   co2_worker_exposed_comm_seconds_total  counter    the sum of those waits
//   co2_worker_push_seconds                histogram  per round: time in Push
//   co2_worker_bytes_sent_total            counter    contribution payload
//   co2_worker_staleness_rounds            gauge      round computed − round
//                                                     of the update applied
//   co2_worker_anchor_mismatches_total     counter    anchor ranges that
//                                                     differed from their
//                                                     shard's digest after an
//                                                     update (and were fetched
//                                                     again)
//   co2_worker_heals_total{reason}         counter    boundaries that fetched
//                                                     the shards' anchor to
//                                                     continue at their round
//                                                     (behind, stale, dropped)
//   co2_worker_heal_seconds                histogram  from the failure to the
//                                                     shards' anchor
//
// Torch-free, so any trainer can link it. Serve() starts a MetricsServer of its
// own; the constructor records into a borrowed registry instead (tests, or a
// process that already serves one). Thread-safe.
#ifndef CO2_CLIENT_WORKER_METRICS_H_
#define CO2_CLIENT_WORKER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics_server.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace co2::client {

// What one round boundary of a worker leader measured.
struct WorkerRoundSample {
  int inner_steps = 0;     // inner steps in the round
  absl::Duration compute;  // their whole time: batch, forward, backward,
                           // intra-node collectives, optimizer step
  absl::Duration exposed_comm;  // waiting for outer updates (the exposed part)
  absl::Duration push;          // in AggregatorClient::Push
  uint64_t bytes_sent = 0;      // contribution payload bytes of the round
  uint64_t staleness = 0;       // rounds between the update applied and now
  uint64_t anchor_mismatches = 0;  // anchor ranges fetched again (digest)
  const char* heal_reason = nullptr;  // the round healed, and why
  absl::Duration heal_time;           // how long the heal took
};

class WorkerMetrics {
 public:
  // Serves the metrics on `address` (host:port, port 0 picks one; see
  // port()). UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Serve(
      const std::string& address, const std::string& job,
      const std::string& worker, const common::LinkPath& link_path = {});

  // Records into `registry`, which must outlive this object.
  WorkerMetrics(prometheus::Registry& registry, const std::string& job,
                const std::string& worker);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  void ObserveRound(const WorkerRoundSample& sample);
  // One inner step's time, for a trainer that times steps itself (do not also
  // pass them in WorkerRoundSample::inner_steps).
  void ObserveInnerStep(absl::Duration step);

  // The port of the server Serve() started; 0 for a borrowed registry.
  int port() const { return server_ == nullptr ? 0 : server_->port(); }

 private:
  WorkerMetrics(std::unique_ptr<common::MetricsServer> server,
                const std::string& job, const std::string& worker);

  // Declared first: destroyed last, after nothing records any more.
  std::unique_ptr<common::MetricsServer> server_;
  prometheus::Counter& rounds_;
  prometheus::Histogram& inner_step_;
  prometheus::Histogram& exposed_comm_;
  prometheus::Histogram& push_;
  prometheus::Counter& bytes_sent_;
  prometheus::Gauge& staleness_;
  prometheus::Counter& exposed_comm_total_;
  prometheus::Counter& anchor_mismatches_;
  prometheus::Family<prometheus::Counter>& heals_;
  const std::map<std::string, std::string> labels_;
  prometheus::Histogram& heal_seconds_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_WORKER_METRICS_H_
