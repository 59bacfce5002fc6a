#include "bench/linkem/delay_line.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace co2::bench {

absl::StatusOr<DelayLine> DelayLine::Create(const DelayLineOptions& options) {
  if (options.delay_ns < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delay is ", options.delay_ns, " ns: must not be negative"));
  }
  if (!(options.loss >= 0.0 && options.loss < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss is ", options.loss, ": must be in [0, 1)"));
  }
  return DelayLine(options);
}

DelayLine::DelayLine(const DelayLineOptions& options)
    : options_(options), random_(options.seed), drop_(options.loss) {}

bool DelayLine::Arrive(uint32_t id, int64_t now_ns) {
  ++stats_.arrived;
  if (options_.loss > 0.0 && drop_(random_)) {
    ++stats_.dropped;
    return false;
  }
  held_.push_back({id, now_ns + options_.delay_ns});
  stats_.max_held = std::max<uint64_t>(stats_.max_held, held_.size());
  return true;
}

std::optional<uint32_t> DelayLine::ReleaseDue(int64_t now_ns) {
  std::optional<uint32_t> last;
  while (!held_.empty() && held_.front().due_ns <= now_ns) {
    last = held_.front().id;
    held_.pop_front();
    ++stats_.released;
  }
  return last;
}

std::optional<int64_t> DelayLine::NextDue() const {
  if (held_.empty()) return std::nullopt;
  return held_.front().due_ns;
}

}  // namespace co2::bench
