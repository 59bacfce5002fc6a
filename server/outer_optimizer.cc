#include "server/outer_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/layout.h"

// How: the spans are walked one block of common::kBlockElements at a time;
// each block is finished (reductions, m, clip, update) before the next one is
// touched, so its ~1 MiB of working set stays in cache and no model-sized
// temporary exists (Nesterov with the gap-aware penalty keeps Δ/Λ of one
// block in a thread-local buffer). Every loop runs over groups of kLanes
// elements with a constant-trip inner loop: GCC at -O2 (very-cheap cost model)
// vectorises that shape but not a plain runtime-length loop, and the per-lane
// double accumulators make the reductions vectorisable while keeping a fixed
// summation order, so results are bit-for-bit deterministic.
//
// `gap` may be the very buffer that receives `update` (a shard that keeps one
// U buffer passes U_{r+1} in and gets U_{r+2} back): gap is only read before
// the block's update is written, and the last pass never reads it.

namespace co2::server {
namespace {

constexpr size_t kLanes = 8;

// Calls body(j, lane) for every j in [0, n): full groups of kLanes first, then
// the tail on lanes 0, 1, ... The lane lets callers keep one partial sum per
// lane and combine them in a fixed order with SumLanes.
template <typename Body>
inline void ForEachLane(size_t n, Body&& body) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t lane = 0; lane < kLanes; ++lane) body(i + lane, lane);
  }
  for (size_t lane = 0; i < n; ++i, ++lane) body(i, lane);
}

template <typename T>
inline T SumLanes(const T (&partial)[kLanes]) {
  T sum = 0;
  for (size_t lane = 0; lane < kLanes; ++lane) sum += partial[lane];
  return sum;
}

// Λ_j. `param` is λ for kConstant and the block's mean |g| + ε for
// kGapAware (unused for kNone).
template <GapPenalty kPenalty>
inline float PenaltyAt(float gap, float param) {
  if constexpr (kPenalty == GapPenalty::kNone) {
    return 1.0f;
  } else if constexpr (kPenalty == GapPenalty::kConstant) {
    return param;
  } else {
    const float ratio = std::fabs(gap) / param;
    return ratio > 1.0f ? ratio : 1.0f;
  }
}

// Δ/Λ of the current block for the Nesterov update with the gap-aware
// penalty, which cannot recompute Λ once gap may have been overwritten.
float* ScaledDeltaScratch() {
  thread_local std::unique_ptr<float[]> scratch(
      new float[common::kBlockElements]);
  return scratch.get();
}

struct Totals {
  double penalty_sum = 0.0;
  double norm_sq = 0.0;
  size_t clipped = 0;
};

// The passes below take their arrays as __restrict parameters and are kept
// out of line: GCC honours __restrict only on the parameters of the function
// being compiled (not on locals, and not after inlining into a caller), and
// without it the loops need runtime alias checks, which -O2 does not emit.
// A call per block costs nothing. Each pass names only the arrays it touches,
// so gap and update never meet in one pass.

// mean |g| over the block + ε, the denominator of the gap-aware Λ.
ABSL_ATTRIBUTE_NOINLINE float GapScale(const float* __restrict gap, size_t n) {
  double partial[kLanes] = {};
  ForEachLane(n, [&](size_t j, size_t lane) {
    partial[lane] += std::fabs(static_cast<double>(gap[j]));
  });
  return static_cast<float>(SumLanes(partial) / static_cast<double>(n) +
                            static_cast<double>(kGapEpsilon));
}

