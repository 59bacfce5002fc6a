// RefusedCalls: the calls a shard refuses for their credentials (a client
// certificate or bearer token it does not accept, or a token for another
// job): each is counted through the ShardObserver and logged with the peer's
// address, at most one line per `interval` so that a client retrying with
// wrong credentials cannot flood the log (the next line says how many were
// left out).
//
// Thread-safe.
#ifndef CO2_SERVER_SERVICE_REFUSED_CALLS_H_
#define CO2_SERVER_SERVICE_REFUSED_CALLS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/job/shard_observer.h"

namespace co2::server {

class RefusedCalls {
 public:
  // `observer` (nullable) and `clock` are borrowed.
  RefusedCalls(uint32_t shard_index, ShardObserver* observer,
               common::Clock* clock,
               absl::Duration interval = absl::Seconds(10));

  // Returns `status`; when it is UNAUTHENTICATED or PERMISSION_DENIED, first
  // counts and (rate-limited) logs it as a call from `peer`.
  absl::Status Check(absl::Status status, absl::string_view peer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Check's note of a refusal: the line it logged, if it logged one.
  std::optional<std::string> Note(const absl::Status& refusal,
                                  absl::string_view peer)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint32_t shard_index_;
  ShardObserver* const observer_;
  common::Clock* const clock_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time last_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t left_out_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_REFUSED_CALLS_H_
