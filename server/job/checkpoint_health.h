// CheckpointHealth: whether a shard's durable writes for one job (its
// checkpoints and round journal) are failing, and what to tell about it.
// A failing disk is retried every JobShardOptions::checkpoint_retry, so
// logging every failure would flood the log; this unit says which failures
// are logged: the first after a success, then at most one every `log_every`
// with the count since the last line, and one line when a write succeeds
// again. It also holds the reason a waiting worker is told (the
// HeartbeatResponse's update_held) while writes fail.
//
// Not thread-safe: a unit under the shard's mutex. Time comes from the
// caller (the shard's Clock).
#ifndef CO2_SERVER_JOB_CHECKPOINT_HEALTH_H_
#define CO2_SERVER_JOB_CHECKPOINT_HEALTH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace co2::server {

class CheckpointHealth {
 public:
  // `log_every`: the least time between two lines about failing writes.
  explicit CheckpointHealth(absl::Duration log_every) : log_every_(log_every) {}

  // The durable write `what` ("checkpoint of round 3") failed at `now` with
  // `error`. Returns the line to log as an ERROR, or nullopt: a line for
  // the first failure since writes last succeeded, then for the first
  // failure at least log_every after the last line, counting the failures
  // since that line.
  std::optional<std::string> Failed(absl::string_view what,
                                    const absl::Status& error, absl::Time now);
  // A durable write succeeded at `now`. Returns the line to log (INFO) if
  // writes were failing, naming how many failed and for how long; nullopt
  // otherwise.
  std::optional<std::string> Succeeded(absl::Time now);

  bool failing() const { return failing_since_.has_value(); }
  // While writes fail, "checkpoint failing: " and the last failure's errno
  // text ("No space left on device", write_failure.h); empty otherwise.
  const std::string& held() const { return held_; }

 private:
  const absl::Duration log_every_;
  std::optional<absl::Time> failing_since_;
  absl::Time last_line_ = absl::InfinitePast();
  uint64_t failures_ = 0;          // since writes last succeeded
  uint64_t since_last_line_ = 0;   // failures not yet in a line
  std::string held_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CHECKPOINT_HEALTH_H_
