// Injectable time source. Production code takes a `Clock*` (borrowed; it must
// outlive its users) so tests can drive deadlines with FakeClock and no sleeps.
// Both implementations are safe to call from any thread.
#ifndef CO2_COMMON_CLOCK_H_
#define CO2_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace co2::common {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock; never destroyed.
  static Clock* Real();
};

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace co2::common

#endif  // CO2_COMMON_CLOCK_H_
