// RankRecorder: builds the RankReport (run_report.h) one rank of co2-train
// writes into the run directory. After every inner step it takes the rounds
// the rank's Co2Optimizer closed since the last call: each goes to the
// report's curve, to the worker's metrics (a leader that serves them) and,
// on the reporter (worker 0's leader), to the progress file the launcher
// shows; every eval_every rounds the leader evaluates the anchor. At the
// end it adds the run's totals and, on the reporter, the final evaluation.
// It borrows the optimizer, the data, the model and the metrics, which
// outlive it. One thread: the rank's.
#ifndef CO2_APPS_CO2_TRAIN_RANK_RECORDER_H_
#define CO2_APPS_CO2_TRAIN_RANK_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "apps/co2-train/run_report.h"
#include "apps/co2-train/task_data.h"
#include "apps/co2-train/trainer_options.h"
#include "client/algo.h"
#include "client/training/co2_optimizer.h"
#include "client/training/models.h"
#include "client/worker_metrics.h"

namespace co2::client {

// What the recorder reads from and writes to; every pointer is borrowed.
struct RankSources {
  const TrainerOptions* options = nullptr;
  std::string report_path;    // RankReportPath
  std::string progress_path;  // ProgressPath: the reporter appends to it
  Task task = Task::kFashionMnist;
  Algo algo = Algo::kCo2;
  Co2Optimizer* co2 = nullptr;
  TaskData* data = nullptr;
  TaskModel* model = nullptr;
  WorkerMetrics* metrics = nullptr;  // null: this rank serves none
};

class RankRecorder {
 public:
  // Training of `total_rounds` rounds starts now, on local rank `local_rank`
  // of `worker`.
  RankRecorder(const RankSources& sources, int worker, int local_rank,
               int64_t total_rounds);
  ~RankRecorder();
  RankRecorder(const RankRecorder&) = delete;
  RankRecorder& operator=(const RankRecorder&) = delete;

  // The loss of an inner step of the round being computed.
  void AddLoss(double loss) { round_loss_ += loss; }
  // The batch, forward and backward of an inner step: with the optimizer's
  // own compute (gradient averaging, inner step) the whole inner step.
  void AddWork(absl::Duration work) { round_work_ += work; }

  // Records the rounds the optimizer closed since the last call. The drain
  // in Finish (no steps) is left out of the curve; final_hash covers it.
  absl::Status RecordRounds();

  // The worker left the job before computing `round`.
  void RecordLeft(uint64_t round) { report_.left_at = round; }

  // Ends the curve, adds the totals (wall time since `started`, when the
  // process began) and writes the report to report_path.
  absl::Status WriteReport(absl::Time started);

 private:
  void ObserveRound(const RoundStats& s);
  absl::Status EvaluateRound(RankRound& r);
  void ShowProgress(const RankRound& r, size_t index);
  absl::Status EvaluateFinal();
  void CloseProgress();

  const RankSources sources_;
  const bool leader_;    // local rank 0
  const bool reporter_;  // worker 0's leader
  const int64_t total_rounds_;
  const absl::Time train_start_;
  FILE* progress_ = nullptr;  // the reporter's, while training
  RankReport report_;
  size_t consumed_ = 0;  // of co2->rounds()
  double round_loss_ = 0;
  absl::Duration round_work_;
};

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_RANK_RECORDER_H_
