// Launcher: one command runs a whole local co2-train experiment. It checks
// the options and the data set, starts the embedded aggregator shards (unless
// external ones are given), spawns workers × local_ranks child processes that
// re-execute the same binary in the worker role, shows a one-line progress
// display, merges the rank reports into the JSON report and prints a summary.
//
// Children live in their own process group: on any exit path (success, a
// child's failure, SIGINT/SIGTERM) the launcher kills the whole group and
// reaps it; children also die with the launcher (PR_SET_PDEATHSIG). A child
// that fails ends the run with its exit status and the tail of its log,
// unless TrainerOptions::max_restarts allows restarting it: it is then
// executed again with --rejoin and rejoins the running job.
// Torch-free. Call from the main thread before other threads exist: it
// blocks SIGINT/SIGTERM/SIGCHLD for the process and takes them synchronously.
#ifndef CO2_APPS_CO2_TRAIN_LAUNCHER_H_
#define CO2_APPS_CO2_TRAIN_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "apps/co2-train/trainer.h"

namespace co2::client {

struct LaunchOptions {
  TrainerOptions trainer;
  // The binary the children execute, and the arguments they get before the
  // role flags the launcher appends (normally the launcher's own argv[1..]).
  std::string self_exe = "/proc/self/exe";
  std::vector<std::string> args;
};

// Runs the experiment. CANCELLED after SIGINT/SIGTERM; the failing child's
// status (with its log tail) when a rank fails; INVALID_ARGUMENT or the data
// set's error before anything is spawned.
absl::Status RunLauncher(const LaunchOptions& options);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_LAUNCHER_H_
