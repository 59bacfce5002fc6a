// TaskData: the examples one rank of co2-train trains and evaluates on, and
// the order it draws them in. It owns the loaded data set (Fashion-MNIST and
// this rank's shard of its indices, or the fortunes corpus and a window
// sampler) and a reused batch buffer. Batches depend only on (seed, rank,
// world, step), so a worker that rejoins a running job can skip to the step
// it resumes at and draw exactly the batches it would have drawn. One thread.
#ifndef CO2_APPS_CO2_TRAIN_TASK_DATA_H_
#define CO2_APPS_CO2_TRAIN_TASK_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "apps/co2-train/trainer_options.h"
#include "client/training/batches.h"
#include "client/training/char_corpus.h"
#include "client/training/fashion_mnist.h"
#include "client/training/models.h"

namespace co2::client {

struct TaskData {
  Task task = Task::kFashionMnist;
  FashionMnist mnist;
  std::vector<int64_t> shard;            // fashion-mnist: this rank's indices
  std::unique_ptr<CharCorpus> corpus;    // charlm; the sampler borrows it
  std::optional<WindowSampler> sampler;  // charlm
  std::vector<uint8_t> windows;          // charlm: reused batch buffer
  int64_t steps_per_epoch = 0;
};

// Loads the task's data for `rank` of `world` ranks. FAILED_PRECONDITION when
// a rank would get less than one batch per epoch.
absl::Status LoadTaskData(const TrainerOptions& o, Task task, int rank,
                          int world, TaskData& data);

// Inner steps of the run: the smaller of --steps and --epochs wins; one epoch
// when neither is set.
int64_t TotalSteps(const TrainerOptions& o, int64_t steps_per_epoch);

// The batch of inner step `step` of rank `rank`; steps are drawn in order.
absl::StatusOr<Batch> NextBatch(const TrainerOptions& o, TaskData& data,
                                int rank, int world, int64_t step);

// Puts the data stream, standing before inner step `from_step`, where it
// stands before step `to_step`, as if steps [from_step, to_step) had been
// drawn.
void SkipBatches(const TrainerOptions& o, TaskData& data, int rank, int world,
                 int64_t from_step, int64_t to_step);

struct TaskEval {
  double metric = 0;  // accuracy (fashion-mnist) or perplexity (charlm)
  double loss = 0;
};

// Evaluates `model` on the held-out data: the first `limit` examples
// (windows), all of them when `limit` is 0.
absl::StatusOr<TaskEval> EvaluateTask(const TrainerOptions& o, TaskData& data,
                                      TaskModel& model, int64_t limit);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_TASK_DATA_H_
