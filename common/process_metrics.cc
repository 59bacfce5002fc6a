#include "common/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/codec.h"
#include "common/job_config.h"

namespace co2::common {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

// Fields of /proc/self/stat after the command name (which may hold spaces):
// index 0 is field 3, "state".
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> fields;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

// The system's boot time (Unix seconds), from /proc/stat's btime.
double BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double btime = 0;
      in >> btime;
      return btime;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

ProcessCollector::ProcessCollector(std::string program)
    : program_(std::move(program)) {}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::vector<std::string> stat = StatFields();
  // Fields 14, 15 (utime, stime, ticks), 22 (starttime, ticks after boot),
  // 23 (vsize, bytes), 24 (rss, pages), less 3 for the offset above.
  if (stat.size() > 21) {
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    out.push_back(Family("process_cpu_seconds_total",
                         "Total user and system CPU time spent in seconds.",
                         MetricType::Counter,
                         (std::stod(stat[11]) + std::stod(stat[12])) / ticks));
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since unix epoch in "
                         "seconds.",
                         MetricType::Gauge,
                         BootTime() + std::stod(stat[19]) / ticks));
    out.push_back(Family("process_virtual_memory_bytes",
                         "Virtual memory size in bytes.", MetricType::Gauge,
                         std::stod(stat[20])));
    out.push_back(Family("process_resident_memory_bytes",
                         "Resident memory size in bytes.", MetricType::Gauge,
                         std::stod(stat[21]) * page));
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  out.push_back(Family("process_open_fds", "Number of open file descriptors.",
                       MetricType::Gauge, fds));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(
        Family("process_max_fds", "Maximum number of open file descriptors.",
               MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  prometheus::MetricFamily info =
      Family("co2_build_info",
             "1, labelled with the program, its version, the wire protocol "
             "version and the codecs it speaks.",
             MetricType::Gauge, 1);
  std::vector<std::string> codecs;
  for (Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    codecs.emplace_back(CodecName(c));
  }
  info.metric[0].label = {
      {"program", program_},
      {"version", CO2_VERSION},
      {"protocol_version", std::to_string(kProtocolVersion)},
      {"codecs", absl::StrJoin(codecs, ",")}};
  out.push_back(std::move(info));
  return out;
}

}  // namespace co2::common
