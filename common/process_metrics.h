// ProcessCollector: the standard process_* metrics of the calling process
// (Prometheus' client conventions), read from /proc at each scrape:
//
//   process_cpu_seconds_total       counter  user + system CPU time
//   process_resident_memory_bytes   gauge
//   process_virtual_memory_bytes    gauge
//   process_open_fds                gauge
//   process_max_fds                 gauge    the soft RLIMIT_NOFILE
//   process_start_time_seconds      gauge    Unix time the process started
//
// and co2_build_info{program, version, protocol_version, codecs} = 1, so a
// fresh process's /metrics is never empty and a dashboard can tell what runs.
// Thread-safe: Collect reads only /proc and const members.
#ifndef CO2_COMMON_PROCESS_METRICS_H_
#define CO2_COMMON_PROCESS_METRICS_H_

#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace co2::common {

class ProcessCollector : public prometheus::Collectable {
 public:
  // `program`: the binary's name, the `program` label of co2_build_info.
  explicit ProcessCollector(std::string program);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::string program_;
};

}  // namespace co2::common

#endif  // CO2_COMMON_PROCESS_METRICS_H_
