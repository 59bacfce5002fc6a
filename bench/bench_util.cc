#include "bench/bench_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace co2::bench {

double MonotonicSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

std::optional<Child> Child::Spawn(
    const std::vector<std::string>& argv, const std::string& stderr_path,
    bool stdout_to_null, const std::map<std::string, std::string>& extra_env) {
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return std::nullopt;
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return std::nullopt;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  if (stdout_to_null) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  } else {
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  }
  if (!stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (extra_env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : extra_env) {
    env_strings.push_back(key + "=" + value);
  }
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = -1;
  const int rc =
      posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    close(to_child[1]);
    close(from_child[0]);
    return std::nullopt;
  }
  Child child;
  child.pid_ = pid;
  child.in_ = to_child[1];
  child.out_ = fdopen(from_child[0], "r");
  return child;
}

Child::Child(Child&& other) noexcept { *this = std::move(other); }

Child& Child::operator=(Child&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(out_, other.out_);
  std::swap(in_, other.in_);
  return *this;
}

Child::~Child() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
  if (out_ != nullptr) fclose(out_);
  if (in_ >= 0) close(in_);
}

std::optional<std::string> Child::ReadLine() {
  if (out_ == nullptr) return std::nullopt;
  std::string line;
  int c;
  while ((c = fgetc(out_)) != EOF) {
    if (c == '\n') return line;
    line.push_back(static_cast<char>(c));
  }
  if (line.empty()) return std::nullopt;
  return line;
}

std::string Child::ReadAll() {
  std::string text;
  while (std::optional<std::string> line = ReadLine()) text += *line + "\n";
  return text;
}

std::optional<std::string> Child::ReadUntil(const std::string& prefix) {
  while (std::optional<std::string> line = ReadLine()) {
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
  return std::nullopt;
}

bool Child::WriteLine(const std::string& line) {
  const std::string data = line + "\n";
  return write(in_, data.data(), data.size()) ==
         static_cast<ssize_t>(data.size());
}

void Child::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

int Child::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) *
             1024;  // the kernel reports kB
    }
  }
  return 0;
}

CpuTimes operator-(const CpuTimes& a, const CpuTimes& b) {
  return {a.user_s - b.user_s, a.sys_s - b.sys_s};
}

CpuTimes operator+(const CpuTimes& a, const CpuTimes& b) {
  return {a.user_s + b.user_s, a.sys_s + b.sys_s};
}

CpuTimes SelfCpuTimes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) +
           1e-6 * static_cast<double>(t.tv_usec);
  };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

CpuTimes ProcCpuTimes(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime field 14 and stime field 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  double ticks[2] = {0, 0};
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks[i - 14] = std::strtod(field.c_str(), nullptr);
  }
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {ticks[0] / hz, ticks[1] / hz};
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool WaitForPort(int port, double timeout_s) {
  const double deadline = MonotonicSeconds() + timeout_s;
  while (MonotonicSeconds() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) continue;
        out += c;
    }
  }
  return out + "\"";
}

double JsonNumberAfter(const std::string& json, const std::string& key,
                       size_t from) {
  const size_t at = json.find("\"" + key + "\"", from);
  if (at == std::string::npos) return std::nan("");
  const size_t colon = json.find(':', at);
  if (colon == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + colon + 1, nullptr);
}

std::string MachineJson() {
  std::string model = "unknown";
  std::istringstream cpuinfo(ReadFile("/proc/cpuinfo"));
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const double memory_gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                            static_cast<double>(sysconf(_SC_PAGE_SIZE)) /
                            (1024.0 * 1024 * 1024);
  utsname u{};
  uname(&u);
  std::ostringstream o;
  o << "{\"cpu\": " << JsonString(model) << ", \"cores\": " << cores
    << ", \"memory_gib\": " << std::round(memory_gib * 10) / 10
    << ", \"kernel\": " << JsonString(std::string(u.sysname) + " " + u.release)
#if defined(__clang__)
    << ", \"compiler\": "
    << JsonString(std::string("clang ") + __clang_version__)
#else
    << ", \"compiler\": " << JsonString(std::string("GCC ") + __VERSION__)
#endif
    << ", \"load_average\": "
    << JsonString(ReadFile("/proc/loadavg").substr(0, 14)) << "}";
  return o.str();
}

}  // namespace co2::bench
