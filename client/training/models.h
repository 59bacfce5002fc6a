// The example trainer's models: a small CNN for Fashion-MNIST and a small
// character-level LSTM language model, behind one base class so the trainer
// (and the CO2 optimizer, which only sees parameters()) need not know which
// task runs. Both are sized for quick CPU training on two cores. A wide MLP
// for Fashion-MNIST (5.8M parameters) gives benchmarks a model whose
// communication time is not negligible (bench/overlap).
//
// forward() may throw c10::Error like any torch module; Forward() and
// ComputeLoss() below catch it and return a Status. A model is used by one
// thread at a time.
#ifndef CO2_CLIENT_TRAINING_MODELS_H_
#define CO2_CLIENT_TRAINING_MODELS_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace co2::client {

enum class Task {
  kFashionMnist,  // "fashion-mnist": 28x28 images -> 10 classes
  kCharLm,        // "charlm": next-byte prediction on the fortunes corpus
};

// "fashion-mnist" or "charlm"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Task> ParseTask(absl::string_view name);
std::string TaskName(Task task);

enum class ModelSize {
  kSmall,  // "small": the CNN (80,202 parameters) or the LSTM
  kWide,   // "wide": fashion-mnist only, MLP 784-2048-2048-10 (5,824,522)
};

// "small" or "wide"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ModelSize> ParseModelSize(absl::string_view name);

struct ModelOptions {
  // torch::manual_seed(seed) runs just before the parameters are created, so
  // every worker starting from the same seed holds the same initial model.
  uint64_t seed = 0;
  ModelSize size = ModelSize::kSmall;
  int64_t char_vocab_size = 256;    // charlm: byte tokens (kCharVocabSize)
  int64_t char_embedding_dim = 64;  // charlm: embedding width
  int64_t char_hidden_size = 128;   // charlm: LSTM state width
  int64_t char_num_layers = 1;      // charlm: stacked LSTM layers
};

class TaskModel : public torch::nn::Module {
 public:
  // fashion-mnist: float [B, 1, 28, 28] -> logits [B, 10].
  // charlm:        int64 [B, T] byte ids -> logits [B, T, vocab].
  // Throws c10::Error on a malformed input.
  virtual at::Tensor forward(const at::Tensor& input) = 0;

  virtual Task task() const = 0;
  // Width of the logits' last dimension.
  virtual int64_t num_classes() const = 0;
};

// A freshly initialised model for `task`, on the CPU (the caller moves it).
// Reseeds torch's global CPU generator (see ModelOptions::seed).
// INVALID_ARGUMENT for a non-positive charlm dimension or a wide charlm.
absl::StatusOr<std::shared_ptr<TaskModel>> MakeModel(
    Task task, const ModelOptions& options = {});

// model.forward(input) with torch errors returned as INVALID_ARGUMENT.
absl::StatusOr<at::Tensor> Forward(TaskModel& model, const at::Tensor& input);

// Mean cross-entropy (nats) of logits [..., C] against int64 targets [...]
// of the same leading shape; differentiable.
absl::StatusOr<at::Tensor> CrossEntropy(const at::Tensor& logits,
                                        const at::Tensor& target);

// CrossEntropy(Forward(model, input), target): the training loss, attached
// to the autograd graph so that the caller can call backward() on it.
absl::StatusOr<at::Tensor> ComputeLoss(TaskModel& model,
                                       const at::Tensor& input,
                                       const at::Tensor& target);

// Total number of parameter elements.
int64_t NumParameters(const torch::nn::Module& model);

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_MODELS_H_
