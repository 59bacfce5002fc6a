#include "server/job/round_deadline.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace co2::server {

absl::Status ValidateRoundDeadlineOptions(const RoundDeadlineOptions& options) {
  if (!(options.factor >= 1.0) || !std::isfinite(options.factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round deadline factor must be >= 1, got ", options.factor));
  }
  if (!(options.quantile > 0.0 && options.quantile <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round deadline quantile must be in (0, 1], got ", options.quantile));
  }
  if (options.min_samples < 1 || options.min_samples > options.window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round deadline min_samples must be in [1, window = ", options.window,
        "], got ", options.min_samples));
  }
  if (options.floor <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("round deadline floor must be > 0, got ",
                     absl::FormatDuration(options.floor)));
  }
  return absl::OkStatus();
}

RoundDeadline::RoundDeadline(const RoundDeadlineOptions& options,
                             absl::Duration round_timeout)
    : options_(options),
      round_timeout_(round_timeout),
      current_(round_timeout) {}

void RoundDeadline::Observe(absl::Duration took) {
  if (!options_.adaptive) return;
  recent_.push_back(took);
  while (recent_.size() > options_.window) recent_.pop_front();
  if (recent_.size() < options_.min_samples) return;
  std::vector<absl::Duration> sorted(recent_.begin(), recent_.end());
  std::sort(sorted.begin(), sorted.end());
  // The nearest-rank quantile: the smallest time at least `quantile` of the
  // rounds took no longer than.
  const size_t rank = static_cast<size_t>(
      std::ceil(options_.quantile * static_cast<double>(sorted.size())));
  const absl::Duration q = sorted[std::max<size_t>(rank, 1) - 1];
  current_ =
      std::clamp(q * options_.factor, std::min(options_.floor, round_timeout_),
                 round_timeout_);
}

}  // namespace co2::server
