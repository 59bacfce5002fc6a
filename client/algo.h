// The training algorithms co2 runs (docs/algorithm.md) and what each means
// for a job's settings. Torch-free; pure functions, any thread.
//   co2       τ inner steps, then push Δ without waiting for its average
//             (staleness 1).
//   localsgd  τ inner steps, then a blocking plain average (staleness 0,
//             α = 1, β = 0).
//   slowmo    as localsgd, with outer momentum (β > 0) on the aggregator.
//   diloco    as slowmo with Nesterov outer momentum and DiLoCo's published
//             defaults α = 0.7, β = 0.9 (Douillard et al. 2023), as torchft
//             and OpenDiLoCo ship it.
//   ddp       gradients all-reduced every step; no aggregator.
#ifndef CO2_CLIENT_ALGO_H_
#define CO2_CLIENT_ALGO_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "co2/v1/aggregator.pb.h"

namespace co2::client {

enum class Algo { kCo2, kDdp, kLocalSgd, kSlowMo, kDiLoCo };

// "co2" | "ddp" | "localsgd" | "slowmo" | "diloco"; INVALID_ARGUMENT
// otherwise.
absl::StatusOr<Algo> ParseAlgo(absl::string_view name);
absl::string_view AlgoName(Algo algo);
// The JobConfig.max_staleness an algorithm runs with (1 for co2, else 0).
uint32_t StalenessOf(Algo algo);
// Sets what `algo` fixes in a job's config: max_staleness; for localsgd a
// plain average (α = 1, β = 0); for diloco Nesterov momentum; for the
// blocking algorithms no gap penalty and no clipping.
void ApplyAlgo(Algo algo, v1::JobConfig& config);

// The outer learning rate and momentum an algorithm runs with where the user
// sets neither: diloco's α = 0.7, β = 0.9; every other algorithm the
// JobConfig defaults, α = 1, β = 0 (for co2 with carried progress: the
// plain average, as Local-SGD's; docs/results/arrival.md, "Applying updates
// when they arrive").
struct OuterDefaults {
  float alpha;
  float beta;
};
OuterDefaults OuterDefaultsOf(Algo algo);

// When a co2 worker applies the update a round owes (AnchorExchange):
//   boundary  at the round's boundary, a whole round after its Δ was sent;
//   arrival   between inner steps, as soon as every shard has sent it
//             (AnchorExchange::ApplyArrived), else at the boundary.
enum class ApplyAt { kBoundary, kArrival };

// "boundary" | "arrival"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ApplyAt> ParseApplyAt(absl::string_view name);
absl::string_view ApplyAtName(ApplyAt apply);
// OK unless `apply` is arrival and `algo` is not co2 (only co2's update
// arrives while the next round computes) or the job is `deterministic`
// (the step an update is applied at depends on when it arrives):
// INVALID_ARGUMENT naming why.
absl::Status CheckApplyAt(Algo algo, ApplyAt apply, bool deterministic);
// Where the user picks none: arrival for co2 unless the job is
// deterministic, else boundary.
ApplyAt DefaultApplyAt(Algo algo, bool deterministic);
// The inner step of a round by which a worker applying on arrival applies
// the owed update at the latest, waiting for it there
// (Co2OptimizerOptions::apply_by_step): 0 (the boundary only) or 1 .. tau − 1,
// and only with arrival; otherwise INVALID_ARGUMENT whose message, to follow
// the setting's name, says what is wrong with the value.
absl::Status CheckApplyBy(ApplyAt apply, int apply_by_step, int tau);

// Whether a worker carries its own progress across the rounds its update is
// owed (AnchorExchangeOptions::carry_progress) where the user does not say:
// for co2 without eager updates, which take the start point's place.
bool DefaultCarryProgress(Algo algo, bool eager);

// The momentum period N of delayed Nesterov momentum where the user sets
// none (JobConfig.momentum_period).
inline constexpr uint32_t kDefaultMomentumPeriod = 4;

}  // namespace co2::client

#endif  // CO2_CLIENT_ALGO_H_
