#include "client/worker_metrics.h"

#include <utility>

#include "common/status_macros.h"

namespace co2::client {
namespace {

prometheus::Labels WorkerLabels(const std::string& job,
                                const std::string& worker) {
  return {{"co2_job", job}, {"worker", worker}};
}

prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const char* name, const char* help,
                                const prometheus::Labels& labels) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add(labels);
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry,
                                    const char* name, const char* help,
                                    const prometheus::Labels& labels,
                                    std::vector<double> buckets) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add(labels, std::move(buckets));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Serve(
    const std::string& address, const std::string& job,
    const std::string& worker, const common::LinkPath& link_path) {
  common::MetricsServerOptions options;
  options.address = address;
  options.program = "co2-train";
  options.link_path = link_path;
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<common::MetricsServer> server,
                       common::MetricsServer::Start(options));
  return std::unique_ptr<WorkerMetrics>(
      new WorkerMetrics(std::move(server), job, worker));
}

WorkerMetrics::WorkerMetrics(std::unique_ptr<common::MetricsServer> server,
                             const std::string& job, const std::string& worker)
    : WorkerMetrics(server->registry(), job, worker) {
  server_ = std::move(server);
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry,
                             const std::string& job, const std::string& worker)
    : rounds_(AddCounter(registry, "co2_worker_rounds_total",
                         "Round boundaries this worker leader passed.",
                         WorkerLabels(job, worker))),
      inner_step_(
          AddHistogram(registry, "co2_worker_inner_step_seconds",
                       "Time of one inner step (forward, backward, intra-node "
                       "all-reduce, optimizer step), the mean over each round.",
                       WorkerLabels(job, worker),
                       common::ExponentialBuckets(0.0005, 2.0, 16))),
      exposed_comm_(AddHistogram(
          registry, "co2_worker_exposed_comm_seconds",
          "Per round, the time the trainer waited for outer updates: the "
          "communication CO2 did not hide.",
          WorkerLabels(job, worker),
          common::ExponentialBuckets(0.0001, 2.0, 20))),
      push_(AddHistogram(registry, "co2_worker_push_seconds",
                         "Per round, the time spent in Push (encoding the "
                         "pseudo-gradient and handing it to the streams).",
                         WorkerLabels(job, worker),
                         common::ExponentialBuckets(0.0001, 2.0, 20))),
      bytes_sent_(AddCounter(registry, "co2_worker_bytes_sent_total",
                             "Contribution payload bytes pushed.",
                             WorkerLabels(job, worker))),
      staleness_(prometheus::BuildGauge()
                     .Name("co2_worker_staleness_rounds")
                     .Help("Rounds between the round being computed and the "
                           "round of the outer update last applied.")
                     .Register(registry)
                     .Add(WorkerLabels(job, worker))),
      exposed_comm_total_(
          AddCounter(registry, "co2_worker_exposed_comm_seconds_total",
                     "Total time the trainer waited for outer updates.",
                     WorkerLabels(job, worker))),
      anchor_mismatches_(AddCounter(
          registry, "co2_worker_anchor_mismatches_total",
          "Shard ranges of the anchor that differed from the digest their "
          "shard sent with an outer update, and were fetched again.",
          WorkerLabels(job, worker))),
      heals_(prometheus::BuildCounter()
                 .Name("co2_worker_heals_total")
                 .Help("Boundaries at which the shards could not take this "
                       "worker back where it was (reason: behind, stale, "
                       "dropped) and it fetched their anchor to continue at "
                       "their round.")
                 .Register(registry)),
      labels_(WorkerLabels(job, worker)),
      heal_seconds_(AddHistogram(
          registry, "co2_worker_heal_seconds",
          "Time from a boundary's failure to the shards' anchor, per heal.",
          WorkerLabels(job, worker),
          common::ExponentialBuckets(0.01, 2.0, 14))) {}

void WorkerMetrics::ObserveRound(const WorkerRoundSample& sample) {
  rounds_.Increment();
  if (sample.inner_steps > 0) {
    const double step =
        absl::ToDoubleSeconds(sample.compute) / sample.inner_steps;
    for (int i = 0; i < sample.inner_steps; ++i) inner_step_.Observe(step);
  }
  const double exposed = absl::ToDoubleSeconds(sample.exposed_comm);
  exposed_comm_.Observe(exposed);
  exposed_comm_total_.Increment(exposed);
  push_.Observe(absl::ToDoubleSeconds(sample.push));
  bytes_sent_.Increment(static_cast<double>(sample.bytes_sent));
  staleness_.Set(static_cast<double>(sample.staleness));
  anchor_mismatches_.Increment(static_cast<double>(sample.anchor_mismatches));
  if (sample.heal_reason != nullptr) {
    prometheus::Labels labels = labels_;
    labels["reason"] = sample.heal_reason;
    heals_.Add(labels).Increment();
    heal_seconds_.Observe(absl::ToDoubleSeconds(sample.heal_time));
  }
}

void WorkerMetrics::ObserveInnerStep(absl::Duration step) {
  inner_step_.Observe(absl::ToDoubleSeconds(step));
}

}  // namespace co2::client
