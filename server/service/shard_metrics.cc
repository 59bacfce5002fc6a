#include "server/service/shard_metrics.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics_server.h"

namespace co2::server {
namespace {

using prometheus::Labels;

// Round durations: 10 ms .. ~11 min (τ steps of compute plus a late update).
const std::vector<double>& RoundBuckets() {
  static const auto* b =
      new std::vector<double>(common::ExponentialBuckets(0.01, 2.0, 17));
  return *b;
}
// Checkpoint writes: 1 ms .. ~65 s.
const std::vector<double>& CheckpointBuckets() {
  static const auto* b =
      new std::vector<double>(common::ExponentialBuckets(0.001, 2.0, 17));
  return *b;
}

std::string Codec(common::Codec codec) {
  return std::string(common::CodecName(codec));
}

// One metric family with the shard's constant label.
template <typename Builder>
auto& Family(Builder builder, const char* name, const char* help,
             prometheus::Registry& registry, uint32_t shard_index) {
  return builder.Name(name)
      .Help(help)
      .Labels({{"shard", absl::StrCat(shard_index)}})
      .Register(registry);
}

// Removes every child of `family` labelled co2_job="job"; `bucket_args` are
// what Add needs to find a histogram's child.
template <typename Metric, typename... BucketArgs>
void RemoveJob(prometheus::Family<Metric>& family, const std::string& job,
               const BucketArgs&... bucket_args) {
  std::vector<Labels> children;
  for (const prometheus::MetricFamily& collected : family.Collect()) {
    for (const prometheus::ClientMetric& metric : collected.metric) {
      Labels labels;
      bool ours = false;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "shard") continue;  // the constant label
        if (label.name == "co2_job") ours = label.value == job;
        labels[label.name] = label.value;
      }
      if (ours) children.push_back(std::move(labels));
    }
  }
  for (const Labels& labels : children) {
    family.Remove(&family.Add(labels, bucket_args...));
  }
}

}  // namespace