// m ← β·m + Δ/Λ; returns ΣΛ over the block. With kKeepScaled, Δ/Λ is also
// stored to `scaled`.
template <GapPenalty kPenalty, bool kKeepScaled>
ABSL_ATTRIBUTE_NOINLINE double UpdateMomentum(const float* __restrict delta,
                                              const float* __restrict gap,
                                              float* __restrict m,
                                              float* __restrict scaled,
                                              size_t n, float beta,
                                              float param) {
  if constexpr (kPenalty != GapPenalty::kGapAware) {
    static_assert(!kKeepScaled, "Λ is recomputed without reading gap");
    ForEachLane(n, [&](size_t j, size_t) {
      m[j] = beta * m[j] + delta[j] / PenaltyAt<kPenalty>(0.0f, param);
    });
    return static_cast<double>(PenaltyAt<kPenalty>(0.0f, param)) *
           static_cast<double>(n);
  } else {
    // Returns Λ_j.
    auto step = [&](size_t j) {
      const float lambda = PenaltyAt<kPenalty>(gap[j], param);
      const float scaled_delta = delta[j] / lambda;
      if constexpr (kKeepScaled) scaled[j] = scaled_delta;
      m[j] = beta * m[j] + scaled_delta;
      return lambda;
    };
    // ForEachLane by hand: with the widening ΣΛ in the same loop GCC 12
    // fails to if-convert max(1, ·) and vectorises nothing, so each group's
    // Λ goes through a small array and is summed by a second loop.
    double partial[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      float lambdas[kLanes];
      for (size_t lane = 0; lane < kLanes; ++lane) {
        lambdas[lane] = step(i + lane);
      }
      for (size_t lane = 0; lane < kLanes; ++lane) {
        partial[lane] += static_cast<double>(lambdas[lane]);
      }
    }
    for (size_t lane = 0; i < n; ++i, ++lane) {
      partial[lane] += static_cast<double>(step(i));
    }
    return SumLanes(partial);
  }
}

// rms of the block's m.
ABSL_ATTRIBUTE_NOINLINE double Rms(const float* __restrict m, size_t n) {
  double partial[kLanes] = {};
  ForEachLane(n, [&](size_t j, size_t lane) {
    const double v = static_cast<double>(m[j]);
    partial[lane] += v * v;
  });
  return std::sqrt(SumLanes(partial) / static_cast<double>(n));
}

// Clamps m to [−bound, bound] (when kClip) and writes the update; adds ||m||²
// and the clipped count to `totals`. Nesterov takes Δ/Λ from `scaled` for the
// gap-aware penalty and recomputes it from `delta` otherwise.
template <GapPenalty kPenalty, bool kClip, bool kNesterov>
ABSL_ATTRIBUTE_NOINLINE void ClipAndUpdate(
    const float* __restrict delta, const float* __restrict scaled,
    float* __restrict m, float* __restrict update, size_t n,
    const OuterConfig& config, float param, float bound, Totals& totals) {
  const float neg_alpha = -config.alpha;
  const float beta = config.beta;
  double norm_partial[kLanes] = {};
  // A block has at most kBlockElements elements, so 32 bits per lane suffice.
  uint32_t clipped_partial[kLanes] = {};
  ForEachLane(n, [&](size_t j, size_t lane) {
    float v = m[j];
    if constexpr (kClip) {
      const bool low = v < -bound;
      const bool high = v > bound;
      clipped_partial[lane] += static_cast<uint32_t>(low | high);
      v = low ? -bound : (high ? bound : v);
      m[j] = v;
    }
    if constexpr (kNesterov) {
      float step;
      if constexpr (kPenalty == GapPenalty::kGapAware) {
        step = scaled[j];
      } else {
        step = delta[j] / PenaltyAt<kPenalty>(0.0f, param);
      }
      update[j] = neg_alpha * (beta * v + step);
    } else {
      update[j] = neg_alpha * v;
    }
    norm_partial[lane] += static_cast<double>(v) * static_cast<double>(v);
  });
  totals.norm_sq += SumLanes(norm_partial);
  totals.clipped += SumLanes(clipped_partial);
}

// One block: [begin, begin + n) of every span.
template <GapPenalty kPenalty, bool kNesterov>
void StepBlock(const OuterConfig& config, const float* delta, const float* gap,
               float* m, float* update, size_t n, Totals& totals) {
  constexpr bool kKeepScaled = kNesterov && kPenalty == GapPenalty::kGapAware;
  float* scaled = kKeepScaled ? ScaledDeltaScratch() : nullptr;
  float param = 1.0f;
  if constexpr (kPenalty == GapPenalty::kConstant) {
    param = config.penalty_lambda;
  } else if constexpr (kPenalty == GapPenalty::kGapAware) {
    param = GapScale(gap, n);
  }
  totals.penalty_sum += UpdateMomentum<kPenalty, kKeepScaled>(
      delta, gap, m, scaled, n, config.beta, param);

  switch (config.clip) {
    case ClipMode::kNone:
      ClipAndUpdate<kPenalty, false, kNesterov>(delta, scaled, m, update, n,
                                                config, param, 0.0f, totals);
      return;
    case ClipMode::kValue:
      ClipAndUpdate<kPenalty, true, kNesterov>(delta, scaled, m, update, n,
                                               config, param, config.clip_value,
                                               totals);
      return;
    case ClipMode::kAdaptive: {
      const float bound = static_cast<float>(
          static_cast<double>(config.clip_value) * Rms(m, n));
      ClipAndUpdate<kPenalty, true, kNesterov>(delta, scaled, m, update, n,
                                               config, param, bound, totals);
      return;
    }
  }
}

