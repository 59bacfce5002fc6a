// Helpers shared by the benchmark drivers in bench/: child processes with
// line-based pipes (the drivers start shards, clients, iperf3 and Gloo ranks
// and step them through barriers), /proc/<pid>/status memory, a monotonic
// clock that agrees across processes, medians, a description of the machine
// and a little JSON writing. Benchmarks only; one thread per object.
#ifndef CO2_BENCH_BENCH_UTIL_H_
#define CO2_BENCH_BENCH_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace co2::bench {

// CLOCK_MONOTONIC in seconds: comparable between processes on one machine.
double MonotonicSeconds();

// A child process. stdin and stdout are pipes (unless redirected); stderr
// goes to `stderr_path` (a file, so that a chatty child never blocks on a
// full pipe) or is inherited when empty.
class Child {
 public:
  // argv[0] is the program; searched on PATH when it has no '/'.
  static std::optional<Child> Spawn(
      const std::vector<std::string>& argv, const std::string& stderr_path = "",
      bool stdout_to_null = false,
      const std::map<std::string, std::string>& extra_env = {});
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();  // kills (SIGKILL) and reaps a child still running

  pid_t pid() const { return pid_; }
  // One line from the child's stdout without the newline; nullopt at EOF.
  std::optional<std::string> ReadLine();
  // The rest of the child's stdout, up to EOF.
  std::string ReadAll();
  // Reads lines until one starts with `prefix`; returns the rest of it.
  std::optional<std::string> ReadUntil(const std::string& prefix);
  // Writes `line` and a newline to the child's stdin.
  bool WriteLine(const std::string& line);
  void Signal(int signal);
  // Waits for the child to exit; its exit status (128 + signal if killed).
  int Wait();

 private:
  Child() = default;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;  // the child's stdout
  int in_ = -1;          // the child's stdin
};

// Fields of /proc/<pid>/status in bytes (VmHWM, VmRSS, ...); 0 if missing.
uint64_t ProcStatusBytes(pid_t pid, const std::string& field);

// CPU time a process has used, in seconds, all its threads together.
struct CpuTimes {
  double user_s = 0;
  double sys_s = 0;
};
CpuTimes operator-(const CpuTimes& a, const CpuTimes& b);
CpuTimes operator+(const CpuTimes& a, const CpuTimes& b);
// This process's (getrusage).
CpuTimes SelfCpuTimes();
// Another process's, from /proc/<pid>/stat (in clock ticks: 10 ms here);
// zeros if it cannot be read.
CpuTimes ProcCpuTimes(pid_t pid);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();
// Waits up to `timeout_s` for 127.0.0.1:port to accept a connection.
bool WaitForPort(int port, double timeout_s);

double Median(std::vector<double> v);

// Model name, cores, memory, kernel and compiler, as a JSON object.
std::string MachineJson();

// The text of a file; empty if it cannot be read.
std::string ReadFile(const std::string& path);

// JSON string literal of s.
std::string JsonString(const std::string& s);

// The number after "key": in a flat JSON text, searching from `from`; NaN if
// absent. Enough for iperf3's --json report without a JSON library.
double JsonNumberAfter(const std::string& json, const std::string& key,
                       size_t from = 0);

}  // namespace co2::bench

#endif  // CO2_BENCH_BENCH_UTIL_H_
