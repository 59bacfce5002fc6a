// Minimal line logging to stderr (Abseil 20220623 has no absl/log):
//   CO2_LOG(INFO) << "round " << r << " closed";
// Each statement writes one whole line, prefixed with the severity, the UTC
// time and the source location; lines from different threads never interleave.
#ifndef CO2_COMMON_LOGGING_H_
#define CO2_COMMON_LOGGING_H_

#include <sstream>

namespace co2::common {

enum class LogSeverity { kInfo, kWarning, kError };

class LogLine {
 public:
  LogLine(LogSeverity severity, const char* file, int line);
  ~LogLine();  // writes the line
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace co2::common

#define CO2_LOG_SEVERITY_INFO ::co2::common::LogSeverity::kInfo
#define CO2_LOG_SEVERITY_WARNING ::co2::common::LogSeverity::kWarning
#define CO2_LOG_SEVERITY_ERROR ::co2::common::LogSeverity::kError
#define CO2_LOG(severity) \
  ::co2::common::LogLine(CO2_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

#endif  // CO2_COMMON_LOGGING_H_
