// When delayed Nesterov momentum (MOMENTUM_DELAYED_NESTEROV,
// docs/algorithm.md) steps: the one rule the shards' outer step and the
// workers' eager updates both follow. Header only; any thread.
#ifndef CO2_COMMON_MOMENTUM_SCHEDULE_H_
#define CO2_COMMON_MOMENTUM_SCHEDULE_H_

#include <cstdint>

namespace co2::common {

// True for the rounds whose step moves the momentum: (round + 1) mod N = 0,
// with N = JobConfig.momentum_period >= 1.
inline bool StepsDelayedMomentum(uint32_t period, uint64_t round) {
  return (round + 1) % period == 0;
}

}  // namespace co2::common

#endif  // CO2_COMMON_MOMENTUM_SCHEDULE_H_
