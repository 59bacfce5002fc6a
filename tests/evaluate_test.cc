#include "client/training/evaluate.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "client/training/models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::HasSubstr;

// Reads the class straight out of the first pixel (which the test sets to
// the label), so its accuracy is known exactly; optionally always answers
// class 0 instead. The scalar parameter only gives the model a device.
class OracleClassifier final : public TaskModel {
 public:
  explicit OracleClassifier(bool always_zero) : always_zero_(always_zero) {
    scale_ = register_parameter("scale", torch::ones({1}));
  }
  at::Tensor forward(const at::Tensor& input) override {
    forward_saw_training_ = is_training();
    forward_saw_grad_ = torch::GradMode::is_enabled();
    const int64_t batch = input.size(0);
    if (always_zero_) {
      return torch::zeros({batch, 10})
          .index_put_({torch::indexing::Slice(), 0}, 10.0);
    }
    // Pixel (0,0) of example i was normalised from the value of its label.
    const at::Tensor raw =
        (input.select(1, 0).select(1, 0).select(1, 0) * 0.3530f + 0.2860f) *
        255.0f;
    const at::Tensor label = raw.round().to(torch::kLong);
    return torch::one_hot(label, 10).to(torch::kFloat) * 20.0f * scale_;
  }
  Task task() const override { return Task::kFashionMnist; }
  int64_t num_classes() const override { return 10; }

  bool forward_saw_training_ = true;
  bool forward_saw_grad_ = true;

 private:
  bool always_zero_;
  at::Tensor scale_;
};

// Uniform logits over 256 bytes: loss ln 256, perplexity 256, exactly.
class UniformLm final : public TaskModel {
 public:
  at::Tensor forward(const at::Tensor& input) override {
    return torch::zeros({input.size(0), input.size(1), 256});
  }
  Task task() const override { return Task::kCharLm; }
  int64_t num_classes() const override { return 256; }
};

// 25 examples with labels i % 10; pixel (0,0) holds the label.
FashionMnistExamples Labelled() {
  FashionMnistExamples examples;
  for (int i = 0; i < 25; ++i) {
    std::vector<uint8_t> image(kFashionMnistPixels, 0);
    image[0] = static_cast<uint8_t>(i % 10);
    examples.images.insert(examples.images.end(), image.begin(), image.end());
    examples.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return examples;
}

TEST(EvaluateTest, PerfectClassifierScoresOneInAnyBatching) {
  OracleClassifier model(/*always_zero=*/false);
  model.train();
  for (int64_t batch_size : {1, 7, 25, 100}) {
    EvalOptions options;
    options.batch_size = batch_size;
    auto result = EvaluateFashionMnist(model, Labelled(), options);
    CO2_ASSERT_OK(result);
    EXPECT_EQ(result->examples, 25);
    EXPECT_DOUBLE_EQ(result->accuracy, 1.0) << "batch " << batch_size;
    EXPECT_LT(result->loss, 1e-6);
  }
  EXPECT_FALSE(model.forward_saw_training_);
  EXPECT_FALSE(model.forward_saw_grad_);
  EXPECT_TRUE(model.is_training());  // restored
}

TEST(EvaluateTest, ConstantClassifierScoresItsClassShare) {
  OracleClassifier model(/*always_zero=*/true);
  auto result = EvaluateFashionMnist(model, Labelled(), EvalOptions{});
  CO2_ASSERT_OK(result);
  EXPECT_DOUBLE_EQ(result->accuracy, 3.0 / 25.0);  // labels 0 at i=0,10,20
}

TEST(EvaluateTest, UntrainedCnnIsNearChanceOnTheRealTestSet) {
  auto test =
      LoadFashionMnistSplit(FashionMnistOptions{}, FashionMnistSplit::kTest);
  CO2_ASSERT_OK(test);
  auto model = MakeModel(Task::kFashionMnist);
  CO2_ASSERT_OK(model);
  auto result = EvaluateFashionMnist(**model, *test);
  CO2_ASSERT_OK(result);
  EXPECT_EQ(result->examples, 10000);
  EXPECT_LT(result->accuracy, 0.3);
  EXPECT_NEAR(result->loss, std::log(10.0), 0.3);
}

TEST(EvaluateTest, UniformLmHasPerplexityOfTheVocabulary) {
  UniformLm model;
  const std::string text(1001, 'x');
  EvalOptions options;
  options.seq_len = 10;
  options.batch_size = 8;
  auto result = EvaluateCharLm(model, text, options);
  CO2_ASSERT_OK(result);
  EXPECT_EQ(result->tokens, 1000);  // (1001 - 1) / 10 windows of 10
  EXPECT_NEAR(result->loss, std::log(256.0), 1e-6);
  EXPECT_NEAR(result->perplexity, 256.0, 1e-3);
  options.max_windows = 3;
  result = EvaluateCharLm(model, text, options);
  CO2_ASSERT_OK(result);
  EXPECT_EQ(result->tokens, 30);
}

TEST(EvaluateTest, UntrainedLstmIsNearUniform) {
  auto model = MakeModel(Task::kCharLm);
  CO2_ASSERT_OK(model);
  EvalOptions options;
  options.seq_len = 32;
  auto result = EvaluateCharLm(**model, std::string(5000, 'q'), options);
  CO2_ASSERT_OK(result);
  EXPECT_NEAR(result->perplexity, 256.0, 30.0);
}

TEST(EvaluateTest, Errors) {
  UniformLm lm;
  OracleClassifier cnn(false);
  auto wrong = EvaluateFashionMnist(lm, Labelled());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(), HasSubstr("charlm"));
  EXPECT_EQ(EvaluateCharLm(cnn, "abcdef").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(EvaluateFashionMnist(cnn, FashionMnistExamples{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(EvaluateCharLm(lm, "short").status().code(),  // < 65 bytes
            absl::StatusCode::kFailedPrecondition);
  EvalOptions bad;
  bad.batch_size = 0;
  EXPECT_EQ(EvaluateFashionMnist(cnn, Labelled(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::client
