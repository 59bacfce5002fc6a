#include "apps/co2-train/task_data.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/training/data_shard.h"
#include "client/training/evaluate.h"
#include "common/status_macros.h"

namespace co2::client {

absl::Status LoadTaskData(const TrainerOptions& o, Task task, int rank,
                          int world, TaskData& data) {
  data.task = task;
  if (task == Task::kFashionMnist) {
    FashionMnistOptions fo;
    fo.directory = o.data_dir;
    CO2_ASSIGN_OR_RETURN(data.mnist, LoadFashionMnist(fo));
    CO2_ASSIGN_OR_RETURN(
        data.shard, ShardIndices(data.mnist.train.size(), rank, world, o.seed));
    // Every rank runs the same number of steps: the smallest shard decides.
    data.steps_per_epoch = data.mnist.train.size() / world / o.batch_size;
  } else {
    CharCorpusOptions co;
    co.directory = o.corpus_dir;
    CO2_ASSIGN_OR_RETURN(CharCorpus corpus, CharCorpus::Load(co));
    data.corpus = std::make_unique<CharCorpus>(std::move(corpus));
    WindowSamplerOptions so;
    so.seq_len = o.seq_len;
    so.worker = rank;
    so.num_workers = world;
    so.seed = o.seed;
    CO2_ASSIGN_OR_RETURN(WindowSampler sampler,
                         WindowSampler::Create(data.corpus->train_text(), so));
    data.sampler.emplace(std::move(sampler));
    const int64_t part =
        static_cast<int64_t>(data.corpus->train_text().size()) / world;
    data.steps_per_epoch = part / (int64_t{o.batch_size} * o.seq_len);
  }
  if (data.steps_per_epoch < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "each of the ", world, " ranks has less than one batch of ",
        o.batch_size, " per epoch"));
  }
  return absl::OkStatus();
}

int64_t TotalSteps(const TrainerOptions& o, int64_t steps_per_epoch) {
  const int64_t by_epochs = o.epochs > 0 ? o.epochs * steps_per_epoch : 0;
  if (o.steps > 0 && by_epochs > 0) return std::min(o.steps, by_epochs);
  if (o.steps > 0) return o.steps;
  return by_epochs > 0 ? by_epochs : steps_per_epoch;
}

absl::StatusOr<Batch> NextBatch(const TrainerOptions& o, TaskData& data,
                                int rank, int world, int64_t step) {
  if (data.task == Task::kCharLm) {
    data.sampler->Sample(o.batch_size, &data.windows);
    return MakeCharLmBatch(data.windows, o.seq_len);
  }
  const int64_t epoch = step / data.steps_per_epoch;
  const int64_t in_epoch = step % data.steps_per_epoch;
  if (in_epoch == 0) {
    // A fresh order per epoch, from (seed, epoch, rank) alone.
    DeterministicShuffle(absl::MakeSpan(data.shard),
                         MixSeed(o.seed, 1 + epoch * world + rank));
  }
  return MakeFashionMnistBatch(
      data.mnist.train,
      absl::MakeConstSpan(data.shard).subspan(in_epoch * o.batch_size,
                                              o.batch_size));
}

void SkipBatches(const TrainerOptions& o, TaskData& data, int rank, int world,
                 int64_t from_step, int64_t to_step) {
  if (data.task == Task::kCharLm) {
    for (int64_t step = from_step; step < to_step; ++step) {
      data.sampler->Sample(o.batch_size, &data.windows);
    }
    return;
  }
  // The shuffles NextBatch would have made: those of the epochs that start
  // in [from_step, to_step).
  const int64_t per_epoch = data.steps_per_epoch;
  for (int64_t epoch = (from_step + per_epoch - 1) / per_epoch;
       epoch * per_epoch < to_step; ++epoch) {
    DeterministicShuffle(absl::MakeSpan(data.shard),
                         MixSeed(o.seed, 1 + epoch * world + rank));
  }
}

absl::StatusOr<TaskEval> EvaluateTask(const TrainerOptions& o, TaskData& data,
                                      TaskModel& model, int64_t limit) {
  EvalOptions eo;
  eo.seq_len = o.seq_len;
  if (data.task == Task::kFashionMnist) {
    FashionMnistExamples subset;
    const FashionMnistExamples* examples = &data.mnist.test;
    if (limit > 0 && limit < data.mnist.test.size()) {
      subset.labels.assign(data.mnist.test.labels.begin(),
                           data.mnist.test.labels.begin() + limit);
      subset.images.assign(
          data.mnist.test.images.begin(),
          data.mnist.test.images.begin() + limit * kFashionMnistPixels);
      examples = &subset;
    }
    CO2_ASSIGN_OR_RETURN(ClassificationEval e,
                         EvaluateFashionMnist(model, *examples, eo));
    return TaskEval{e.accuracy, e.loss};
  }
  eo.max_windows = limit;
  eo.batch_size = 64;
  CO2_ASSIGN_OR_RETURN(LanguageModelEval e,
                       EvaluateCharLm(model, data.corpus->heldout_text(), eo));
  return TaskEval{e.perplexity, e.loss};
}

}  // namespace co2::client
