#include "client/training/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/training/batches.h"
#include "client/training/models.h"
#include "client/training/torch_status.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

// Puts the model in eval mode for the lifetime of the guard and restores
// whatever mode it had, even on an early error return.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(TaskModel& model)
      : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~EvalModeGuard() { model_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  TaskModel& model_;
  bool was_training_;
};

torch::Device ModelDevice(const TaskModel& model) {
  const std::vector<at::Tensor> params = model.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

// Sum (not mean) of the batch's cross-entropy and its number of correct
// argmax predictions, accumulated in double by the callers so that the
// result does not depend on the batch size.
struct BatchTotals {
  double loss_sum = 0;
  int64_t correct = 0;
};

absl::StatusOr<BatchTotals> RunBatch(TaskModel& model, const Batch& batch,
                                     const torch::Device& device) {
  try {
    const at::Tensor input = batch.input.to(device);
    const at::Tensor target = batch.target.to(device).reshape({-1});
    at::Tensor logits = model.forward(input);
    TORCH_CHECK(logits.dim() >= 2 && logits.size(-1) == model.num_classes() &&
                    logits.numel() / model.num_classes() == target.numel(),
                "logits ", logits.sizes(), " do not fit ", target.numel(),
                " targets of ", model.num_classes(), " classes");
    logits = logits.reshape({-1, model.num_classes()}).to(torch::kFloat);
    BatchTotals totals;
    totals.loss_sum =
        torch::nn::functional::cross_entropy(
            logits, target,
            torch::nn::functional::CrossEntropyFuncOptions().reduction(
                torch::kSum))
            .item<double>();
    totals.correct = logits.argmax(1).eq(target).sum().item<int64_t>();
    return totals;
  } catch (...) {
    return TorchExceptionToStatus(
        absl::StrCat(TaskName(model.task()), " evaluation"));
  }
}

absl::Status CheckTask(const TaskModel& model, Task expected) {
  if (model.task() == expected) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("cannot evaluate a ", TaskName(model.task()), " model on ",
                   TaskName(expected), " data"));
}

}  // namespace

absl::StatusOr<ClassificationEval> EvaluateFashionMnist(
    TaskModel& model, const FashionMnistExamples& examples,
    const EvalOptions& options) {
  CO2_RETURN_IF_ERROR(CheckTask(model, Task::kFashionMnist));
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be >= 1, got ", options.batch_size));
  }
  if (examples.size() == 0) {
    return absl::FailedPreconditionError("no examples to evaluate");
  }
  torch::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const torch::Device device = ModelDevice(model);
  std::vector<int64_t> indices(examples.size());
  std::iota(indices.begin(), indices.end(), int64_t{0});
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < examples.size();
       begin += options.batch_size) {
    const int64_t end = std::min(begin + options.batch_size, examples.size());
    CO2_ASSIGN_OR_RETURN(
        const Batch batch,
        MakeFashionMnistBatch(examples, absl::MakeConstSpan(indices).subspan(
                                            begin, end - begin)));
    CO2_ASSIGN_OR_RETURN(const BatchTotals totals,
                         RunBatch(model, batch, device));
    loss_sum += totals.loss_sum;
    correct += totals.correct;
  }
  ClassificationEval result;
  result.examples = examples.size();
  result.loss = loss_sum / static_cast<double>(result.examples);
  result.accuracy =
      static_cast<double>(correct) / static_cast<double>(result.examples);
  return result;
}

absl::StatusOr<LanguageModelEval> EvaluateCharLm(TaskModel& model,
                                                 absl::string_view text,
                                                 const EvalOptions& options) {
  CO2_RETURN_IF_ERROR(CheckTask(model, Task::kCharLm));
  if (options.batch_size < 1 || options.seq_len < 1 ||
      options.max_windows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad evaluation options: batch_size ", options.batch_size, ", seq_len ",
        options.seq_len, ", max_windows ", options.max_windows));
  }
  const int64_t seq_len = options.seq_len;
  const int64_t text_size = static_cast<int64_t>(text.size());
  if (text_size < seq_len + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("evaluation text of ", text_size,
                     " bytes is shorter than one window of ", seq_len + 1));
  }
  int64_t num_windows = (text_size - 1) / seq_len;
  if (options.max_windows > 0) {
    num_windows = std::min(num_windows, options.max_windows);
  }
  torch::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const torch::Device device = ModelDevice(model);
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  std::vector<uint8_t> windows;
  double loss_sum = 0;
  for (int64_t first = 0; first < num_windows; first += options.batch_size) {
    const int64_t count = std::min(options.batch_size, num_windows - first);
    windows.resize(static_cast<size_t>(count * (seq_len + 1)));
    for (int64_t w = 0; w < count; ++w) {
      std::copy_n(bytes + (first + w) * seq_len, seq_len + 1,
                  windows.data() + w * (seq_len + 1));
    }
    CO2_ASSIGN_OR_RETURN(const Batch batch, MakeCharLmBatch(windows, seq_len));
    CO2_ASSIGN_OR_RETURN(const BatchTotals totals,
                         RunBatch(model, batch, device));
    loss_sum += totals.loss_sum;
  }
  LanguageModelEval result;
  result.tokens = num_windows * seq_len;
  result.loss = loss_sum / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace co2::client
