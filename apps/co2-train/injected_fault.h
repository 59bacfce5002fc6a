// The fault suite's testing seam (tests/fault_training_test.sh): a parsed
// TrainerOptions::inject_fault, which makes one worker's first process fail
// at one exact point, and the way it dies. The points are checked where
// they are (trainer.cc). Torch-free; any thread.
#ifndef CO2_APPS_CO2_TRAIN_INJECTED_FAULT_H_
#define CO2_APPS_CO2_TRAIN_INJECTED_FAULT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace co2::client {

// A parsed TrainerOptions::inject_fault.
struct InjectedFault {
  enum class Kind {
    kNone,
    kKillInRound,
    kKillBeforeFinish,
    kKillAfterFinish,
    kFlipFinalBit,
    kScaleDelta
  };
  Kind kind = Kind::kNone;
  int worker = -1;
  int64_t round = 0;        // kKillInRound; kScaleDelta: the first round
  uint64_t last_round = 0;  // kScaleDelta (UINT64_MAX: for good)
};
// What kScaleDelta multiplies Δ by.
inline constexpr float kInjectedDeltaScale = 1e6f;
absl::StatusOr<InjectedFault> ParseInjectedFault(absl::string_view spec);

// Dies as kill -9 would, with a log line saying where.
[[noreturn]] void KillSelf(const std::string& where);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_INJECTED_FAULT_H_
