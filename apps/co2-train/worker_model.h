// The model one rank of co2-train trains, as TrainerOptions make it: the
// task's module, its parameters re-homed into one flat buffer (FlatParams)
// and the inner optimizer over them, with the learning rate of each inner
// step. The seed fixes the initialisation, so every rank builds the same
// model. LibTorch header; one thread.
#ifndef CO2_APPS_CO2_TRAIN_WORKER_MODEL_H_
#define CO2_APPS_CO2_TRAIN_WORKER_MODEL_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "apps/co2-train/trainer_options.h"
#include "client/training/flat_params.h"
#include "client/training/models.h"

namespace co2::client {

// The model one rank trains: the module, its parameters re-homed into one
// flat buffer, and the inner optimizer over them.
struct WorkerModel {
  std::shared_ptr<TaskModel> model;
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<torch::optim::Optimizer> inner;
};

// INVALID_ARGUMENT for an unknown model size; LibTorch's errors as statuses.
absl::StatusOr<WorkerModel> BuildWorkerModel(const TrainerOptions& options,
                                             Task task);

// The inner learning rate of inner step `step` of `total` (lr_schedule).
double LearningRate(const TrainerOptions& options, int64_t step,
                    int64_t total);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_WORKER_MODEL_H_
