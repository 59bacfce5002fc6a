#include "apps/co2-train/rank_recorder.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

}  // namespace

RankRecorder::RankRecorder(const RankSources& sources, int worker,
                           int local_rank, int64_t total_rounds)
    : sources_(sources),
      leader_(local_rank == 0),
      reporter_(worker == 0 && leader_),
      total_rounds_(total_rounds),
      train_start_(absl::Now()) {
  if (reporter_) {
    progress_ = std::fopen(sources_.progress_path.c_str(), "a");
  }
  report_.worker = worker;
  report_.local_rank = local_rank;
  report_.leader = leader_;
  report_.metric_name =
      sources_.task == Task::kFashionMnist ? "test_accuracy" : "val_perplexity";
}

RankRecorder::~RankRecorder() { CloseProgress(); }

absl::Status RankRecorder::RecordRounds() {
  const std::vector<RoundStats>& rounds = sources_.co2->rounds();
  while (consumed_ < rounds.size()) {
    const RoundStats& s = rounds[consumed_++];
    if (s.steps == 0) {
      // A heal in Finish's drain: the last round's boundary continued at
      // the round it names (past the job's last, with the final anchor).
      if (s.healed_to && !report_.rounds.empty()) {
        report_.rounds.back().healed_to = s.healed_to;
        if (s.heal_reason != nullptr) {
          report_.rounds.back().heal_reason = s.heal_reason;
        }
      }
      continue;
    }
    ObserveRound(s);
    RankRound r;
    r.round = s.round;
    r.steps = s.steps;
    r.loss = s.steps > 0 ? round_loss_ / s.steps : 0;
    round_loss_ = 0;
    round_work_ = absl::ZeroDuration();
    r.compute_s = absl::ToDoubleSeconds(s.compute);
    r.exposed_comm_s = absl::ToDoubleSeconds(s.exposed_comm);
    r.boundary_s = absl::ToDoubleSeconds(s.boundary);
    r.bytes_sent = s.bytes_sent;
    r.params_hash = Hex(s.params_hash);
    r.applied_after_steps = s.applied_after_steps;
    r.healed_to = s.healed_to;
    if (s.heal_reason != nullptr) r.heal_reason = s.heal_reason;
    const size_t index = s.round + 1;
    const int eval_every = sources_.options->eval_every;
    if (leader_ && eval_every > 0 && index % eval_every == 0) {
      CO2_RETURN_IF_ERROR(EvaluateRound(r));
    }
    ShowProgress(r, index);
    report_.rounds.push_back(std::move(r));
  }
  return absl::OkStatus();
}

// Before the round's work is reset: the metrics' compute is the whole of
// its inner steps.
void RankRecorder::ObserveRound(const RoundStats& s) {
  if (sources_.metrics == nullptr) return;
  WorkerRoundSample sample;
  sample.inner_steps = s.steps;
  sample.compute = round_work_ + s.compute;
  sample.exposed_comm = s.exposed_comm;
  sample.push = s.push;
  sample.bytes_sent = s.bytes_sent;
  sample.anchor_mismatches = s.anchor_mismatches;
  sample.heal_reason = s.heal_reason;
  sample.heal_time = s.heal_time;
  sample.staleness = StalenessOf(sources_.algo);
  sources_.metrics->ObserveRound(sample);
}

// The anchor: with eager updates or carried progress a worker's parameters
// are its own offset from it.
absl::Status RankRecorder::EvaluateRound(RankRound& r) {
  TaskEval e;
  CO2_RETURN_IF_ERROR(sources_.co2->EvaluateAtAnchor([&]() -> absl::Status {
    CO2_ASSIGN_OR_RETURN(
        e, EvaluateTask(*sources_.options, *sources_.data, *sources_.model,
                        sources_.options->eval_examples));
    return absl::OkStatus();
  }));
  r.metric = e.metric;
  r.eval_loss = e.loss;
  return absl::OkStatus();
}

void RankRecorder::ShowProgress(const RankRound& r, size_t index) {
  if (progress_ == nullptr) return;
  std::fprintf(progress_, "%zu %lld %.6g %.6g %.6g %.6g\n", index,
               static_cast<long long>(total_rounds_), r.loss, r.metric,
               absl::ToDoubleSeconds(sources_.co2->total_exposed_comm()),
               absl::ToDoubleSeconds(absl::Now() - train_start_));
  std::fflush(progress_);
}

absl::Status RankRecorder::WriteReport(absl::Time started) {
  CloseProgress();
  report_.train_s = absl::ToDoubleSeconds(absl::Now() - train_start_);
  if (reporter_) CO2_RETURN_IF_ERROR(EvaluateFinal());
  const Co2Optimizer& co2 = *sources_.co2;
  report_.steps = static_cast<int64_t>(co2.steps());
  report_.exposed_comm_s = absl::ToDoubleSeconds(co2.total_exposed_comm());
  report_.bytes_sent = co2.bytes_sent();
  report_.final_hash = Hex(co2.ParamsHash());
  if (co2.rank_slices()) report_.slice = co2.slice();
  const MemoryReport m = co2.Memory();
  report_.memory_bytes = {
      {"params", static_cast<double>(m.params)},
      {"grads", static_cast<double>(m.grads)},
      {"anchor", static_cast<double>(m.anchor)},
      {"staging", static_cast<double>(m.staging)},
      {"optimizer_state", static_cast<double>(m.optimizer_state)},
      {"client_buffers", static_cast<double>(m.client_buffers)},
      {"total", static_cast<double>(m.Total())}};
  report_.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  return WriteRankReport(sources_.report_path, report_);
}

absl::Status RankRecorder::EvaluateFinal() {
  CO2_ASSIGN_OR_RETURN(
      TaskEval e,
      EvaluateTask(*sources_.options, *sources_.data, *sources_.model,
                   sources_.options->final_eval_examples));
  if (sources_.task == Task::kFashionMnist) {
    report_.final_metrics["test_accuracy"] = e.metric;
    report_.final_metrics["test_loss"] = e.loss;
  } else {
    report_.final_metrics["val_perplexity"] = e.metric;
    report_.final_metrics["val_loss"] = e.loss;
  }
  return absl::OkStatus();
}

void RankRecorder::CloseProgress() {
  if (progress_ != nullptr) std::fclose(progress_);
  progress_ = nullptr;
}

}  // namespace co2::client
