// ScalePlan: TrainerOptions::scale as the launcher carries it out. As
// worker 0's progress reaches a step's round, the launcher starts workers
// into the running job (--join) or asks the highest-numbered ones to leave
// it (SIGTERM to their leader, which leaves at its next boundary).
// Torch-free; the launcher's thread only.
#ifndef CO2_APPS_CO2_TRAIN_SCALE_PLAN_H_
#define CO2_APPS_CO2_TRAIN_SCALE_PLAN_H_

#include <cstddef>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "apps/co2-train/child_processes.h"
#include "apps/co2-train/trainer_options.h"

namespace co2::client {

// TrainerOptions::scale and how far the run has come through it.
struct ScalePlan {
  std::vector<ScaleStep> steps;
  size_t next = 0;       // the first step not applied yet
  int live_workers = 0;  // the workers taking part now
};

// The plan of options.scale (valid options), before the job starts: the
// steps of round 0, if any, are where it starts.
ScalePlan PlanScale(const TrainerOptions& options);

// Applies the steps of the plan that worker 0's progress has reached
// (`done` rounds finished): starts workers into the running job (--join) or
// asks the highest-numbered to leave (SIGTERM to their leader, which leaves
// at its next boundary), and says what it did on `user`.
absl::Status ApplyScale(ScalePlan& plan, long done, ChildProcesses& processes,
                        FILE* user, const char* clear);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_SCALE_PLAN_H_
