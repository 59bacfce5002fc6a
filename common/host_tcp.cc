#include "common/host_tcp.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace co2::common {
namespace {

absl::StatusOr<std::string> ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  return line;
}

// The third field of tcp_rmem / tcp_wmem ("min default max").
absl::StatusOr<int64_t> BufferMax(const std::string& path) {
  absl::StatusOr<std::string> line = ReadLine(path);
  if (!line.ok()) return line.status();
  std::istringstream fields(*line);
  int64_t min = 0, initial = 0, max = 0;
  if (!(fields >> min >> initial >> max) || max <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is '", *line, "': expected three sizes, min default max"));
  }
  return max;
}

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.3g MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string Mbit(double bits_per_second) {
  return absl::StrFormat("%.0f Mbit/s", bits_per_second / 1e6);
}

prometheus::MetricFamily Gauge(const char* name, const char* help) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  return family;
}

void AddValue(prometheus::MetricFamily& family, double value,
              std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

absl::StatusOr<HostTcpSettings> ReadHostTcpSettings(const std::string& dir) {
  HostTcpSettings settings;
  absl::StatusOr<int64_t> send = BufferMax(dir + "/tcp_wmem");
  if (!send.ok()) return send.status();
  absl::StatusOr<int64_t> receive = BufferMax(dir + "/tcp_rmem");
  if (!receive.ok()) return receive.status();
  settings.send_buffer_max = *send;
  settings.receive_buffer_max = *receive;
  absl::StatusOr<std::string> idle =
      ReadLine(dir + "/tcp_slow_start_after_idle");
  if (!idle.ok()) return idle.status();
  if (*idle != "0" && *idle != "1") {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/tcp_slow_start_after_idle is '", *idle, "': expected 0 or 1"));
  }
  settings.slow_start_after_idle = *idle == "1";
  absl::StatusOr<std::string> congestion =
      ReadLine(dir + "/tcp_congestion_control");
  if (!congestion.ok()) return congestion.status();
  settings.congestion_control = *congestion;
  return settings;
}

double StreamCapBitsPerSecond(const HostTcpSettings& settings,
                              absl::Duration rtt) {
  if (rtt <= absl::ZeroDuration()) {
    return std::numeric_limits<double>::infinity();
  }
  const int64_t window =
      std::min(settings.send_buffer_max, settings.receive_buffer_max);
  return static_cast<double>(window) * 8 / absl::ToDoubleSeconds(rtt);
}

bool LimitsPath(const HostTcpSettings& settings, const LinkPath& path) {
  if (path.rtt <= absl::ZeroDuration()) return false;
  return settings.slow_start_after_idle ||
         (path.bits_per_second > 0 &&
          StreamCapBitsPerSecond(settings, path.rtt) < path.bits_per_second);
}

std::string DescribeHostTcp(const HostTcpSettings& settings,
                            const LinkPath& path) {
  std::string line = absl::StrCat(
      "host TCP: tcp_wmem max ", Mib(settings.send_buffer_max),
      ", tcp_rmem max ", Mib(settings.receive_buffer_max),
      ", slow start after idle ", settings.slow_start_after_idle ? "on" : "off",
      ", ", settings.congestion_control);
  if (path.rtt <= absl::ZeroDuration()) {
    return absl::StrCat(line, " (no --link_rtt: the path is not checked)");
  }
  const double cap = StreamCapBitsPerSecond(settings, path.rtt);
  absl::StrAppend(&line, ": one stream moves at most ", Mbit(cap), " over the ",
                  absl::FormatDuration(path.rtt), " path");
  std::vector<std::string> fixes;
  if (path.bits_per_second > 0 && cap < path.bits_per_second) {
    const double bdp_bytes =
        path.bits_per_second / 8 * absl::ToDoubleSeconds(path.rtt);
    absl::StrAppend(&line, ", below its ", Mbit(path.bits_per_second));
    fixes.push_back(absl::StrCat(
        "net.ipv4.tcp_wmem and tcp_rmem maxima >= ",
        Mib(static_cast<int64_t>(std::ceil(2 * bdp_bytes)))));
  }
  if (settings.slow_start_after_idle) {
    absl::StrAppend(&line,
                    "; every round's first burst restarts slow start");
    fixes.push_back("net.ipv4.tcp_slow_start_after_idle=0");
  }
  if (!fixes.empty()) {
    absl::StrAppend(&line, ". Set ", absl::StrJoin(fixes, ", "),
                    " (docs/operations.md, Long links)");
  }
  return line;
}

HostTcpCheck CheckHostTcp(const LinkPath& path) {
  const absl::StatusOr<HostTcpSettings> settings = ReadHostTcpSettings();
  if (!settings.ok()) {
    return {true, absl::StrCat("host TCP settings not read: ",
                               settings.status().ToString())};
  }
  return {LimitsPath(*settings, path), DescribeHostTcp(*settings, path)};
}

absl::Status CheckLinkPath(const LinkPath& path) {
  if (!(path.bits_per_second >= 0) || std::isinf(path.bits_per_second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--link_mbit is ", path.bits_per_second / 1e6,
        ": must be 0 (not said) or the path's rate"));
  }
  if (path.rtt < absl::ZeroDuration() || path.rtt == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link_rtt is ", absl::FormatDuration(path.rtt),
                     ": must be 0 (not said) or the path's round trip"));
  }
  return absl::OkStatus();
}

