#include "apps/co2-train/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/co2-train/run_report.h"
#include "common/status_macros.h"
#include "server/service/aggregator_server.h"

namespace co2::client {
namespace {

struct Child {
  int worker = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // from waitpid
  int restarts = 0;
  bool started = false;  // spawned at least once (a scaled job starts some later)
  bool leaving = false;  // asked to leave the job (TrainerOptions::scale)
  std::string log;
  std::vector<std::string> args;
};

// "worker 2", "workers 2 and 3" or "workers 2 .. 5": workers [from, to).
std::string WorkerRange(int from, int to) {
  if (to - from == 1) return absl::StrCat("worker ", from);
  if (to - from == 2) return absl::StrCat("workers ", from, " and ", from + 1);
  return absl::StrCat("workers ", from, " .. ", to - 1);
}

// Forks and executes `args` in process group `pgid` (0: a new group led by
// the child), stdout and stderr to `log` (appended to when `append`). The
// child dies with `launcher` and gets `mask` back. Everything is prepared
// before fork: after it, only async-signal-safe calls until exec. Returns
// the pid, or -1 with errno set.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            bool append, pid_t pgid, pid_t launcher, const sigset_t& mask) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, pgid);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127);
    const int fd = open(log.c_str(), flags, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    sigprocmask(SIG_SETMASK, &mask, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid > 0) setpgid(pid, pgid);  // also here: no race with the child's own call
  return pid;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("status ", status);
}

// Starts every local rank of `worker` with its args and `extra`, into the
// process group `pgid` (0: a new one, then set to the first child's pid).
// RESOURCE_EXHAUSTED if a fork fails.
absl::Status SpawnWorker(std::vector<Child>& children, int worker,
                         const std::vector<std::string>& extra, bool append,
                         pid_t& pgid, pid_t launcher, const sigset_t& mask) {
  for (Child& c : children) {
    if (c.worker != worker) continue;
    std::vector<std::string> args = c.args;
    args.insert(args.end(), extra.begin(), extra.end());
    const pid_t pid = Spawn(args, c.log, append, pgid, launcher, mask);
    if (pid < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("fork: ", strerror(errno)));
    }
    if (pgid == 0) pgid = pid;
    c.pid = pid;
    c.running = true;
    c.started = true;
    c.leaving = false;
  }
  return absl::OkStatus();
}

// Kills the local ranks of `worker` that still run and starts all of them
// again into the running job (--rejoin), in the rendezvous of their next
// restart (--restart=K). RESOURCE_EXHAUSTED if a fork fails.
absl::Status RestartWorker(std::vector<Child>& children, int worker,
                           pid_t& pgid, pid_t launcher, const sigset_t& mask) {
  int restarts = 0;
  for (Child& c : children) {
    if (c.worker != worker) continue;
    if (c.running) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.running = false;
    }
    restarts = ++c.restarts;
  }
  return SpawnWorker(children, worker,
                     {"--rejoin", absl::StrCat("--restart=", restarts)},
                     /*append=*/true, pgid, launcher, mask);
}

// Applies the steps of TrainerOptions::scale that worker 0's progress has
// reached (`done` rounds finished): starts workers into the running job
// (--join) or asks the highest-numbered to leave (SIGTERM to their leader,
// which leaves at its next boundary). `live` is the count before; returns
// the count after and says what it did on `user`.
absl::StatusOr<int> ApplyScale(const std::vector<ScaleStep>& scale,
                               size_t& next, long done, int live,
                               std::vector<Child>& children, pid_t& pgid,
                               pid_t launcher, const sigset_t& mask,
                               FILE* user, const char* clear) {
  while (next < scale.size() && static_cast<uint64_t>(done) >= scale[next].round) {
    const ScaleStep& step = scale[next++];
    if (step.count > live) {
      for (int w = live; w < step.count; ++w) {
        CO2_RETURN_IF_ERROR(SpawnWorker(children, w, {"--join"},
                                        /*append=*/true, pgid, launcher, mask));
      }
      std::fprintf(user, "%s[co2-train] round %ld: growing to %d workers (%s joining)\n",
                   clear, done, step.count, WorkerRange(live, step.count).c_str());
    } else if (step.count < live) {
      for (Child& c : children) {
        if (c.worker < step.count || c.worker >= live || !c.running) continue;
        c.leaving = true;
        if (c.local_rank == 0) kill(c.pid, SIGTERM);
      }
      std::fprintf(user,
                   "%s[co2-train] round %ld: shrinking to %d workers (%s "
                   "leaving at the next boundary)\n",
                   clear, done, step.count, WorkerRange(step.count, live).c_str());
    }
    live = step.count;
  }
  std::fflush(user);
  return live;
}

