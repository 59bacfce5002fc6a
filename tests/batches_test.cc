#include "client/training/batches.h"

#include <torch/torch.h>

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Three examples: image i is filled with pixel value 100*i, label 7-i.
FashionMnistExamples Tiny() {
  FashionMnistExamples examples;
  for (int i = 0; i < 3; ++i) {
    examples.images.insert(examples.images.end(), kFashionMnistPixels,
                           static_cast<uint8_t>(100 * i));
    examples.labels.push_back(static_cast<uint8_t>(7 - i));
  }
  return examples;
}

std::vector<int64_t> Sizes(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

TEST(BatchesTest, FashionMnistBatchPicksAndNormalises) {
  const FashionMnistExamples examples = Tiny();
  const std::vector<int64_t> indices = {2, 0};
  auto batch = MakeFashionMnistBatch(examples, indices);
  CO2_ASSERT_OK(batch);
  EXPECT_THAT(Sizes(batch->input), ElementsAre(2, 1, 28, 28));
  EXPECT_EQ(batch->input.scalar_type(), torch::kFloat);
  EXPECT_EQ(batch->target.scalar_type(), torch::kLong);
  EXPECT_EQ(batch->target[0].item<int64_t>(), 5);
  EXPECT_EQ(batch->target[1].item<int64_t>(), 7);
  const float expect200 = (200 / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  const float expect0 = -kFashionMnistMean / kFashionMnistStd;
  EXPECT_TRUE(
      torch::allclose(batch->input[0], torch::full({1, 28, 28}, expect200)));
  EXPECT_TRUE(
      torch::allclose(batch->input[1], torch::full({1, 28, 28}, expect0)));
}

TEST(BatchesTest, FashionMnistBatchRejectsBadIndex) {
  const FashionMnistExamples examples = Tiny();
  const std::vector<int64_t> indices = {0, 3};
  auto batch = MakeFashionMnistBatch(examples, indices);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr("index 3"));
  const std::vector<int64_t> negative = {-1};
  EXPECT_EQ(MakeFashionMnistBatch(examples, negative).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BatchesTest, NormalisedRealDataHasZeroMeanUnitStd) {
  auto test =
      LoadFashionMnistSplit(FashionMnistOptions{}, FashionMnistSplit::kTrain);
  CO2_ASSERT_OK(test);
  std::vector<int64_t> indices(20000);
  std::iota(indices.begin(), indices.end(), int64_t{0});
  auto batch = MakeFashionMnistBatch(*test, indices);
  CO2_ASSERT_OK(batch);
  EXPECT_NEAR(batch->input.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(batch->input.std().item<double>(), 1.0, 0.02);
}

TEST(BatchesTest, CharLmBatchShiftsTargetsByOne) {
  const std::vector<uint8_t> windows = {'a', 'b', 'c', 'd', 'w', 'x', 'y', 'z'};
  auto batch = MakeCharLmBatch(windows, /*seq_len=*/3);
  CO2_ASSERT_OK(batch);
  EXPECT_THAT(Sizes(batch->input), ElementsAre(2, 3));
  EXPECT_TRUE(torch::equal(
      batch->input, torch::tensor({'a', 'b', 'c', 'w', 'x', 'y'}, torch::kLong)
                        .view({2, 3})));
  EXPECT_TRUE(torch::equal(
      batch->target, torch::tensor({'b', 'c', 'd', 'x', 'y', 'z'}, torch::kLong)
                         .view({2, 3})));
}

TEST(BatchesTest, CharLmBatchRejectsPartialWindows) {
  const std::vector<uint8_t> windows(9, 'a');
  EXPECT_EQ(MakeCharLmBatch(windows, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCharLmBatch(windows, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::client
