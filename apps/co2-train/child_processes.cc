#include "apps/co2-train/child_processes.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace co2::client {
namespace {

// Forks and executes `args` in process group `pgid` (0: a new group led by
// the child), stdout and stderr to `log` (appended to when `append`). The
// child dies with `launcher` and gets `mask` back. Returns the pid, or -1
// with errno set.
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
  if (pid > 0)
    setpgid(pid, pgid);  // also here: no race with the child's own call
  return pid;
}

}  // namespace

size_t CountRunning(const ChildProcesses& processes) {
  return static_cast<size_t>(
      std::count_if(processes.children.begin(), processes.children.end(),
                    [](const Child& child) { return child.running; }));
}

absl::Status SpawnWorker(ChildProcesses& processes, int worker,
                         const std::vector<std::string>& extra, bool append) {
  for (Child& c : processes.children) {
    if (c.worker != worker) continue;
    std::vector<std::string> args = c.args;
    args.insert(args.end(), extra.begin(), extra.end());
    const pid_t pid = Spawn(args, c.log, append, processes.pgid,
                            processes.launcher, processes.mask);
    if (pid < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("fork: ", strerror(errno)));
    }
    if (processes.pgid == 0) processes.pgid = pid;
    c.pid = pid;
    c.running = true;
    c.started = true;
    c.leaving = false;
  }
  return absl::OkStatus();
}

absl::Status RestartWorker(ChildProcesses& processes, int worker) {
  int restarts = 0;
  for (Child& c : processes.children) {
    if (c.worker != worker) continue;
    if (c.running) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.running = false;
    }
    restarts = ++c.restarts;
  }
  return SpawnWorker(processes, worker,
                     {"--rejoin", absl::StrCat("--restart=", restarts)},
                     /*append=*/true);
}

void KillAll(ChildProcesses& processes) {
  if (processes.pgid > 0) kill(-processes.pgid, SIGKILL);
  for (Child& c : processes.children) {
    if (!c.running) continue;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &c.status, 0);
    c.running = false;
  }
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("status ", status);
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from =
      all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::string out;
  for (size_t i = from; i < all.size(); ++i)
    absl::StrAppend(&out, "    ", all[i], "\n");
  return out;
}

}  // namespace co2::client
