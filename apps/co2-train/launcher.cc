#include "apps/co2-train/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/co2-train/child_processes.h"
#include "apps/co2-train/run_progress.h"
#include "apps/co2-train/run_report.h"
#include "apps/co2-train/scale_plan.h"
#include "common/status_macros.h"
#include "server/service/aggregator_server.h"

namespace co2::client {
namespace {

// While it lives, the process's stderr (where the embedded aggregator logs)
// goes to a file, and user() writes to the original stderr, so that the
// progress display stays one line. The saved descriptor is close-on-exec:
// children never hold the user's terminal or pipe.
class StderrToFile {
 public:
  explicit StderrToFile(const std::string& path) {
    saved_ = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (saved_ >= 0 && fd >= 0) dup2(fd, STDERR_FILENO);
    if (fd >= 0) close(fd);
    user_ = saved_ >= 0 ? fdopen(dup(saved_), "w") : nullptr;
  }
  ~StderrToFile() {
    if (user_ != nullptr) std::fclose(user_);
    if (saved_ >= 0) {
      dup2(saved_, STDERR_FILENO);
      close(saved_);
    }
  }
  StderrToFile(const StderrToFile&) = delete;
  StderrToFile& operator=(const StderrToFile&) = delete;
  FILE* user() const { return user_ != nullptr ? user_ : stderr; }

