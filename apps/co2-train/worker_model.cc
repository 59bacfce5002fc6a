#include "apps/co2-train/worker_model.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "client/training/torch_status.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeInner(
    const TrainerOptions& options, const std::vector<torch::Tensor>& params) {
  try {
    if (options.optimizer == "sgd") {
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
          params, torch::optim::SGDOptions(options.lr)
                      .momentum(0.9)
                      .weight_decay(options.weight_decay)));
    }
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::AdamW(
        params, torch::optim::AdamWOptions(options.lr)
                    .weight_decay(options.weight_decay)));
  } catch (...) {
    return TorchExceptionToStatus("inner optimizer");
  }
}

}  // namespace

absl::StatusOr<WorkerModel> BuildWorkerModel(const TrainerOptions& options,
                                             Task task) {
  WorkerModel m;
  ModelOptions model_options;
  model_options.seed = options.seed;
  CO2_ASSIGN_OR_RETURN(model_options.size, ParseModelSize(options.model));
  CO2_ASSIGN_OR_RETURN(m.model, MakeModel(task, model_options));
  m.model->train();
  CO2_ASSIGN_OR_RETURN(m.flat, FlatParams::Create(m.model->parameters()));
  CO2_ASSIGN_OR_RETURN(m.inner, MakeInner(options, m.model->parameters()));
  return m;
}

double LearningRate(const TrainerOptions& options, int64_t step,
                    int64_t total) {
  if (options.lr_schedule != "cosine" || total <= 1) return options.lr;
  const double progress = static_cast<double>(step) / (total - 1);
  return 0.5 * options.lr * (1.0 + std::cos(M_PI * progress));
}

}  // namespace co2::client
