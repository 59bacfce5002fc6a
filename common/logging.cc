#include "common/logging.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace co2::common {

LogLine::LogLine(LogSeverity severity, const char* file, int line) {
  static constexpr char kLetters[] = {'I', 'W', 'E'};
  const char* base = std::strrchr(file, '/');
  stream_ << kLetters[static_cast<int>(severity)]
          << absl::FormatTime("%m%d %H:%M:%E3S ", absl::Now(),
                              absl::UTCTimeZone())
          << (base ? base + 1 : file) << ":" << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write(2) per line keeps concurrent lines whole.
  (void)!::write(STDERR_FILENO, text.data(), text.size());
}

}  // namespace co2::common