absl::Status CheckLinkPathAndLogHostTcp(const LinkPath& path) {
  CO2_RETURN_IF_ERROR(CheckLinkPath(path));
  const HostTcpCheck check = CheckHostTcp(path);
  if (check.limits) {
    CO2_LOG(WARNING) << check.line;
  } else {
    CO2_LOG(INFO) << check.line;
  }
  return absl::OkStatus();
}

HostTcpCollector::HostTcpCollector(LinkPath path, std::string dir)
    : path_(path), dir_(std::move(dir)) {}

std::vector<prometheus::MetricFamily> HostTcpCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  absl::StatusOr<HostTcpSettings> settings = ReadHostTcpSettings(dir_);
  if (!settings.ok()) return out;
  prometheus::MetricFamily buffers = Gauge(
      "co2_tcp_buffer_max_bytes",
      "The host's TCP socket buffer maximum (net.ipv4.tcp_wmem, tcp_rmem).");
  AddValue(buffers, static_cast<double>(settings->send_buffer_max),
           {{"direction", "send"}});
  AddValue(buffers, static_cast<double>(settings->receive_buffer_max),
           {{"direction", "receive"}});
  out.push_back(std::move(buffers));
  prometheus::MetricFamily idle =
      Gauge("co2_tcp_slow_start_after_idle",
            "1 when TCP restarts slow start after idle (each round cold).");
  AddValue(idle, settings->slow_start_after_idle ? 1 : 0);
  out.push_back(std::move(idle));
  if (path_.rtt > absl::ZeroDuration()) {
    prometheus::MetricFamily rtt = Gauge(
        "co2_link_path_rtt_seconds", "The configured path's round trip.");
    AddValue(rtt, absl::ToDoubleSeconds(path_.rtt));
    out.push_back(std::move(rtt));
    prometheus::MetricFamily cap =
        Gauge("co2_tcp_stream_cap_bits_per_second",
              "The most one window-limited stream moves over the path.");
    AddValue(cap, StreamCapBitsPerSecond(*settings, path_.rtt));
    out.push_back(std::move(cap));
  }
  if (path_.bits_per_second > 0) {
    prometheus::MetricFamily rate = Gauge(
        "co2_link_path_bits_per_second", "The configured path's rate.");
    AddValue(rate, path_.bits_per_second);
    out.push_back(std::move(rate));
  }
  return out;
}

}  // namespace co2::common
