// The run's progress as the launcher shows it: worker 0's leader appends a
// line to the progress file (ProgressPath, trainer.h) after every round, and
// the launcher reads them back and formats the line the user sees. Pure
// functions over the file; torch-free; any thread.
#ifndef CO2_APPS_CO2_TRAIN_RUN_PROGRESS_H_
#define CO2_APPS_CO2_TRAIN_RUN_PROGRESS_H_

#include <string>
#include <vector>

#include "apps/co2-train/trainer_options.h"

namespace co2::client {

// One progress line of worker 0's leader: round, total, loss, metric,
// exposed comm (s), elapsed (s).
struct Progress {
  long round = 0, total = 0;
  double loss = 0, metric = -1, exposed = 0, elapsed = 0;
  bool valid = false;
};

// Every progress line in the file, in order; a line's missing metric (-1)
// is the last one before it.
std::vector<Progress> ReadProgress(const std::string& path);

// "[co2-train] round 3/10  loss 0.5000  acc 81.00%  exposed comm 1.0%  4s";
// a line saying the workers start when `p` is not valid.
std::string ProgressLine(const TrainerOptions& options, const Progress& p);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_RUN_PROGRESS_H_
