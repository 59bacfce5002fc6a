#include "apps/co2-train/scale_plan.h"

#include <signal.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

// "worker 2", "workers 2 and 3" or "workers 2 .. 5": workers [from, to).
std::string WorkerRange(int from, int to) {
  if (to - from == 1) return absl::StrCat("worker ", from);
  if (to - from == 2) return absl::StrCat("workers ", from, " and ", from + 1);
  return absl::StrCat("workers ", from, " .. ", to - 1);
}

}  // namespace

ScalePlan PlanScale(const TrainerOptions& options) {
  ScalePlan plan;
  // ValidateTrainerOptions parsed it.
  plan.steps = ParseScale(options.scale, options.workers).value();
  plan.live_workers = InitialWorkers(options);
  if (!plan.steps.empty() && plan.steps.front().round == 0) plan.next = 1;
  return plan;
}

absl::Status ApplyScale(ScalePlan& plan, long done, ChildProcesses& processes,
                        FILE* user, const char* clear) {
  const std::vector<ScaleStep>& scale = plan.steps;
  int live = plan.live_workers;
  while (plan.next < scale.size() &&
         static_cast<uint64_t>(done) >= scale[plan.next].round) {
    const ScaleStep& step = scale[plan.next++];
    if (step.count > live) {
      for (int w = live; w < step.count; ++w) {
        CO2_RETURN_IF_ERROR(
            SpawnWorker(processes, w, {"--join"}, /*append=*/true));
      }
      std::fprintf(
          user, "%s[co2-train] round %ld: growing to %d workers (%s joining)\n",
          clear, done, step.count, WorkerRange(live, step.count).c_str());
    } else if (step.count < live) {
      for (Child& c : processes.children) {
        if (c.worker < step.count || c.worker >= live || !c.running) continue;
        c.leaving = true;
        if (c.local_rank == 0) kill(c.pid, SIGTERM);
      }
      std::fprintf(user,
                   "%s[co2-train] round %ld: shrinking to %d workers (%s "
                   "leaving at the next boundary)\n",
                   clear, done, step.count,
                   WorkerRange(step.count, live).c_str());
    }
    live = step.count;
    plan.live_workers = live;
  }
  std::fflush(user);
  return absl::OkStatus();
}

}  // namespace co2::client
