// The CO2 outer step (docs/algorithm.md, "Shard", steps 2-6) as pure
// arithmetic on spans of one shard's range: staleness gap penalty, heavy-ball,
// Nesterov or delayed Nesterov outer momentum, outer-momentum clipping and
// the outer update U.
// Reductions (mean |g|, rms(m)) are taken per block of common::kBlockElements
// counted from the start of the spans; shard ranges are block-aligned, so the
// result does not depend on the number of shards. Every common::KernelIsa
// variant gives the same bits. Stateless; any thread.
#ifndef CO2_SERVER_JOB_OUTER_OPTIMIZER_H_
#define CO2_SERVER_JOB_OUTER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace co2::server {

enum class GapPenalty { kNone, kConstant, kGapAware };
enum class ClipMode { kNone, kValue, kAdaptive };
enum class MomentumKind { kHeavyBall, kNesterov, kDelayedNesterov };

// Added to mean |g| in the gap-aware penalty so a zero gap gives Λ = 1.
inline constexpr float kGapEpsilon = 1e-12f;

struct OuterConfig {
  float alpha = 1.0f;  // outer learning rate, > 0
  float beta = 0.0f;   // outer momentum, in [0, 1)
  MomentumKind momentum = MomentumKind::kHeavyBall;
  // N for kDelayedNesterov, >= 1: the momentum steps once every N rounds.
  uint32_t momentum_period = 1;
  GapPenalty penalty = GapPenalty::kGapAware;
  float penalty_lambda = 1.0f;  // Λ for kConstant, >= 1
  ClipMode clip = ClipMode::kAdaptive;
  float clip_value = 3.0f;  // φ for kValue, k for kAdaptive, > 0
};

// INVALID_ARGUMENT naming the field and value when a config is out of range.
absl::Status ValidateOuterConfig(const OuterConfig& config);

struct OuterStepStats {
  double mean_penalty = 1.0;      // mean of Λ over the elements
  // ||m||² after clipping (delayed Nesterov: ||v/N||² of the stepped v at
  // a milestone, of the sum so far between).
  double momentum_norm_sq = 0.0;
  size_t clipped = 0;             // elements of m changed by clipping
  // Chunks whose step a RoundStep refused (CheckStepFits: their mean would
  // have made m, U or A non-finite): their A and m stay as they were and
  // their update is zero (server/job/chunked_outer_step.h). 0 from OuterStep.
  uint32_t refused_chunks = 0;
};

// The outer step of round `round`. All spans have the same length.
//   Λ_j  = 1 | λ | max(1, |gap_j| · r), with r = 1 / (mean_block |gap| +
//          kGapEpsilon) rounded to float once per block
//   m    ← β·m + mean_delta / Λ, then clipped:
//          kValue: clamp(m, −φ, φ); kAdaptive: clamp(m, −k·rms_block(m), +...)
//   update = −α·m (heavy ball) or −α·(β·m + mean_delta/Λ) (Nesterov, with the
//          clipped m).
// Delayed Nesterov (Liu et al. 2024, "Asynchronous Local-SGD Training for
// Language Modeling") steps the momentum once every N = momentum_period
// rounds, at the rounds with (round + 1) mod N = 0, and moves the anchor by
// the plain mean in between; over a period it moves by what one Nesterov
// step on the period's average would. `momentum` holds v, N times the
// momentum plus the period's sum so far:
//   v    ← v + mean_delta / Λ
//   other rounds:  update = −(α/N)·(mean_delta/Λ)
//   milestone:     v clipped (kValue: ±N·φ; kAdaptive: ±k·rms_block(v)),
//                  update = −(α/N)·(β·v + mean_delta/Λ), then v ← β·v.
// With β = 0 (no momentum kept) it is the plain mean at α/N every round.
// `mean_delta` is D_r, `gap` the last decoded update (U_{r+1}); `momentum`
// is updated in place; `update` receives U_{r+2} before encoding. `update`
// may be the same memory as `gap` (a shard keeps one U buffer); no other
// overlap is allowed.
OuterStepStats OuterStep(const OuterConfig& config, uint64_t round,
                         absl::Span<const float> mean_delta,
                         absl::Span<const float> gap,
                         absl::Span<float> momentum, absl::Span<float> update);

// OK if OuterStep(config, round, mean_delta, ...) followed by A += U cannot
// make the momentum, the update or the anchor non-finite, from bounds taken
// in double over the largest magnitudes (Λ >= 1 and clipping only shrink):
//   |m'| <= max|m| + max|D|,  |β·m' + D/Λ| <= |m'| + max|D|,
//   |U| <= α'·(|m'| + max|D|),  |A + U| <= max|A| + |U|
// (α' = α, or α/N with delayed Nesterov), each below FLT_MAX · (1 − 2^-7),
// a margin for fp32's rounding and the downlink codec's (U counts 1 + 2^-7
// times in A's bound). Else OUT_OF_RANGE naming the bound and its value.
// `momentum` is empty with β = 0; all spans are one range of the shard.
// Conservative by the triangle inequality over whole chunks: it can refuse a
// step whose largest values are within a factor of about 2 of fp32's
// largest value.
absl::Status CheckStepFits(const OuterConfig& config,
                           absl::Span<const float> mean_delta,
                           absl::Span<const float> momentum,
                           absl::Span<const float> anchor);

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_OUTER_OPTIMIZER_H_