ShardMetrics::ShardMetrics(prometheus::Registry& registry, uint32_t shard_index)
    : rounds_completed_(Family(prometheus::BuildCounter(),
                               "co2_aggregator_rounds_completed_total",
                               "Rounds closed (outer step run and update "
                               "published) on this shard.",
                               registry, shard_index)),
      round_duration_(Family(prometheus::BuildHistogram(),
                             "co2_aggregator_round_duration_seconds",
                             "Time from a round's opening (previous "
                             "close) to its close.",
                             registry, shard_index)),
      contributions_(Family(prometheus::BuildCounter(),
                            "co2_aggregator_contributions_total",
                            "Complete worker contributions averaged into "
                            "closed rounds.",
                            registry, shard_index)),
      contribution_chunks_(Family(prometheus::BuildCounter(),
                                  "co2_aggregator_contribution_chunks_total",
                                  "Contribution chunks accepted, by "
                                  "uplink codec.",
                                  registry, shard_index)),
      late_chunks_(Family(prometheus::BuildCounter(),
                          "co2_aggregator_late_chunks_total",
                          "Straggler chunks of the previous round folded "
                          "into the open round.",
                          registry, shard_index)),
      duplicate_chunks_(Family(
          prometheus::BuildCounter(), "co2_aggregator_duplicate_chunks_total",
          "Resent chunks already counted (ignored).", registry, shard_index)),
      rejected_chunks_(Family(
          prometheus::BuildCounter(), "co2_aggregator_rejected_chunks_total",
          "Contribution chunks refused, by reason.", registry, shard_index)),
      bytes_in_(Family(prometheus::BuildCounter(),
                       "co2_aggregator_bytes_in_total",
                       "Contribution payload bytes accepted, by codec.",
                       registry, shard_index)),
      bytes_out_(Family(prometheus::BuildCounter(),
                        "co2_aggregator_bytes_out_total",
                        "Outer-update payload bytes queued to worker "
                        "streams, by codec.",
                        registry, shard_index)),
      active_workers_(
          Family(prometheus::BuildGauge(), "co2_aggregator_active_workers",
                 "Workers holding a live lease.", registry, shard_index)),
      open_round_(Family(prometheus::BuildGauge(), "co2_aggregator_open_round",
                         "The round accepting contributions.", registry,
                         shard_index)),
      open_round_age_(Family(prometheus::BuildGauge(),
                             "co2_aggregator_open_round_age_seconds",
                             "Seconds since the open round opened (0 "
                             "before the anchor is seeded).",
                             registry, shard_index)),
      round_deadline_(Family(prometheus::BuildGauge(),
                             "co2_aggregator_round_deadline_seconds",
                             "How long a round waits after its first "
                             "contribution before closing with its quorum.",
                             registry, shard_index)),
      round_contributors_(Family(
          prometheus::BuildGauge(), "co2_aggregator_round_contributors",
          "Contributors of the last closed round.", registry, shard_index)),
      quorum_closes_(Family(prometheus::BuildCounter(),
                            "co2_aggregator_quorum_closes_total",
                            "Rounds closed at their deadline with a "
                            "quorum, without every live worker.",
                            registry, shard_index)),
      refused_step_chunks_(Family(
          prometheus::BuildCounter(),
          "co2_aggregator_refused_step_chunks_total",
          "Chunks whose outer step was refused because their mean would "
          "have made the momentum, the update or the anchor non-finite; "
          "they kept their last good anchor.",
          registry, shard_index)),
      quorum_misses_(Family(prometheus::BuildCounter(),
                            "co2_aggregator_quorum_misses_total",
                            "Rounds whose deadline passed with fewer than "
                            "min_workers complete contributions.",
                            registry, shard_index)),
      reseeds_(Family(prometheus::BuildCounter(),
                      "co2_aggregator_reseeds_total",
                      "Times this shard found a job without state (its "
                      "checkpoint missing or corrupt) and a worker re-seeded "
                      "its anchor; the outer momentum restarted from zero.",
                      registry, shard_index)),
      checkpoint_duration_(
          Family(prometheus::BuildHistogram(),
                 "co2_aggregator_checkpoint_duration_seconds",
                 "Time to make one checkpoint of the shard state durable.",
                 registry, shard_index)),
      gap_penalty_mean_(Family(prometheus::BuildGauge(),
                               "co2_aggregator_gap_penalty_mean",
                               "Mean staleness gap penalty Λ of the last "
                               "outer step (1 = no damping).",
                               registry, shard_index)),
      momentum_norm_(Family(prometheus::BuildGauge(),
                            "co2_aggregator_outer_momentum_norm",
                            "L2 norm of this shard's outer momentum after "
                            "clipping.",
                            registry, shard_index)),
      clipped_fraction_(Family(prometheus::BuildGauge(),
                               "co2_aggregator_clipped_fraction",
                               "Fraction of this shard's outer-momentum "
                               "elements changed by clipping in the last "
                               "outer step.",
                               registry, shard_index)),
      norm_ratio_(Family(prometheus::BuildGauge(),
                         "co2_aggregator_contribution_norm_ratio",
                         "The largest ratio of a contribution's norm to its "
                         "chunk's median in the last closed round (0 with "
                         "JobConfig.outlier_ratio off): how close the "
                         "outlier rule is to holding one out.",
                         registry, shard_index)),
      refused_calls_(Family(prometheus::BuildCounter(),
                            "co2_aggregator_refused_calls_total",
                            "Calls refused for their credentials: a client "
                            "certificate or bearer token the shard does not "
                            "accept (unauthenticated) or a token for another "
                            "job (permission_denied).",
                            registry, shard_index)),
      checkpoint_failures_(Family(
          prometheus::BuildCounter(),
          "co2_aggregator_checkpoint_failures_total",
          "Durable writes of job state (checkpoints and round journals) that "
          "failed, by the class of their errno: no_space (ENOSPC, EDQUOT), "
          "io_error (EIO), permission (EACCES, EPERM, EROFS), other. Each "
          "retry of a failing write counts.",
          registry, shard_index)),
      jobs_(Family(prometheus::BuildGauge(), "co2_aggregator_jobs",
                   "Open jobs on this shard (finished and abandoned ones "
                   "are not counted).",
                   registry, shard_index)
                .Add({})),
      workers_(Family(prometheus::BuildGauge(), "co2_aggregator_workers",
                      "Workers holding a live lease, over every job.", registry,
                      shard_index)
                   .Add({})) {
  refused_calls_.Add({{"code", "unauthenticated"}});
  refused_calls_.Add({{"code", "permission_denied"}});
  for (int r = 0; r <= static_cast<int>(WriteFailure::kOther); ++r) {
    checkpoint_failures_.Add({{"reason", std::string(WriteFailureName(
                                             static_cast<WriteFailure>(r)))}});
  }
}

