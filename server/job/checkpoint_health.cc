#include "server/job/checkpoint_health.h"

#include "absl/strings/str_cat.h"
#include "server/storage/write_failure.h"

namespace co2::server {
namespace {

// Durations in the lines, to the second: they count retries a second apart.
std::string ToTheSecond(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

}  // namespace

std::optional<std::string> CheckpointHealth::Failed(absl::string_view what,
                                                    const absl::Status& error,
                                                    absl::Time now) {
  held_ = absl::StrCat("checkpoint failing: ", WriteFailureText(error));
  ++failures_;
  ++since_last_line_;
  if (!failing_since_.has_value()) {
    failing_since_ = now;
  } else if (now - last_line_ < log_every_) {
    return std::nullopt;
  }
  std::string line =
      absl::StrCat(what, " failed, update held: ",
                   error.ToString(absl::StatusToStringMode::kWithNoExtraData));
  if (failures_ > 1) {
    absl::StrAppend(&line, " (", since_last_line_, " failed write(s) since ",
                    ToTheSecond(now - last_line_), " ago; failing for ",
                    ToTheSecond(now - *failing_since_), ")");
  }
  last_line_ = now;
  since_last_line_ = 0;
  return line;
}

std::optional<std::string> CheckpointHealth::Succeeded(absl::Time now) {
  if (!failing_since_.has_value()) return std::nullopt;
  std::string line = absl::StrCat(
      "checkpoint writes succeed again after ", failures_,
      " failed write(s) over ", ToTheSecond(now - *failing_since_),
      "; held updates go out");
  failing_since_.reset();
  last_line_ = absl::InfinitePast();
  failures_ = 0;
  since_last_line_ = 0;
  held_.clear();
  return line;
}

}  // namespace co2::server
