// WaitFor: polls a condition that another thread (a shard's poller, a
// stream's reader) makes true, with a deadline. Header only.
#ifndef CO2_TESTS_WAIT_FOR_H_
#define CO2_TESTS_WAIT_FOR_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace co2::testing {

// Polls `done` every 5 ms for up to `timeout`; false if it never held.
inline bool WaitFor(const std::function<bool()>& done,
                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

}  // namespace co2::testing

#endif  // CO2_TESTS_WAIT_FOR_H_