void ShardMetrics::OnContribution(const std::string& job, common::Codec codec,
                                  size_t bytes, bool late, bool duplicate) {
  const Labels labels = {{"co2_job", job}, {"codec", Codec(codec)}};
  contribution_chunks_.Add(labels).Increment();
  bytes_in_.Add(labels).Increment(static_cast<double>(bytes));
  if (late) late_chunks_.Add({{"co2_job", job}}).Increment();
  if (duplicate) duplicate_chunks_.Add({{"co2_job", job}}).Increment();
}

void ShardMetrics::OnRejected(const std::string& job, RejectReason reason) {
  rejected_chunks_
      .Add(
          {{"co2_job", job}, {"reason", std::string(RejectReasonName(reason))}})
      .Increment();
}

void ShardMetrics::OnRoundClosed(const std::string& job,
                                 const RoundClosedEvent& event) {
  const Labels labels = {{"co2_job", job}};
  rounds_completed_.Add(labels).Increment();
  RoundDuration(job).Observe(absl::ToDoubleSeconds(event.duration));
  contributions_.Add(labels).Increment(event.contributors);
  round_contributors_.Add(labels).Set(event.contributors);
  if (event.quorum_close) quorum_closes_.Add(labels).Increment();
  if (event.step.refused_chunks > 0) {
    refused_step_chunks_.Add(labels).Increment(event.step.refused_chunks);
  }
  gap_penalty_mean_.Add(labels).Set(event.step.mean_penalty);
  momentum_norm_.Add(labels).Set(std::sqrt(event.step.momentum_norm_sq));
  norm_ratio_.Add(labels).Set(event.max_norm_ratio);
  clipped_fraction_.Add(labels).Set(
      event.elements == 0 ? 0.0
                          : static_cast<double>(event.step.clipped) /
                                static_cast<double>(event.elements));
}

void ShardMetrics::OnUpdatePublished(const std::string& job,
                                     common::Codec codec, size_t bytes,
                                     size_t streams) {
  bytes_out_.Add({{"co2_job", job}, {"codec", Codec(codec)}})
      .Increment(static_cast<double>(bytes) * static_cast<double>(streams));
}

void ShardMetrics::OnPoll(const std::string& job, const ShardPollEvent& event) {
  const Labels labels = {{"co2_job", job}};
  active_workers_.Add(labels).Set(static_cast<double>(event.live_workers));
  open_round_.Add(labels).Set(static_cast<double>(event.open_round));
  open_round_age_.Add(labels).Set(absl::ToDoubleSeconds(event.open_round_age));
  round_deadline_.Add(labels).Set(absl::ToDoubleSeconds(event.round_deadline));
  {
    absl::MutexLock lock(&mu_);
    live_by_job_[job] = event.live_workers;
    SetTotalsLocked();
  }
  prometheus::Counter& misses = quorum_misses_.Add(labels);
  if (event.new_quorum_misses > 0) {
    misses.Increment(static_cast<double>(event.new_quorum_misses));
  }
  if (!checkpoint_duration_.Has(labels)) RegisterJobSeries(job);
}

