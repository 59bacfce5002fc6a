#include "apps/co2-train/task_data.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

using ::testing::HasSubstr;

TrainerOptions Options(int batch_size) {
  TrainerOptions o;
  o.seed = 3;
  o.batch_size = batch_size;
  o.seq_len = 16;
  return o;
}

TEST(TaskDataTest, TotalStepsTakesTheSmallerBound) {
  TrainerOptions o;
  o.steps = 0;
  o.epochs = 0;
  EXPECT_EQ(TotalSteps(o, 30), 30);  // one epoch
  o.epochs = 2;
  EXPECT_EQ(TotalSteps(o, 30), 60);
  o.steps = 45;
  EXPECT_EQ(TotalSteps(o, 30), 45);
  o.steps = 100;
  EXPECT_EQ(TotalSteps(o, 30), 60);
  o.epochs = 0;
  EXPECT_EQ(TotalSteps(o, 30), 100);
}

// Drawing steps [0, from), then skipping to a step draws exactly the batch
// that drawing every step before it would have drawn (a rejoining worker,
// from 0, or a healed one, from where it was, trains the batches it would
// have).
void ExpectSkipEqualsDrawing(Task task, int batch_size, int64_t step,
                             int64_t from = 0) {
  SCOPED_TRACE(absl::StrCat("from ", from, " to ", step));
  const TrainerOptions o = Options(batch_size);
  TaskData drawn, skipped;
  CO2_ASSERT_OK(LoadTaskData(o, task, 1, 2, drawn));
  CO2_ASSERT_OK(LoadTaskData(o, task, 1, 2, skipped));
  absl::StatusOr<Batch> want;
  for (int64_t s = 0; s <= step; ++s) want = NextBatch(o, drawn, 1, 2, s);
  CO2_ASSERT_OK(want);
  for (int64_t s = 0; s < from; ++s) {
    CO2_ASSERT_OK(NextBatch(o, skipped, 1, 2, s));
  }
  SkipBatches(o, skipped, 1, 2, from, step);
  absl::StatusOr<Batch> got = NextBatch(o, skipped, 1, 2, step);
  CO2_ASSERT_OK(got);
  EXPECT_TRUE(torch::equal(got->input, want->input));
  EXPECT_TRUE(torch::equal(got->target, want->target));
}

TEST(TaskDataTest, SkippingIntoALaterEpochEqualsDrawingFashionMnist) {
  // 60,000 / 2 ranks / 1,000 = 30 steps per epoch: step 35 is in epoch 1.
  ExpectSkipEqualsDrawing(Task::kFashionMnist, 1000, 35);
  // From the middle of a run: within an epoch, across one, from an epoch's
  // first step (its shuffle not drawn yet), to an epoch's first step.
  ExpectSkipEqualsDrawing(Task::kFashionMnist, 1000, 20, 10);
  ExpectSkipEqualsDrawing(Task::kFashionMnist, 1000, 35, 10);
  ExpectSkipEqualsDrawing(Task::kFashionMnist, 1000, 65, 30);
  ExpectSkipEqualsDrawing(Task::kFashionMnist, 1000, 60, 31);
}

TEST(TaskDataTest, SkippingEqualsDrawingCharLm) {
  ExpectSkipEqualsDrawing(Task::kCharLm, 8, 20);
  ExpectSkipEqualsDrawing(Task::kCharLm, 8, 20, 7);
}

TEST(TaskDataTest, RanksDrawDifferentBatches) {
  const TrainerOptions o = Options(64);
  TaskData a, b;
  CO2_ASSERT_OK(LoadTaskData(o, Task::kFashionMnist, 0, 2, a));
  CO2_ASSERT_OK(LoadTaskData(o, Task::kFashionMnist, 1, 2, b));
  absl::StatusOr<Batch> x = NextBatch(o, a, 0, 2, 0);
  absl::StatusOr<Batch> y = NextBatch(o, b, 1, 2, 0);
  CO2_ASSERT_OK(x);
  CO2_ASSERT_OK(y);
  EXPECT_FALSE(torch::equal(x->input, y->input));
}

TEST(TaskDataTest, TooLargeABatchIsAClearError) {
  const TrainerOptions o = Options(40000);
  TaskData data;
  const absl::Status s = LoadTaskData(o, Task::kFashionMnist, 0, 2, data);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("less than one batch of 40000"));
}

TEST(TaskDataTest, EvaluatesAnUntrainedModelNearChance) {
  const TrainerOptions o = Options(32);
  TaskData data;
  CO2_ASSERT_OK(LoadTaskData(o, Task::kFashionMnist, 0, 1, data));
  ModelOptions mo;
  mo.seed = 1;
  absl::StatusOr<std::shared_ptr<TaskModel>> model =
      MakeModel(Task::kFashionMnist, mo);
  CO2_ASSERT_OK(model);
  absl::StatusOr<TaskEval> e = EvaluateTask(o, data, **model, 500);
  CO2_ASSERT_OK(e);
  EXPECT_GT(e->metric, 0.0);
  EXPECT_LT(e->metric, 0.3);  // ten classes: about 0.1 untrained
  EXPECT_GT(e->loss, 1.5);    // about ln 10 = 2.3
}

}  // namespace
}  // namespace co2::client
