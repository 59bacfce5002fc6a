#include "client/training/models.h"

#include <torch/torch.h>

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<TaskModel> Make(Task task, uint64_t seed = 1) {
  ModelOptions options;
  options.seed = seed;
  auto model = MakeModel(task, options);
  CO2_EXPECT_OK(model);
  return model.ok() ? *model : nullptr;
}

std::vector<int64_t> Sizes(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

TEST(ModelsTest, ParseTask) {
  EXPECT_EQ(*ParseTask("fashion-mnist"), Task::kFashionMnist);
  EXPECT_EQ(*ParseTask("charlm"), Task::kCharLm);
  EXPECT_EQ(TaskName(Task::kCharLm), "charlm");
  auto bad = ParseTask("mnist");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("mnist"));
}

TEST(ModelsTest, FashionCnnShapesAndSize) {
  auto model = Make(Task::kFashionMnist);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->task(), Task::kFashionMnist);
  EXPECT_EQ(model->num_classes(), 10);
  // conv1 416 + conv2 12,832 + fc1 65,664 + fc2 1,290.
  EXPECT_EQ(NumParameters(*model), 80202);
  auto logits = Forward(*model, torch::randn({5, 1, 28, 28}));
  CO2_ASSERT_OK(logits);
  EXPECT_THAT(Sizes(*logits), ElementsAre(5, 10));
}

TEST(ModelsTest, WideMlpShapesAndSize) {
  EXPECT_EQ(*ParseModelSize("small"), ModelSize::kSmall);
  EXPECT_EQ(*ParseModelSize("wide"), ModelSize::kWide);
  EXPECT_EQ(ParseModelSize("huge").status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelOptions options;
  options.size = ModelSize::kWide;
  auto model = MakeModel(Task::kFashionMnist, options);
  CO2_ASSERT_OK(model);
  // fc1 784*2048 + 2048, fc2 2048*2048 + 2048, fc3 2048*10 + 10.
  EXPECT_EQ(NumParameters(**model), 1607680 + 4196352 + 20490);
  auto logits = Forward(**model, torch::randn({3, 1, 28, 28}));
  CO2_ASSERT_OK(logits);
  EXPECT_THAT(Sizes(*logits), ElementsAre(3, 10));
  EXPECT_EQ(MakeModel(Task::kCharLm, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelsTest, CharLstmShapesAndSize) {
  auto model = Make(Task::kCharLm);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->num_classes(), 256);
  // embedding 256*64 + LSTM 4*128*(64+128) + 2*4*128 + head 128*256 + 256.
  EXPECT_EQ(NumParameters(*model), 16384 + 98304 + 1024 + 33024);
  auto logits = Forward(*model, torch::randint(0, 256, {3, 17}, torch::kLong));
  CO2_ASSERT_OK(logits);
  EXPECT_THAT(Sizes(*logits), ElementsAre(3, 17, 256));
}

TEST(ModelsTest, CharLstmOptionsChangeTheModel) {
  ModelOptions options;
  options.char_vocab_size = 50;
  options.char_num_layers = 2;
  auto model = MakeModel(Task::kCharLm, options);
  CO2_ASSERT_OK(model);
  EXPECT_EQ((*model)->num_classes(), 50);
  auto logits = Forward(**model, torch::zeros({2, 4}, torch::kLong));
  CO2_ASSERT_OK(logits);
  EXPECT_THAT(Sizes(*logits), ElementsAre(2, 4, 50));
  options.char_hidden_size = 0;
  EXPECT_EQ(MakeModel(Task::kCharLm, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelsTest, MalformedInputIsAStatusNotAnException) {
  auto cnn = Make(Task::kFashionMnist);
  auto lm = Make(Task::kCharLm);
  ASSERT_NE(cnn, nullptr);
  ASSERT_NE(lm, nullptr);
  auto bad = Forward(*cnn, torch::zeros({2, 3, 28, 28}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("[2, 3, 28, 28]"));
  EXPECT_EQ(Forward(*lm, torch::zeros({2, 4})).status().code(),
            absl::StatusCode::kInvalidArgument);  // float ids
  EXPECT_EQ(  // byte id outside the vocabulary
      Forward(*lm, torch::full({1, 2}, 300, torch::kLong)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CrossEntropy(torch::zeros({4, 10}), torch::zeros({5}, torch::kLong))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelsTest, CrossEntropyOfUniformLogitsIsLogC) {
  auto loss = CrossEntropy(torch::zeros({2, 3, 256}),
                           torch::randint(0, 256, {2, 3}, torch::kLong));
  CO2_ASSERT_OK(loss);
  EXPECT_NEAR(loss->item<double>(), std::log(256.0), 1e-5);
}

std::vector<at::Tensor> ParamsOf(const TaskModel& model) {
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.parameters()) params.push_back(p.clone());
  return params;
}

bool SameParams(const std::vector<at::Tensor>& a,
                const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

class SeededModelTest : public ::testing::TestWithParam<Task> {};

TEST_P(SeededModelTest, SameSeedSameParametersOtherSeedOther) {
  auto a = Make(GetParam(), 7);
  torch::randn({100});  // disturb the global generator in between
  auto b = Make(GetParam(), 7);
  auto c = Make(GetParam(), 8);
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(SameParams(ParamsOf(*a), ParamsOf(*b)));
  EXPECT_FALSE(SameParams(ParamsOf(*a), ParamsOf(*c)));
}

TEST_P(SeededModelTest, SgdOnAFixedBatchReducesTheLoss) {
  auto model = Make(GetParam(), 3);
  ASSERT_NE(model, nullptr);
  torch::manual_seed(11);
  at::Tensor input, target;
  double lr = 0.1;
  if (GetParam() == Task::kFashionMnist) {
    lr = 0.02;  // the CNN diverges on random data at 0.1 with momentum
    input = torch::randn({32, 1, 28, 28});
    target = torch::randint(0, 10, {32}, torch::kLong);
  } else {
    // A periodic sequence, so the targets are learnable from the inputs.
    at::Tensor seq = torch::arange(0, 33, torch::kLong).remainder(5) + 97;
    seq = seq.unsqueeze(0).repeat({8, 1});
    input = seq.slice(1, 0, 32);
    target = seq.slice(1, 1, 33);
  }
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(lr).momentum(0.9));
  auto first = ComputeLoss(*model, input, target);
  CO2_ASSERT_OK(first);
  const double initial = first->item<double>();
  double last = initial;
  for (int step = 0; step < 30; ++step) {
    sgd.zero_grad();
    auto loss = ComputeLoss(*model, input, target);
    CO2_ASSERT_OK(loss);
    loss->backward();
    sgd.step();
    last = loss->item<double>();
  }
  auto final_loss = ComputeLoss(*model, input, target);
  CO2_ASSERT_OK(final_loss);
  EXPECT_LT(final_loss->item<double>(), 0.75 * initial)
      << "initial " << initial << ", last step " << last;
}

INSTANTIATE_TEST_SUITE_P(Tasks, SeededModelTest,
                         ::testing::Values(Task::kFashionMnist, Task::kCharLm),
                         [](const ::testing::TestParamInfo<Task>& info) {
                           return info.param == Task::kFashionMnist
                                      ? std::string("FashionMnist")
                                      : std::string("CharLm");
                         });

}  // namespace
}  // namespace co2::client