// The last `lines` lines of a file.
std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > static_cast<size_t>(lines)
                          ? all.size() - lines
                          : 0;
  std::string out;
  for (size_t i = from; i < all.size(); ++i) absl::StrAppend(&out, "    ", all[i], "\n");
  return out;
}

// One progress line of worker 0's leader: round, total, loss, metric,
// exposed comm (s), elapsed (s).
struct Progress {
  long round = 0, total = 0;
  double loss = 0, metric = -1, exposed = 0, elapsed = 0;
  bool valid = false;
};

// Every progress line in the file, in order; a line's missing metric (-1)
// is the last one before it.
std::vector<Progress> ReadProgress(const std::string& path) {
  std::vector<Progress> all;
  std::ifstream in(path);
  double last_metric = -1;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    Progress q;
    if (fields >> q.round >> q.total >> q.loss >> q.metric >> q.exposed >>
        q.elapsed) {
      if (q.metric >= 0) last_metric = q.metric;
      q.metric = last_metric;
      q.valid = true;
      all.push_back(q);
    }
  }
  return all;
}

std::string FormatMetric(const std::string& task, double metric) {
  if (metric < 0) return "";
  if (task == "fashion-mnist") return absl::StrFormat("  acc %5.2f%%", 100 * metric);
  return absl::StrFormat("  ppl %.2f", metric);
}

std::string ProgressLine(const TrainerOptions& options, const Progress& p) {
  if (!p.valid) return "[co2-train] starting workers...";
  const double pct = p.elapsed > 0 ? 100 * p.exposed / p.elapsed : 0;
  return absl::StrFormat(
      "[co2-train] round %ld/%ld  loss %.4f%s  exposed comm %.1f%%  %.0fs",
      p.round, p.total, p.loss, FormatMetric(options.task, p.metric), pct,
      p.elapsed);
}

// Kills the children's process group and each child (a restarted child may
// have missed the group) with SIGKILL (SIGTERM asks a worker to leave the
// job cleanly, which a run that ends has no use for), and reaps every child.
void KillAll(std::vector<Child>& children, pid_t pgid) {
  if (pgid > 0) kill(-pgid, SIGKILL);
  for (Child& c : children) {
    if (!c.running) continue;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &c.status, 0);
    c.running = false;
  }
}

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

}  // namespace