 private:
  int saved_ = -1;
  FILE* user_ = nullptr;
};

std::string NewJobName(absl::Time started) {
  return absl::StrCat("co2-train-", getpid(), "-", absl::ToUnixMillis(started));
}

// With a checkpoint directory: the job's name is kept in DIR/job, written by
// the first run and read by --resume (unless --job names it), and the
// embedded shards' checkpoints go to DIR/shards.
absl::Status ResumableJob(TrainerOptions& options, absl::Time started) {
  std::error_code ec;
  std::filesystem::create_directories(options.checkpoint_dir + "/shards", ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create ", options.checkpoint_dir, "/shards: ", ec.message()));
  }
  const std::string path = options.checkpoint_dir + "/job";
  if (options.resume) {
    if (!options.job.empty()) return absl::OkStatus();
    std::ifstream in(path);
    if (!(in >> options.job)) {
      return absl::NotFoundError(absl::StrCat(
          "--resume: no job name in ", path,
          " (is --checkpoint_dir the one of the run to continue?)"));
    }
    return absl::OkStatus();
  }
  if (options.job.empty()) options.job = NewJobName(started);
  return WriteFileAtomically(path, options.job + "\n");
}

std::map<std::string, std::string> Settings(const TrainerOptions& options) {
  return {{"task", options.task},
          {"model", options.model},
          {"algo", options.algo},
          {"workers", absl::StrCat(options.workers)},
          {"local_ranks", absl::StrCat(options.local_ranks)},
          {"rank_slices", options.rank_slices},
          {"tau", absl::StrCat(options.tau)},
          {"epochs", absl::StrCat(options.epochs)},
          {"steps", absl::StrCat(options.steps)},
          {"seed", absl::StrCat(options.seed)},
          {"optimizer", options.optimizer},
          {"lr", absl::StrCat(options.lr)},
          {"lr_schedule", options.lr_schedule},
          {"batch_size", absl::StrCat(options.batch_size)},
          {"alpha", absl::StrCat(options.alpha)},
          {"beta", absl::StrCat(options.beta)},
          {"momentum", options.momentum},
          {"momentum_period", absl::StrCat(options.momentum_period)},
          {"gap_penalty", options.gap_penalty},
          {"clip", options.clip},
          {"clip_value", absl::StrCat(options.clip_value)},
          {"codec", options.codec},
          {"downlink_codec", options.downlink_codec},
          {"deterministic", options.deterministic ? "true" : "false"},
          {"outlier_ratio", absl::StrCat(options.outlier_ratio)},
          {"eager", RunsEagerUpdates(options) ? "true" : "false"},
          {"carry_progress", options.carry_progress ? "true" : "false"},
          {"apply", options.apply},
          {"apply_by_step", absl::StrCat(options.apply_by_step)},
          {"scale", options.scale},
          {"shards", absl::StrCat(options.shards)}};
}


// The signals the launcher takes synchronously, and the masks around them.
struct SignalMasks {
  sigset_t taken;  // SIGINT, SIGTERM, SIGCHLD
  sigset_t old;    // the process's mask before
  sigset_t child;  // the mask a child execs with
};

// Signals are taken synchronously; every thread started after this inherits
// the mask, children get the old one back before exec, with SIGTERM
// blocked: a worker asked to leave before it installed its handler
// (RunWorker) gets the signal then, instead of dying.
SignalMasks BlockSignals() {
  SignalMasks m;
  sigemptyset(&m.taken);
  sigaddset(&m.taken, SIGINT);
  sigaddset(&m.taken, SIGTERM);
  sigaddset(&m.taken, SIGCHLD);
  sigprocmask(SIG_BLOCK, &m.taken, &m.old);
  m.child = m.old;
  sigaddset(&m.child, SIGTERM);
  return m;
}

// A fresh rendezvous store and no progress file in the run directory, a
// temporary one when none is given. Returns whether the launcher made it.
absl::StatusOr<bool> PrepareRunDir(TrainerOptions& options) {
  bool own_run_dir = false;
  if (options.run_dir.empty()) {
    std::string templ = "/tmp/co2-train.XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
    }
    options.run_dir = templ;
    own_run_dir = true;
  }
  std::error_code ec;
  // Rendezvous keys left by an earlier run in the same directory (one that
  // was killed) would be taken for this run's.
  std::filesystem::remove_all(options.run_dir + "/store", ec);
  std::filesystem::create_directories(options.run_dir + "/store", ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create ", options.run_dir, "/store: ", ec.message()));
  }
  std::filesystem::remove(ProgressPath(options.run_dir), ec);
  return own_run_dir;
}

absl::Status NameJob(TrainerOptions& options, absl::Time started) {
  if (!options.checkpoint_dir.empty()) return ResumableJob(options, started);
  if (options.job.empty()) options.job = NewJobName(started);
  return absl::OkStatus();
}

// The embedded shards on loopback, unless the workers use external ones or
// none (ddp); their addresses go into options.aggregators.
absl::StatusOr<std::vector<std::unique_ptr<server::AggregatorServer>>>
StartShards(TrainerOptions& options) {
  std::vector<std::unique_ptr<server::AggregatorServer>> shards;
  if (options.algo == "ddp" || !options.aggregators.empty()) return shards;
  for (int i = 0; i < options.shards; ++i) {
    server::AggregatorServerOptions shard_options;
    shard_options.address = "127.0.0.1:0";
    shard_options.registry.shard_index = i;
    shard_options.registry.num_shards = options.shards;
    shard_options.registry.default_round_timeout = options.round_timeout;
    if (!options.checkpoint_dir.empty()) {
      shard_options.registry.checkpoint_dir =
          absl::StrCat(options.checkpoint_dir, "/shards");
    }
    CO2_ASSIGN_OR_RETURN(std::unique_ptr<server::AggregatorServer> s,
                         server::AggregatorServer::Start(shard_options));
    options.aggregators.push_back(absl::StrCat("127.0.0.1:", s->port()));
    shards.push_back(std::move(s));
  }
  return shards;
}

// One child a local rank of every worker, none started yet.
ChildProcesses PlanChildren(const LaunchOptions& launch,
                            const TrainerOptions& options,
                            const sigset_t& child_mask) {
  ChildProcesses processes;
  processes.launcher = getpid();
  processes.mask = child_mask;
  for (int w = 0; w < options.workers; ++w) {
    for (int l = 0; l < options.local_ranks; ++l) {
      Child c;
      c.worker = w;
      c.local_rank = l;
      c.log = absl::StrCat(options.run_dir, "/rank-", w, "-", l, ".log");
      c.args = {launch.self_exe};
      c.args.insert(c.args.end(), launch.args.begin(), launch.args.end());
      c.args.push_back("--role=worker");
      c.args.push_back(absl::StrCat("--worker=", w));
      c.args.push_back(absl::StrCat("--local_rank=", l));
      c.args.push_back(absl::StrCat("--run_dir=", options.run_dir));
      c.args.push_back(absl::StrCat("--job=", options.job));
      // The workers share this host: each leader gets its own port.
      if (options.metrics_port > 0) {
        c.args.push_back(
            absl::StrCat("--metrics_port=", options.metrics_port + w));
      }
      c.args.push_back(absl::StrCat("--aggregators=",
                                    absl::StrJoin(options.aggregators, ",")));
      processes.children.push_back(std::move(c));
    }
  }
  return processes;
}

// The run while its children run: what the supervising loop, which wakes
// for a signal or four times a second, knows between two wake-ups.
struct Supervisor {
  Supervisor(const TrainerOptions& o, ChildProcesses& p, FILE* u)
      : options(o), processes(p), user(u) {}