template <GapPenalty kPenalty, bool kNesterov>
Totals StepAllBlocks(const OuterConfig& config,
                     absl::Span<const float> mean_delta,
                     absl::Span<const float> gap, absl::Span<float> momentum,
                     absl::Span<float> update) {
  Totals totals;
  const size_t n = mean_delta.size();
  for (size_t begin = 0; begin < n; begin += common::kBlockElements) {
    const size_t len =
        n - begin < common::kBlockElements ? n - begin : common::kBlockElements;
    StepBlock<kPenalty, kNesterov>(config, mean_delta.data() + begin,
                                   gap.data() + begin, momentum.data() + begin,
                                   update.data() + begin, len, totals);
  }
  return totals;
}

template <GapPenalty kPenalty>
Totals StepWithPenalty(const OuterConfig& config,
                       absl::Span<const float> mean_delta,
                       absl::Span<const float> gap, absl::Span<float> momentum,
                       absl::Span<float> update) {
  if (config.momentum == MomentumKind::kNesterov) {
    return StepAllBlocks<kPenalty, true>(config, mean_delta, gap, momentum,
                                         update);
  }
  return StepAllBlocks<kPenalty, false>(config, mean_delta, gap, momentum,
                                        update);
}

}  // namespace

absl::Status ValidateOuterConfig(const OuterConfig& config) {
  if (!(std::isfinite(config.alpha) && config.alpha > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alpha must be finite and > 0, got ", config.alpha));
  }
  if (!(config.beta >= 0.0f && config.beta < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta must be in [0, 1), got ", config.beta));
  }
  switch (config.momentum) {
    case MomentumKind::kHeavyBall:
    case MomentumKind::kNesterov:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "momentum has unknown value ", static_cast<int>(config.momentum)));
  }
  switch (config.penalty) {
    case GapPenalty::kNone:
    case GapPenalty::kGapAware:
      break;
    case GapPenalty::kConstant:
      if (!(std::isfinite(config.penalty_lambda) &&
            config.penalty_lambda >= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("penalty_lambda must be finite and >= 1, got ",
                         config.penalty_lambda));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "penalty has unknown value ", static_cast<int>(config.penalty)));
  }
  switch (config.clip) {
    case ClipMode::kNone:
      break;
    case ClipMode::kValue:
    case ClipMode::kAdaptive:
      if (!(std::isfinite(config.clip_value) && config.clip_value > 0.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "clip_value must be finite and > 0, got ", config.clip_value));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "clip has unknown value ", static_cast<int>(config.clip)));
  }
  return absl::OkStatus();
}

OuterStepStats OuterStep(const OuterConfig& config,
                         absl::Span<const float> mean_delta,
                         absl::Span<const float> gap,
                         absl::Span<float> momentum, absl::Span<float> update) {
  const size_t n = mean_delta.size();
  if (gap.size() != n || momentum.size() != n || update.size() != n) {
    // A caller bug (all four come from the same shard range); carrying on
    // would read or write out of bounds.
    std::fprintf(stderr,
                 "OuterStep: span sizes differ: mean_delta %zu, gap %zu, "
                 "momentum %zu, update %zu\n",
                 n, gap.size(), momentum.size(), update.size());
    std::abort();
  }

  Totals totals;
  switch (config.penalty) {
    case GapPenalty::kNone:
      totals = StepWithPenalty<GapPenalty::kNone>(config, mean_delta, gap,
                                                  momentum, update);
      break;
    case GapPenalty::kConstant:
      totals = StepWithPenalty<GapPenalty::kConstant>(config, mean_delta, gap,
                                                      momentum, update);
      break;
    case GapPenalty::kGapAware:
      totals = StepWithPenalty<GapPenalty::kGapAware>(config, mean_delta, gap,
                                                      momentum, update);
      break;
  }

  OuterStepStats stats;
  stats.mean_penalty =
      n == 0 ? 1.0 : totals.penalty_sum / static_cast<double>(n);
  stats.momentum_norm_sq = totals.norm_sq;
  stats.clipped = totals.clipped;
  return stats;
}

}  // namespace co2::server
