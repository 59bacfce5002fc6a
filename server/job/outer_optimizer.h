// The CO2 outer step (docs/algorithm.md, "Shard", steps 2-6) as pure
// arithmetic on spans of one shard's range: staleness gap penalty, heavy-ball
// or Nesterov outer momentum, outer-momentum clipping and the outer update U.
// Reductions (mean |g|, rms(m)) are taken per block of common::kBlockElements
// counted from the start of the spans; shard ranges are block-aligned, so the
// result does not depend on the number of shards. Every common::KernelIsa
// variant gives the same bits. Stateless; any thread.
#ifndef CO2_SERVER_OUTER_OPTIMIZER_H_
#define CO2_SERVER_OUTER_OPTIMIZER_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace co2::server {

enum class GapPenalty { kNone, kConstant, kGapAware };
enum class ClipMode { kNone, kValue, kAdaptive };
enum class MomentumKind { kHeavyBall, kNesterov };

// Added to mean |g| in the gap-aware penalty so a zero gap gives Λ = 1.
inline constexpr float kGapEpsilon = 1e-12f;

struct OuterConfig {
  float alpha = 1.0f;  // outer learning rate, > 0
  float beta = 0.0f;   // outer momentum, in [0, 1)
  MomentumKind momentum = MomentumKind::kHeavyBall;
  GapPenalty penalty = GapPenalty::kGapAware;
  float penalty_lambda = 1.0f;  // Λ for kConstant, >= 1
  ClipMode clip = ClipMode::kAdaptive;
  float clip_value = 3.0f;  // φ for kValue, k for kAdaptive, > 0
};

// INVALID_ARGUMENT naming the field and value when a config is out of range.
absl::Status ValidateOuterConfig(const OuterConfig& config);

struct OuterStepStats {
  double mean_penalty = 1.0;      // mean of Λ over the elements
  double momentum_norm_sq = 0.0;  // ||m||² after clipping
  size_t clipped = 0;             // elements of m changed by clipping
};

// One outer step. All spans have the same length.
//   Λ_j  = 1 | λ | max(1, |gap_j| · r), with r = 1 / (mean_block |gap| +
//          kGapEpsilon) rounded to float once per block
//   m    ← β·m + mean_delta / Λ, then clipped:
//          kValue: clamp(m, −φ, φ); kAdaptive: clamp(m, −k·rms_block(m), +...)
//   update = −α·m (heavy ball) or −α·(β·m + mean_delta/Λ) (Nesterov, with the
//          clipped m).
// `mean_delta` is D_r, `gap` the last decoded update (U_{r+1}); `momentum`
// is updated in place; `update` receives U_{r+2} before encoding. `update`
// may be the same memory as `gap` (a shard keeps one U buffer); no other
// overlap is allowed.
OuterStepStats OuterStep(const OuterConfig& config,
                         absl::Span<const float> mean_delta,
                         absl::Span<const float> gap,
                         absl::Span<float> momentum, absl::Span<float> update);

}  // namespace co2::server

#endif  // CO2_SERVER_OUTER_OPTIMIZER_H_