absl::Status RunLauncher(const LaunchOptions& launch) {
  const absl::Time started = absl::Now();
  TrainerOptions options = launch.trainer;
  CO2_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  CO2_RETURN_IF_ERROR(CheckDataset(options));
  const bool uses_aggregator = options.algo != "ddp";

  // Signals are taken synchronously; every thread started below inherits
  // the mask, children get the old one back before exec.
  sigset_t signals, old_mask;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, &old_mask);
  // Children start with SIGTERM blocked: a worker asked to leave before it
  // installed its handler (RunWorker) gets the signal then, instead of dying.
  sigset_t child_mask = old_mask;
  sigaddset(&child_mask, SIGTERM);

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
  if (!options.checkpoint_dir.empty()) {
    CO2_RETURN_IF_ERROR(ResumableJob(options, started));
  } else if (options.job.empty()) {
    options.job = NewJobName(started);
  }

  const StderrToFile quiet(options.run_dir + "/aggregator.log");
  FILE* const user = quiet.user();
  std::vector<std::unique_ptr<server::AggregatorServer>> shards;
  if (uses_aggregator && options.aggregators.empty()) {
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
  }

  // Everything a child needs is prepared before fork: after it, only
  // async-signal-safe calls until exec.
  std::vector<Child> children;
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
      children.push_back(std::move(c));
    }
  }
  const pid_t launcher = getpid();
  pid_t pgid = 0;
  absl::Status failure = absl::OkStatus();
  // ValidateTrainerOptions parsed it.
  const std::vector<ScaleStep> scale =
      ParseScale(options.scale, options.workers).value();
  size_t scale_next = 0;
  int live_workers = InitialWorkers(options);
  if (!scale.empty() && scale.front().round == 0) scale_next = 1;
  for (int w = 0; w < live_workers && failure.ok(); ++w) {
    failure = SpawnWorker(children, w, {}, /*append=*/false, pgid, launcher,
                          child_mask);
  }

  const bool live = options.progress && isatty(fileno(user));
  std::string last_line;
  size_t running = 0;
  for (const Child& c : children) running += c.running ? 1 : 0;
  bool interrupted = false;
  size_t progress_seen = 0;  // lines of the progress file already shown
  while (failure.ok() && running > 0) {
    timespec timeout{0, 250 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &timeout);
    if (sig == SIGINT || sig == SIGTERM) {
      interrupted = true;
      failure = absl::CancelledError(
          absl::StrCat("interrupted by ", strsignal(sig), "; workers stopped"));
      break;
    }
    for (Child& c : children) {
      if (!c.running || waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
      c.running = false;
      --running;
      const bool failed = !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
      if (failed && failure.ok() && !c.leaving &&
          c.restarts < options.max_restarts) {
        // The worker rejoins the running job: it fetches the anchor and
        // trains from the shards' round; the others never stopped. All its
        // local ranks restart together, in a rendezvous of their own.
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
            user,
            "%s[co2-train] worker %d failed (%s); restarting it%s (%d of %d)\n",
            live ? "\r\033[K" : "", c.worker, why.c_str(), ranks.c_str(),
            c.restarts + 1, options.max_restarts);
        std::fflush(user);
        failure = RestartWorker(children, c.worker, pgid, launcher, child_mask);
        running = static_cast<size_t>(
            std::count_if(children.begin(), children.end(),
                          [](const Child& child) { return child.running; }));
        continue;
      }
      if (failed && failure.ok()) {
        failure = absl::AbortedError(absl::StrCat(
            "worker ", c.worker, " local rank ", c.local_rank, " failed (",
            DescribeExit(c.status), "); last lines of ", c.log, ":\n",
            Tail(c.log, 12)));
      }
    }
    const std::vector<Progress> progress =
        ReadProgress(ProgressPath(options.run_dir));
    if (failure.ok() && scale_next < scale.size()) {
      absl::StatusOr<int> scaled = ApplyScale(
          scale, scale_next, progress.empty() ? 0 : progress.back().round,
          live_workers, children, pgid, launcher, child_mask, user,
          live ? "\r\033[K" : "");
      if (scaled.ok()) {
        live_workers = *scaled;
        running = static_cast<size_t>(
            std::count_if(children.begin(), children.end(),
                          [](const Child& child) { return child.running; }));
      } else {
        failure = scaled.status();
      }
    }
    if (live) {
      const std::string line = ProgressLine(
          options, progress.empty() ? Progress() : progress.back());
      if (line != last_line) {
        std::fprintf(user, "\r\033[K%s", line.c_str());
        last_line = line;
      }
    } else {
      // Not a terminal: a line every 10 rounds and at the last, each one
      // even when several rounds passed between two polls.
      for (size_t i = progress_seen; i < progress.size(); ++i) {
        const Progress& p = progress[i];
        if (p.round == p.total || p.round % 10 == 0) {
          std::fprintf(user, "%s\n", ProgressLine(options, p).c_str());
        }
      }
    }
    progress_seen = progress.size();
    std::fflush(user);
  }
  if (live) std::fprintf(user, "\n");
  std::fflush(user);
  KillAll(children, pgid);
  for (auto& s : shards) s->Shutdown(absl::Seconds(1));
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (!failure.ok()) {
    if (own_run_dir && !options.keep_run_dir && interrupted) {
      std::filesystem::remove_all(options.run_dir, ec);
      return failure;
    }
    return absl::Status(failure.code(),
                        absl::StrCat(failure.message(), "(logs kept in ",
                                     options.run_dir, ")"));
  }

  std::vector<RankReport> reports;
  for (const Child& c : children) {
    if (!c.started) continue;
    CO2_ASSIGN_OR_RETURN(
        RankReport r, ReadRankReport(RankReportPath(options.run_dir, c.worker,
                                                    c.local_rank)));
    reports.push_back(std::move(r));
  }
  CO2_ASSIGN_OR_RETURN(MergedSummary summary, Summarize(reports));
  RunInfo info;
  info.settings = Settings(options);
  info.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  info.aggregators = options.aggregators;
  if (!options.report.empty()) {
    CO2_RETURN_IF_ERROR(WriteFileAtomically(
        options.report, MergedReportJson(info, reports, summary)));
  }

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
  std::printf("  parameters identical on every rank after every boundary: %s\n",
              summary.params_identical ? "yes" : summary.first_difference.c_str());
  if (!options.report.empty())
    std::printf("  report: %s\n", options.report.c_str());
  std::fflush(stdout);
  if (!summary.params_identical) {
    return absl::DataLossError(absl::StrCat(
        "the ranks do not hold the same model: ", summary.first_difference,
        " (logs kept in ", options.run_dir, ")"));
  }
  if (own_run_dir && !options.keep_run_dir)
    std::filesystem::remove_all(options.run_dir, ec);
  return absl::OkStatus();
}

}  // namespace co2::client