  const TrainerOptions& options;
  ChildProcesses& processes;
  FILE* user;         // the user's stream (StderrToFile::user)
  bool live = false;  // it is a terminal: one progress line, redrawn
  ScalePlan scale;
  std::string last_line;     // the progress line shown last (live)
  size_t progress_seen = 0;  // lines of the progress file already shown
  bool interrupted = false;  // by SIGINT or SIGTERM
  absl::Status failure;
};

// What erases the live progress line before a line of its own.
const char* ClearLine(const Supervisor& s) { return s.live ? "\r\033[K" : ""; }

// The workers the job starts with; the others join as the plan grows it.
void StartWorkers(Supervisor& s) {
  for (int w = 0; w < s.scale.live_workers && s.failure.ok(); ++w) {
    s.failure = SpawnWorker(s.processes, w, {}, /*append=*/false);
  }
}

// Waits up to a poll's time for one of the `taken` signals; SIGINT and
// SIGTERM interrupt the run (CANCELLED).
void AwaitSignal(Supervisor& s, const sigset_t& taken) {
  timespec timeout{0, 250 * 1000 * 1000};
  const int sig = sigtimedwait(&taken, nullptr, &timeout);
  if (sig == SIGINT || sig == SIGTERM) {
    s.interrupted = true;
    s.failure = absl::CancelledError(
        absl::StrCat("interrupted by ", strsignal(sig), "; workers stopped"));
  }
}

// The worker rejoins the running job: it fetches the anchor and trains
// from the shards' round; the others never stopped. All its local ranks
// restart together, in a rendezvous of their own.
void RestartFailedWorker(Supervisor& s, const Child& c) {
  const TrainerOptions& options = s.options;
  const std::string why =
      options.local_ranks == 1
          ? DescribeExit(c.status)
          : absl::StrCat("local rank ", c.local_rank, ": ",
                         DescribeExit(c.status));
  const std::string ranks =
      options.local_ranks == 1
          ? ""
          : absl::StrCat(", all ", options.local_ranks, " local ranks");
  std::fprintf(
      s.user,
      "%s[co2-train] worker %d failed (%s); restarting it%s (%d of %d)\n",
      ClearLine(s), c.worker, why.c_str(), ranks.c_str(), c.restarts + 1,
      options.max_restarts);
  std::fflush(s.user);
  s.failure = RestartWorker(s.processes, c.worker);
}

// Reaps the children that exited. A failed one is restarted with its
// worker while --max_restarts allows (unless it was asked to leave), else
// it fails the run with its log's last lines.
void ReapChildren(Supervisor& s) {
  for (Child& c : s.processes.children) {
    if (!c.running || waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
    c.running = false;
    const bool failed = !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    if (!failed || !s.failure.ok()) continue;
    if (!c.leaving && c.restarts < s.options.max_restarts) {
      RestartFailedWorker(s, c);
      continue;
    }
    s.failure = absl::AbortedError(absl::StrCat(
        "worker ", c.worker, " local rank ", c.local_rank, " failed (",
        DescribeExit(c.status), "); last lines of ", c.log, ":\n",
        Tail(c.log, 12)));
  }
}

// On a terminal the latest line, redrawn; elsewhere a line every 10 rounds
// and at the last, each one even when several rounds passed between two
// polls.
void ShowProgress(Supervisor& s, const std::vector<Progress>& progress) {
  if (s.live) {
    const std::string line = ProgressLine(
        s.options, progress.empty() ? Progress() : progress.back());
    if (line != s.last_line) {
      std::fprintf(s.user, "\r\033[K%s", line.c_str());
      s.last_line = line;
    }
  } else {
    for (size_t i = s.progress_seen; i < progress.size(); ++i) {
      const Progress& p = progress[i];
      if (p.round == p.total || p.round % 10 == 0) {
        std::fprintf(s.user, "%s\n", ProgressLine(s.options, p).c_str());
      }
    }
  }
  s.progress_seen = progress.size();
  std::fflush(s.user);
}

// Until every child has exited or the run fails: reaps and restarts
// children, applies the scale plan as worker 0 progresses, and shows the
// progress.
void Supervise(Supervisor& s, const sigset_t& taken) {
  while (s.failure.ok() && CountRunning(s.processes) > 0) {
    AwaitSignal(s, taken);
    if (s.interrupted) break;
    ReapChildren(s);
    const std::vector<Progress> progress =
        ReadProgress(ProgressPath(s.options.run_dir));
    if (s.failure.ok() && s.scale.next < s.scale.steps.size()) {
      s.failure = ApplyScale(s.scale,
                             progress.empty() ? 0 : progress.back().round,
                             s.processes, s.user, ClearLine(s));
    }
    ShowProgress(s, progress);
  }
  if (s.live) std::fprintf(s.user, "\n");
  std::fflush(s.user);
}

// The run failed: an interrupted run removes the run directory it made
// (unless --keep_run_dir); any other failure keeps it and says where.
absl::Status Failed(const TrainerOptions& options, bool own_run_dir,
                    bool interrupted, const absl::Status& failure) {
  if (own_run_dir && !options.keep_run_dir && interrupted) {
    std::error_code ec;
    std::filesystem::remove_all(options.run_dir, ec);
    return failure;
  }
  return absl::Status(failure.code(),
                      absl::StrCat(failure.message(), "(logs kept in ",
                                   options.run_dir, ")"));
}

// The report of every rank that was started.
absl::StatusOr<std::vector<RankReport>> ReadRankReports(
    const TrainerOptions& options, const std::vector<Child>& children) {
  std::vector<RankReport> reports;
  for (const Child& c : children) {
    if (!c.started) continue;
    CO2_ASSIGN_OR_RETURN(
        RankReport r, ReadRankReport(RankReportPath(options.run_dir, c.worker,
                                                    c.local_rank)));
    reports.push_back(std::move(r));
  }
  return reports;
}

void PrintSummary(const TrainerOptions& options, const RunInfo& info,
                  const std::vector<RankReport>& reports,
                  const MergedSummary& summary) {
  std::printf(
      "co2-train: %s, algo=%s, %d workers x %d local ranks, tau=%d: %d rounds, "
      "%lld steps\n",
      options.task.c_str(), options.algo.c_str(), options.workers,
      options.local_ranks, options.tau, summary.rounds,
      static_cast<long long>(reports[0].steps));
  for (const auto& [name, value] : summary.final_metrics) {
    if (name.find("accuracy") != std::string::npos) {
      std::printf("  final %s: %.2f%%\n", name.c_str(), 100 * value);
    } else {
      std::printf("  final %s: %.4f\n", name.c_str(), value);
    }
  }
  std::printf("  final train loss: %.4f\n", summary.final_loss);
  std::printf("  wall time: %.1f s; exposed communication: %.2f s (%.1f%% of training)\n",
              info.wall_s, summary.exposed_comm_s, 100 * summary.exposed_comm_fraction);
  std::printf("  bytes sent: %.2f MB\n", summary.bytes_sent / 1e6);
  if (reports[0].slice) {
    std::printf("  exchange: every local rank its own shards' slice\n");
  } else if (options.local_ranks > 1 && options.algo != "ddp") {
    std::printf("  exchange: the local leader, the whole model\n");
  }
  std::printf("  parameters identical on every rank after every boundary: %s\n",
              summary.params_identical ? "yes" : summary.first_difference.c_str());
  if (!options.report.empty())
    std::printf("  report: %s\n", options.report.c_str());
  std::fflush(stdout);
}

// Merges the rank reports into the JSON report (--report) and the summary
// printed on stdout. DATA_LOSS when the ranks do not hold the same model.
absl::Status ReportRun(const TrainerOptions& options,
                       const std::vector<Child>& children,
                       absl::Time started) {
  CO2_ASSIGN_OR_RETURN(std::vector<RankReport> reports,
                       ReadRankReports(options, children));
  CO2_ASSIGN_OR_RETURN(MergedSummary summary, Summarize(reports));
  RunInfo info;
  info.settings = Settings(options);
  info.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  info.aggregators = options.aggregators;
  if (!options.report.empty()) {
    CO2_RETURN_IF_ERROR(WriteFileAtomically(
        options.report, MergedReportJson(info, reports, summary)));
  }
  PrintSummary(options, info, reports, summary);
  if (!summary.params_identical) {
    return absl::DataLossError(absl::StrCat(
        "the ranks do not hold the same model: ", summary.first_difference,
        " (logs kept in ", options.run_dir, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunLauncher(const LaunchOptions& launch) {
  const absl::Time started = absl::Now();
  TrainerOptions options = launch.trainer;
  CO2_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  CO2_RETURN_IF_ERROR(CheckDataset(options));
  const SignalMasks masks = BlockSignals();
  CO2_ASSIGN_OR_RETURN(const bool own_run_dir, PrepareRunDir(options));
  CO2_RETURN_IF_ERROR(NameJob(options, started));

  const StderrToFile quiet(options.run_dir + "/aggregator.log");
  CO2_ASSIGN_OR_RETURN(
      std::vector<std::unique_ptr<server::AggregatorServer>> shards,
      StartShards(options));
  ChildProcesses processes = PlanChildren(launch, options, masks.child);
  Supervisor supervisor(options, processes, quiet.user());
  supervisor.scale = PlanScale(options);
  supervisor.live = options.progress && isatty(fileno(quiet.user()));
  StartWorkers(supervisor);
  Supervise(supervisor, masks.taken);
  KillAll(processes);
  for (auto& s : shards) s->Shutdown(absl::Seconds(1));
  sigprocmask(SIG_SETMASK, &masks.old, nullptr);
  if (!supervisor.failure.ok()) {
    return Failed(options, own_run_dir, supervisor.interrupted,
                  supervisor.failure);
  }

  CO2_RETURN_IF_ERROR(ReportRun(options, processes.children, started));
  if (own_run_dir && !options.keep_run_dir) {
    std::error_code ec;
    std::filesystem::remove_all(options.run_dir, ec);
  }
  return absl::OkStatus();
}

}  // namespace co2::client
