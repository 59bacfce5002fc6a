// RoundDeadline: how long a round waits, after its first contribution, for
// the workers still missing before it closes with the quorum it has.
//
// Fixed, it is the job's round_timeout. Adaptive, it is `factor` × the
// `quantile` of how long the last `window` rounds that closed complete took
// from their first contribution to their last, clamped to [floor,
// round_timeout]: where rounds complete within a fraction of a second, a
// dead worker then costs seconds instead of the whole timeout, and a worker
// that is always slow is inside the observed times, so it is waited for.
// Until `min_samples` rounds were observed it is round_timeout.
//
// A value; not thread-safe (RoundState's owner serialises calls).
#ifndef CO2_SERVER_JOB_ROUND_DEADLINE_H_
#define CO2_SERVER_JOB_ROUND_DEADLINE_H_

#include <cstddef>
#include <deque>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace co2::server {

struct RoundDeadlineOptions {
  bool adaptive = false;  // false: always the job's round_timeout
  double factor = 4.0;    // × the quantile of recent completion times
  double quantile = 0.95;
  size_t window = 32;                       // rounds remembered
  size_t min_samples = 8;                   // rounds observed before adapting
  absl::Duration floor = absl::Seconds(5);  // never shorter
};

// INVALID_ARGUMENT naming the field: factor >= 1, quantile in (0, 1],
// 1 <= min_samples <= window, floor > 0.
absl::Status ValidateRoundDeadlineOptions(const RoundDeadlineOptions& options);

class RoundDeadline {
 public:
  // `round_timeout`: the job's configured deadline, the ceiling.
  RoundDeadline(const RoundDeadlineOptions& options,
                absl::Duration round_timeout);

  // A round closed complete, `took` after its first contribution.
  void Observe(absl::Duration took);
  // The deadline for the next round, after its first contribution.
  absl::Duration Current() const { return current_; }

 private:
  RoundDeadlineOptions options_;
  absl::Duration round_timeout_;
  std::deque<absl::Duration> recent_;  // oldest first, at most window
  absl::Duration current_;             // from recent_, at each Observe
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_ROUND_DEADLINE_H_
