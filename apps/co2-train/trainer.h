// The example trainer behind co2-train: one local rank of one worker, which
// loads its shard of the data, builds the model, wraps the inner optimizer in
// a Co2Optimizer and trains, writing its progress and a per-rank report into
// the run directory that the launcher (launcher.h) merges.
//
// Every rank derives everything from TrainerOptions alone (the seed fixes the
// model initialisation, the data partition and the batch order), so a run is
// reproducible and no rank ever needs another's configuration.
// Torch-free header. RunWorker runs on the calling thread and blocks until
// training ends; every wait inside it has a deadline from the options.
#ifndef CO2_APPS_CO2_TRAIN_TRAINER_H_
#define CO2_APPS_CO2_TRAIN_TRAINER_H_

#include <string>

#include "absl/status/status.h"
#include "apps/co2-train/trainer_options.h"

namespace co2::client {

// Checks that the data set of the task loads and validates (used by the
// launcher before it spawns anything, so a bad install fails in one line).
absl::Status CheckDataset(const TrainerOptions& options);

// Trains as local rank `local_rank` of worker `worker`. options.run_dir must
// exist; options.aggregators must be set unless algo is ddp.
absl::Status RunWorker(const TrainerOptions& options, int worker,
                       int local_rank);

// Files in the run directory.
std::string RankReportPath(const std::string& run_dir, int worker,
                           int local_rank);
std::string ProgressPath(const std::string& run_dir);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_TRAINER_H_
