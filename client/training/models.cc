#include "client/training/models.h"

#include <torch/torch.h>

#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/training/torch_status.h"

namespace co2::client {
namespace {

namespace nn = torch::nn;

// conv 1->16 5x5, pool 2, conv 16->32 5x5, pool 2, fc 512->128->10:
// 80,202 parameters, small enough for CPU training on two cores.
class FashionCnn final : public TaskModel {
 public:
  FashionCnn()
      : conv1_(
            register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 16, 5)))),
        conv2_(
            register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 5)))),
        fc1_(register_module("fc1", nn::Linear(32 * 4 * 4, 128))),
        fc2_(register_module("fc2", nn::Linear(128, 10))) {}

  at::Tensor forward(const at::Tensor& input) override {
    TORCH_CHECK(input.dim() == 4 && input.size(1) == 1 && input.size(2) == 28 &&
                    input.size(3) == 28,
                "fashion-mnist model expects [B, 1, 28, 28], got ",
                input.sizes());
    at::Tensor h = torch::max_pool2d(torch::relu(conv1_->forward(input)), 2);
    h = torch::max_pool2d(torch::relu(conv2_->forward(h)), 2);
    h = torch::relu(fc1_->forward(h.flatten(1)));
    return fc2_->forward(h);
  }

  Task task() const override { return Task::kFashionMnist; }
  int64_t num_classes() const override { return 10; }

 private:
  nn::Conv2d conv1_;
  nn::Conv2d conv2_;
  nn::Linear fc1_;
  nn::Linear fc2_;
};

// Two hidden layers of 2048 (5,824,522 parameters): one inner step costs
// ~1 GFLOP at batch 32, and a round moves the 23.3 MB fp32 model each way.
class FashionWideMlp final : public TaskModel {
 public:
  FashionWideMlp()
      : fc1_(register_module("fc1", nn::Linear(kFashionPixels, kWidth))),
        fc2_(register_module("fc2", nn::Linear(kWidth, kWidth))),
        fc3_(register_module("fc3", nn::Linear(kWidth, 10))) {}

  at::Tensor forward(const at::Tensor& input) override {
    TORCH_CHECK(input.dim() == 4 && input.size(1) == 1 && input.size(2) == 28 &&
                    input.size(3) == 28,
                "fashion-mnist model expects [B, 1, 28, 28], got ",
                input.sizes());
    at::Tensor h = torch::relu(fc1_->forward(input.flatten(1)));
    h = torch::relu(fc2_->forward(h));
    return fc3_->forward(h);
  }

  Task task() const override { return Task::kFashionMnist; }
  int64_t num_classes() const override { return 10; }

 private:
  static constexpr int64_t kFashionPixels = 28 * 28;
  static constexpr int64_t kWidth = 2048;
  nn::Linear fc1_;
  nn::Linear fc2_;
  nn::Linear fc3_;
};

// Embedding -> LSTM -> linear head over bytes. An LSTM rather than a
// Transformer: fewer parameters for the same quality at this size and no
// attention mask or positional encoding to get wrong.
class CharLstm final : public TaskModel {
 public:
  explicit CharLstm(const ModelOptions& o)
      : vocab_size_(o.char_vocab_size),
        embedding_(register_module(
            "embedding",
            nn::Embedding(o.char_vocab_size, o.char_embedding_dim))),
        lstm_(register_module(
            "lstm",
            nn::LSTM(nn::LSTMOptions(o.char_embedding_dim, o.char_hidden_size)
                         .num_layers(o.char_num_layers)
                         .batch_first(true)))),
        head_(register_module(
            "head", nn::Linear(o.char_hidden_size, o.char_vocab_size))) {}

  at::Tensor forward(const at::Tensor& input) override {
    TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kLong,
                "charlm model expects int64 [B, T], got ", input.scalar_type(),
                " ", input.sizes());
    // Every window starts from a zero state: windows are sampled at random
    // offsets, so there is no previous state to carry.
    at::Tensor h = std::get<0>(lstm_->forward(embedding_->forward(input)));
    return head_->forward(h);
  }

  Task task() const override { return Task::kCharLm; }
  int64_t num_classes() const override { return vocab_size_; }

 private:
  int64_t vocab_size_;
  nn::Embedding embedding_;
  nn::LSTM lstm_;
  nn::Linear head_;
};

}  // namespace

absl::StatusOr<Task> ParseTask(absl::string_view name) {
  if (name == "fashion-mnist") return Task::kFashionMnist;
  if (name == "charlm") return Task::kCharLm;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown task \"", name, "\"; expected fashion-mnist or charlm"));
}

std::string TaskName(Task task) {
  return task == Task::kFashionMnist ? "fashion-mnist" : "charlm";
}

absl::StatusOr<ModelSize> ParseModelSize(absl::string_view name) {
  if (name == "small") return ModelSize::kSmall;
  if (name == "wide") return ModelSize::kWide;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model \"", name, "\"; expected small or wide"));
}

absl::StatusOr<std::shared_ptr<TaskModel>> MakeModel(
    Task task, const ModelOptions& options) {
  if (task == Task::kCharLm) {
    if (options.size == ModelSize::kWide) {
      return absl::InvalidArgumentError(
          "the wide model is for fashion-mnist only");
    }
    if (options.char_vocab_size < 1 || options.char_embedding_dim < 1 ||
        options.char_hidden_size < 1 || options.char_num_layers < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "charlm dimensions must be positive: vocab ", options.char_vocab_size,
          ", embedding ", options.char_embedding_dim, ", hidden ",
          options.char_hidden_size, ", layers ", options.char_num_layers));
    }
  }
  try {
    torch::manual_seed(options.seed);
    if (task == Task::kFashionMnist && options.size == ModelSize::kWide) {
      return std::make_shared<FashionWideMlp>();
    }
    if (task == Task::kFashionMnist) return std::make_shared<FashionCnn>();
    return std::make_shared<CharLstm>(options);
  } catch (...) {
    return TorchExceptionToStatus(absl::StrCat("building ", TaskName(task)));
  }
}

absl::StatusOr<at::Tensor> Forward(TaskModel& model, const at::Tensor& input) {
  try {
    return model.forward(input);
  } catch (...) {
    return TorchExceptionToStatus(
        absl::StrCat(TaskName(model.task()), " forward"));
  }
}

absl::StatusOr<at::Tensor> CrossEntropy(const at::Tensor& logits,
                                        const at::Tensor& target) {
  try {
    TORCH_CHECK(logits.dim() == target.dim() + 1 &&
                    logits.sizes().slice(0, target.dim()) == target.sizes(),
                "logits ", logits.sizes(), " do not match targets ",
                target.sizes());
    // Flatten (batch, time) so one call serves both tasks.
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  } catch (...) {
    return TorchExceptionToStatus("cross entropy");
  }
}

absl::StatusOr<at::Tensor> ComputeLoss(TaskModel& model,
                                       const at::Tensor& input,
                                       const at::Tensor& target) {
  absl::StatusOr<at::Tensor> logits = Forward(model, input);
  if (!logits.ok()) return logits.status();
  return CrossEntropy(*logits, target);
}

int64_t NumParameters(const torch::nn::Module& model) {
  int64_t total = 0;
  for (const at::Tensor& p : model.parameters()) total += p.numel();
  return total;
}

}  // namespace co2::client
