// The launcher's children: one process per local rank of every worker, each
// re-executing co2-train in the worker role with its log file. They are
// spawned into one process group (led by the first child), so that the
// launcher can kill them all at once, and die with the launcher
// (PR_SET_PDEATHSIG). Everything a child needs is prepared before fork:
// after it, only async-signal-safe calls until exec. Torch-free; the
// launcher's thread only.
#ifndef CO2_APPS_CO2_TRAIN_CHILD_PROCESSES_H_
#define CO2_APPS_CO2_TRAIN_CHILD_PROCESSES_H_

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace co2::client {

struct Child {
  int worker = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // from waitpid
  int restarts = 0;
  bool started =
      false;  // spawned at least once (a scaled job starts some later)
  bool leaving = false;  // asked to leave the job (TrainerOptions::scale)
  std::string log;
  std::vector<std::string> args;
};

struct ChildProcesses {
  std::vector<Child> children;
  pid_t pgid = 0;      // the children's process group (0: none yet)
  pid_t launcher = 0;  // the launcher's pid: a child dies with it
  sigset_t mask;       // the signal mask a child execs with
};

// How many children run.
size_t CountRunning(const ChildProcesses& processes);

// Starts every local rank of `worker` with its args and `extra`, its log
// appended to when `append`, into the children's process group (the first
// child spawned leads it). RESOURCE_EXHAUSTED if a fork fails.
absl::Status SpawnWorker(ChildProcesses& processes, int worker,
                         const std::vector<std::string>& extra, bool append);

// Kills the local ranks of `worker` that still run and starts all of them
// again into the running job (--rejoin), in the rendezvous of their next
// restart (--restart=K). RESOURCE_EXHAUSTED if a fork fails.
absl::Status RestartWorker(ChildProcesses& processes, int worker);

// Kills the children's process group and each child (a restarted child may
// have missed the group) with SIGKILL (SIGTERM asks a worker to leave the
// job cleanly, which a run that ends has no use for), and reaps every child.
void KillAll(ChildProcesses& processes);

// "exit code 1", "signal 9 (Killed)": a waitpid status.
std::string DescribeExit(int status);

// The last `lines` lines of a file, each indented.
std::string Tail(const std::string& path, int lines);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_CHILD_PROCESSES_H_
