// HostTcp: the host's TCP settings that bound one stream over a long path
// (per network namespace, from /proc/sys/net/ipv4), and what they allow. A
// stream whose window is its socket buffer moves at most that buffer per
// round trip: with Linux's default maxima (tcp_wmem 4 MiB) about 335 Mbit/s
// at 100 ms, whatever the link. With slow start after idle on, the first
// burst after a round's compute starts from a cold window again.
//
// co2-aggregator and co2-train read the settings at start and log them in
// one line, a warning when they cap a stream below the path the job is
// configured for (--link_mbit, --link_rtt); MetricsServer exports them
// (HostTcpCollector). docs/operations.md, "Long links", says what to set.
// Thread-safe: everything here reads files or const members.
#ifndef CO2_COMMON_HOST_TCP_H_
#define CO2_COMMON_HOST_TCP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace co2::common {

struct HostTcpSettings {
  int64_t send_buffer_max = 0;     // bytes, net.ipv4.tcp_wmem's maximum
  int64_t receive_buffer_max = 0;  // bytes, net.ipv4.tcp_rmem's maximum
  bool slow_start_after_idle = true;  // net.ipv4.tcp_slow_start_after_idle
  std::string congestion_control;     // net.ipv4.tcp_congestion_control
};

// The path a job's streams cross, as configured; zero: not said.
struct LinkPath {
  double bits_per_second = 0;
  absl::Duration rtt = absl::ZeroDuration();
};

// Reads the settings under `dir` (a directory laid out as /proc/sys/net/ipv4).
// NOT_FOUND or INVALID_ARGUMENT naming the file that is missing or malformed.
absl::StatusOr<HostTcpSettings> ReadHostTcpSettings(
    const std::string& dir = "/proc/sys/net/ipv4");

// The most one window-limited stream moves over `rtt`: the smaller buffer
// maximum per round trip, in bits per second (infinite for a zero rtt).
double StreamCapBitsPerSecond(const HostTcpSettings& settings,
                              absl::Duration rtt);

// True when the settings cap one stream below the path's rate, or restart
// slow start after idle on a path with a round trip.
bool LimitsPath(const HostTcpSettings& settings, const LinkPath& path);

// The start-up line: the settings, what one stream may move over the path,
// and, where they limit it, what to set.
std::string DescribeHostTcp(const HostTcpSettings& settings,
                            const LinkPath& path);

// What this host's settings mean for `path`: whether they limit it (also
// when they cannot be read) and the line that says so (DescribeHostTcp's,
// or why the settings were not read).
struct HostTcpCheck {
  bool limits = false;
  std::string line;
};
HostTcpCheck CheckHostTcp(const LinkPath& path);
// INVALID_ARGUMENT for a negative or non-finite rate or round trip, naming
// the flag (--link_mbit, --link_rtt).
absl::Status CheckLinkPath(const LinkPath& path);
// CheckLinkPath, then reads the settings and logs CheckHostTcp's line:
// WARNING where they limit the path (or cannot be read), INFO otherwise.
absl::Status CheckLinkPathAndLogHostTcp(const LinkPath& path);

// Exports, read anew at each scrape:
//   co2_tcp_buffer_max_bytes{direction="send"|"receive"}  gauge
//   co2_tcp_slow_start_after_idle                          gauge, 0 or 1
//   co2_link_path_bits_per_second                          the configured rate
//   co2_link_path_rtt_seconds                              the configured RTT
//   co2_tcp_stream_cap_bits_per_second                     over that RTT
// (the last three only where the path is configured). Nothing when the
// settings cannot be read.
class HostTcpCollector : public prometheus::Collectable {
 public:
  explicit HostTcpCollector(LinkPath path, std::string dir = "/proc/sys/net/ipv4");
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const LinkPath path_;
  const std::string dir_;
};

}  // namespace co2::common

#endif  // CO2_COMMON_HOST_TCP_H_
