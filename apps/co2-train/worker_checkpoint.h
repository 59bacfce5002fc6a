// A co2-train worker's checkpoint file: the WorkerCheckpoint its local
// leader's Co2Optimizer takes (client/training/co2_optimizer.h) with the
// inner optimizer's state, so that `co2-train --resume` continues a job whose
// processes all stopped bit for bit. One LibTorch archive per worker (with
// rank slices, one per local rank, each of the rank's slice), replaced
// atomically (written to a temporary file, then renamed). The data
// position is the round's (batches depend only on seed, rank and step). Any
// thread; the optimizer must not step meanwhile. Torch-free header.
#ifndef CO2_APPS_CO2_TRAIN_WORKER_CHECKPOINT_H_
#define CO2_APPS_CO2_TRAIN_WORKER_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/training/co2_optimizer.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace co2::client {

// DIR/worker-W.pt
std::string WorkerCheckpointPath(const std::string& dir, int worker);
// DIR/worker-W-rank-K.pt: local rank K's, with rank slices.
std::string RankCheckpointPath(const std::string& dir, int worker,
                               int local_rank);

// Writes `checkpoint` and `inner`'s state, with `job` (the job the file
// belongs to). PERMISSION_DENIED or DATA_LOSS naming the file when it
// cannot be written.
absl::Status SaveWorkerCheckpoint(const std::string& path,
                                  const std::string& job,
                                  const WorkerCheckpoint& checkpoint,
                                  const torch::optim::Optimizer& inner);

// Reads a file SaveWorkerCheckpoint wrote for `job` and loads the inner
// optimizer's state into `inner`. NOT_FOUND when there is none; DATA_LOSS
// naming the file when it is not such a file, or belongs to another job.
absl::StatusOr<WorkerCheckpoint> LoadWorkerCheckpoint(
    const std::string& path, const std::string& job,
    torch::optim::Optimizer& inner);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_WORKER_CHECKPOINT_H_