void ShardMetrics::RegisterJobSeries(const std::string& job) {
  // Every per-job counter a panel or an alert reads exists, at 0, from the
  // job's first Poll: rate() and increase() see a series before the first
  // event, and a panel shows 0 rather than "No data". The checkpoint
  // histogram too, so shards without --checkpoint_dir show an empty one.
  const Labels labels = {{"co2_job", job}};
  CheckpointDuration(job);
  rounds_completed_.Add(labels);
  contributions_.Add(labels);
  late_chunks_.Add(labels);
  duplicate_chunks_.Add(labels);
  quorum_closes_.Add(labels);
  refused_step_chunks_.Add(labels);
  for (int r = 0; r <= static_cast<int>(RejectReason::kOther); ++r) {
    rejected_chunks_.Add({{"co2_job", job},
                          {"reason", std::string(RejectReasonName(
                                         static_cast<RejectReason>(r)))}});
  }
}

void ShardMetrics::OnCallRefused(absl::StatusCode code) {
  refused_calls_
      .Add({{"code", code == absl::StatusCode::kPermissionDenied
                         ? "permission_denied"
                         : "unauthenticated"}})
      .Increment();
}

void ShardMetrics::OnJobClosed(const std::string& job) {
  for (Counters* family :
       {&rounds_completed_, &contributions_, &contribution_chunks_,
        &late_chunks_, &duplicate_chunks_, &rejected_chunks_, &bytes_in_,
        &bytes_out_, &quorum_closes_, &refused_step_chunks_, &quorum_misses_,
        &reseeds_}) {
    RemoveJob(*family, job);
  }
  for (Gauges* family :
       {&active_workers_, &open_round_, &open_round_age_, &round_deadline_,
        &round_contributors_, &gap_penalty_mean_, &momentum_norm_,
        &clipped_fraction_, &norm_ratio_}) {
    RemoveJob(*family, job);
  }
  RemoveJob(round_duration_, job, RoundBuckets());
  RemoveJob(checkpoint_duration_, job, CheckpointBuckets());
  absl::MutexLock lock(&mu_);
  live_by_job_.erase(job);
  SetTotalsLocked();
}

void ShardMetrics::SetTotalsLocked() {
  size_t workers = 0;
  for (const auto& [name, live] : live_by_job_) workers += live;
  jobs_.Set(static_cast<double>(live_by_job_.size()));
  workers_.Set(static_cast<double>(workers));
}

void ShardMetrics::OnCheckpointWritten(const std::string& job,
                                       absl::Duration duration) {
  CheckpointDuration(job).Observe(absl::ToDoubleSeconds(duration));
}

void ShardMetrics::OnReseeded(const std::string& job, ReseedReason reason) {
  reseeds_
      .Add({{"co2_job", job},
            {"reason", std::string(ReseedReasonName(reason))}})
      .Increment();
}

void ShardMetrics::OnCheckpointFailed(const std::string& /*job*/,
                                      WriteFailure reason) {
  // Per shard, not per job: the disk is the shard's, and a job whose last
  // checkpoint fails has left OPEN (and its series) already.
  checkpoint_failures_
      .Add({{"reason", std::string(WriteFailureName(reason))}})
      .Increment();
}

prometheus::Histogram& ShardMetrics::RoundDuration(const std::string& job) {
  return round_duration_.Add({{"co2_job", job}}, RoundBuckets());
}

prometheus::Histogram& ShardMetrics::CheckpointDuration(
    const std::string& job) {
  return checkpoint_duration_.Add({{"co2_job", job}}, CheckpointBuckets());
}

}  // namespace co2::server
