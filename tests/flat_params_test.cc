#include "client/training/flat_params.h"

#include <torch/torch.h>

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module(
        "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)));
    fc = register_module("fc", torch::nn::Linear(3 * 4 * 4, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv->forward(x));
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

Net MakeNet(uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

TEST(FlatParamsTest, RehomingKeepsValuesAndMakesViews) {
  Net net = MakeNet(1);
  torch::Tensor x = torch::randn({2, 1, 6, 6});
  torch::Tensor before = net->forward(x).detach().clone();
  std::vector<torch::Tensor> originals;
  for (const auto& p : net->parameters())
    originals.push_back(p.detach().clone());

  auto flat = FlatParams::Create(net->parameters());
  CO2_ASSERT_OK(flat);
  const int64_t expected = 3 * 1 * 3 * 3 + 3 + 5 * 48 + 5;
  EXPECT_EQ((*flat)->numel(), expected);
  EXPECT_EQ((*flat)->BytesHeld(), 2 * 4 * static_cast<size_t>(expected));

  EXPECT_TRUE(torch::equal(net->forward(x), before));
  int64_t offset = 0;
  auto params = net->parameters();
  float* base = (*flat)->params().data_ptr<float>();
  float* gbase = (*flat)->grads().data_ptr<float>();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], originals[i]));
    EXPECT_EQ(params[i].data_ptr<float>(), base + offset) << "param " << i;
    EXPECT_EQ(params[i].grad().data_ptr<float>(), gbase + offset);
    offset += params[i].numel();
  }
  // Writing through the flat buffer is visible in the module.
  (*flat)->params().zero_();
  EXPECT_EQ(net->forward(x).abs().sum().item<float>(), 0.0f);
}

TEST(FlatParamsTest, BackwardAccumulatesIntoFlatGrads) {
  Net net = MakeNet(2);
  Net ref = MakeNet(2);
  auto flat = FlatParams::Create(net->parameters());
  CO2_ASSERT_OK(flat);
  torch::Tensor x = torch::randn({4, 1, 6, 6});
  net->forward(x).pow(2).sum().backward();
  ref->forward(x).pow(2).sum().backward();
  EXPECT_EQ((*flat)->RebindGrads(), 0);
  std::vector<torch::Tensor> ref_grads;
  for (const auto& p : ref->parameters()) ref_grads.push_back(p.grad().flatten());
  EXPECT_TRUE(torch::allclose((*flat)->grads(), torch::cat(ref_grads)));
}

TEST(FlatParamsTest, RebindRepairsReplacedGradients) {
  Net net = MakeNet(3);
  auto flat = FlatParams::Create(net->parameters());
  CO2_ASSERT_OK(flat);
  torch::Tensor x = torch::randn({4, 1, 6, 6});
  net->zero_grad(/*set_to_none=*/true);  // every gradient dropped
  net->forward(x).sum().backward();      // autograd allocates fresh ones
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().flatten().clone());
  EXPECT_EQ((*flat)->RebindGrads(), static_cast<int>(grads.size()));
  EXPECT_TRUE(torch::equal((*flat)->grads(), torch::cat(grads)));
  EXPECT_EQ((*flat)->RebindGrads(), 0);
  (*flat)->ZeroGrads();
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.0f);
  }
}

// An optimizer built on the re-homed parameters follows the same trajectory
// as one on an untouched copy of the model, and keeps the views intact.
template <typename Opt, typename Options>
void ExpectSameTrajectory(Options options) {
  Net net = MakeNet(4);
  Net ref = MakeNet(4);
  auto flat = FlatParams::Create(net->parameters());
  CO2_ASSERT_OK(flat);
  Opt opt(net->parameters(), options);
  Opt ref_opt(ref->parameters(), options);
  torch::manual_seed(5);
  for (int step = 0; step < 20; ++step) {
    torch::Tensor x = torch::randn({8, 1, 6, 6});
    torch::Tensor y = torch::randint(0, 5, {8});
    opt.zero_grad();
    ref_opt.zero_grad();
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(net->forward(x), y);
    torch::Tensor ref_loss =
        torch::nn::functional::cross_entropy(ref->forward(x), y);
    loss.backward();
    ref_loss.backward();
    EXPECT_EQ((*flat)->RebindGrads(), 0) << "step " << step;
    opt.step();
    ref_opt.step();
    EXPECT_FLOAT_EQ(loss.item<float>(), ref_loss.item<float>()) << step;
  }
  std::vector<torch::Tensor> ref_params;
  for (const auto& p : ref->parameters()) ref_params.push_back(p.detach().flatten());
  EXPECT_TRUE(torch::allclose((*flat)->params(), torch::cat(ref_params)));
  float* base = (*flat)->params().data_ptr<float>();
  EXPECT_EQ(net->parameters()[0].data_ptr<float>(), base);
}

TEST(FlatParamsTest, SgdStillWorks) {
  ExpectSameTrajectory<torch::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4));
}

TEST(FlatParamsTest, AdamWStillWorks) {
  ExpectSameTrajectory<torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

TEST(FlatParamsTest, RejectsBadParameters) {
  EXPECT_EQ(FlatParams::Create({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto doubles = FlatParams::Create({torch::zeros({3}, torch::kDouble)});
  EXPECT_EQ(doubles.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(doubles.status().message(), ::testing::HasSubstr("float32"));
}

TEST(FlatParamsTest, FrozenParametersGetNoGradient) {
  torch::Tensor a = torch::ones({2}).requires_grad_(true);
  torch::Tensor b = torch::ones({3});  // frozen
  auto flat = FlatParams::Create({a, b});
  CO2_ASSERT_OK(flat);
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ((*flat)->numel(), 5);
}

}  // namespace
}  // namespace co2::client
