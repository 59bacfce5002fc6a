// Held-out evaluation for the example trainer's two tasks: test accuracy
// and loss for Fashion-MNIST, loss and perplexity for the character LM.
// Runs in eval mode without autograd on the model's own device and restores
// the model's training mode afterwards. Same threading rule as the model:
// one thread at a time. Torch-free header.
#ifndef CO2_CLIENT_TRAINING_EVALUATE_H_
#define CO2_CLIENT_TRAINING_EVALUATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/training/fashion_mnist.h"

namespace co2::client {

class TaskModel;  // client/training/models.h

struct EvalOptions {
  // Examples (fashion-mnist) or windows (charlm) per forward pass.
  int64_t batch_size = 500;
  // charlm: predicted tokens per window.
  int64_t seq_len = 64;
  // charlm: evaluate only the first max_windows windows (0 = the whole text),
  // to bound the cost of frequent evaluations.
  int64_t max_windows = 0;
};

struct ClassificationEval {
  double loss = 0;      // mean cross-entropy, nats
  double accuracy = 0;  // fraction of argmax predictions equal to the label
  int64_t examples = 0;
};

struct LanguageModelEval {
  double loss = 0;        // mean cross-entropy per predicted byte, nats
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // predicted bytes
};

// Every example of `examples`, in order. FAILED_PRECONDITION when the model
// is not a fashion-mnist model or there are no examples; INVALID_ARGUMENT
// for batch_size < 1 or malformed logits.
absl::StatusOr<ClassificationEval> EvaluateFashionMnist(
    TaskModel& model, const FashionMnistExamples& examples,
    const EvalOptions& options = {});

// Cuts `text` (CharCorpus::heldout_text) into consecutive windows of
// seq_len + 1 bytes starting every seq_len bytes, so that each byte after the
// first is predicted exactly once, from a fresh state at each window start.
// FAILED_PRECONDITION when the model is not a charlm model or the text is
// shorter than one window; INVALID_ARGUMENT for bad options.
absl::StatusOr<LanguageModelEval> EvaluateCharLm(
    TaskModel& model, absl::string_view text, const EvalOptions& options = {});

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_EVALUATE_H_
