#include "server/job/outer_optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/base/attributes.h"
#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/kernel_isa.h"
#include "common/layout.h"
#include "common/momentum_schedule.h"

// How: the spans are walked one block of common::kBlockElements at a time;
// each block is finished before the next one is touched, so its working set
// stays in cache and no model-sized temporary exists (Nesterov with the
// gap-aware penalty keeps Δ/Λ of one block in a thread-local buffer). A block
// takes two passes and, for adaptive clipping, a fix-up: mean |g|; then m,
// the update, ΣΛ and Σm² in one pass (clipping there when the bound is a
// fixed value); then, with the bound k·rms(m) known, only the groups whose
// largest |m| exceeds it are clipped and their update rewritten. The loops
// work on groups of kLanes elements in GCC vector types with one accumulator
// per lane (float over a short run of groups, then double), so the
// reductions have a fixed summation order and results are bit-for-bit
// deterministic. The passes live in
// outer_step_kernels.inc, built once per common::KernelIsa.
//
// `gap` may be the very buffer that receives `update` (a shard that keeps one
// U buffer passes U_{r+1} in and gets U_{r+2} back): the momentum pass reads
// each register of gap before it writes the same register of update, and
// the fix-up never reads gap.

namespace co2::server {
namespace {

constexpr size_t kLanes = 16;

template <typename T>
inline T SumLanes(const T (&partial)[kLanes]) {
  T sum = 0;
  for (size_t lane = 0; lane < kLanes; ++lane) sum += partial[lane];
  return sum;
}

// Λ_j. `param` is λ for kConstant and 1 / (the block's mean |g| + ε) for
// kGapAware (unused for kNone).
template <GapPenalty kPenalty>
inline float PenaltyAt(float gap, float param) {
  if constexpr (kPenalty == GapPenalty::kNone) {
    return 1.0f;
  } else if constexpr (kPenalty == GapPenalty::kConstant) {
    return param;
  } else {
    const float ratio = std::fabs(gap) * param;
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

// The largest |m| bit pattern of each group of kLanes elements of the current
// block, for adaptive clipping (see MomentumAndUpdate).
uint32_t* GroupMaxScratch() {
  thread_local std::unique_ptr<uint32_t[]> scratch(
      new uint32_t[common::kBlockElements / kLanes + 1]);
  return scratch.get();
}

// One round's step as the kernels run it: m ← decay·m + Δ/Λ (clipped with
// `clip`, `clip_value`); update = neg_alpha·m (heavy ball) or
// neg_alpha·(lookahead·m + Δ/Λ) (`nesterov`); then m ← keep·m.
struct Coefficients {
  float neg_alpha = -1.0f;
  float decay = 0.0f;
  float lookahead = 0.0f;
  bool nesterov = false;
  GapPenalty penalty = GapPenalty::kNone;
  float penalty_lambda = 1.0f;
  ClipMode clip = ClipMode::kNone;
  float clip_value = 1.0f;
  float keep = 1.0f;
};

Coefficients CoefficientsOf(const OuterConfig& config, uint64_t round) {
  Coefficients k;
  k.neg_alpha = -config.alpha;
  k.decay = config.beta;
  k.lookahead = config.beta;
  k.nesterov = config.momentum != MomentumKind::kHeavyBall;
  k.penalty = config.penalty;
  k.penalty_lambda = config.penalty_lambda;
  k.clip = config.clip;
  k.clip_value = config.clip_value;
  if (config.momentum == MomentumKind::kDelayedNesterov) {
    const float period = static_cast<float>(config.momentum_period);
    k.neg_alpha = -config.alpha / period;
    k.decay = 1.0f;
    if (common::StepsDelayedMomentum(config.momentum_period, round)) {
      k.keep = config.beta;
      if (k.clip == ClipMode::kValue) k.clip_value *= period;
    } else {
      k.lookahead = 0.0f;
      k.clip = ClipMode::kNone;
    }
  }
  return k;
}

struct Totals {
  double penalty_sum = 0.0;
  double norm_sq = 0.0;
  size_t clipped = 0;
};

// The passes, once per KernelIsa (see outer_step_kernels.inc).
#define CO2_KERNELS_FILE "server/job/outer_step_kernels.inc"
#include "common/per_isa_kernels.inc"
#undef CO2_KERNELS_FILE

Totals Step(const Coefficients& k, absl::Span<const float> mean_delta,
            absl::Span<const float> gap, absl::Span<float> momentum,
            absl::Span<float> update) {
  return WithKernels([&](auto kernels) {
    return decltype(kernels)::OuterStep(k, mean_delta, gap, momentum, update);
  });
}

float MaxAbs(absl::Span<const float> x) {
  return WithKernels(
      [&](auto kernels) { return decltype(kernels)::MaxAbs(x); });
}

}  // namespace

absl::Status CheckStepFits(const OuterConfig& config,
                           absl::Span<const float> mean_delta,
                           absl::Span<const float> momentum,
                           absl::Span<const float> anchor) {
  // A margin for the kernels' fp32 rounding (a few ulps) and the downlink
  // codec's (bf16 rounds by at most 2^-9 of a value, int8 by less).
  constexpr double kMargin = 1.0 / 128;
  constexpr double kLimit = FLT_MAX * (1 - kMargin);
  const double delta = MaxAbs(mean_delta);
  const double m = delta + (momentum.empty() ? 0.0 : MaxAbs(momentum));
  double alpha = config.alpha;
  if (config.momentum == MomentumKind::kDelayedNesterov) {
    alpha /= static_cast<double>(config.momentum_period);
  }
  // Nesterov's β·m' + D/Λ, before α multiplies it.
  const double lookahead = m + delta;
  const double u = alpha * lookahead;
  const double a = MaxAbs(anchor) + u * (1 + kMargin);
  const char* what = nullptr;
  double value = 0;
  if (!(m < kLimit)) {
    what = "momentum";
    value = m;
  } else if (!(lookahead < kLimit)) {
    what = "update's β·m + mean";
    value = lookahead;
  } else if (!(u < kLimit)) {
    what = "update";
    value = u;
  } else if (!(a < kLimit)) {
    what = "anchor";
    value = a;
  } else {
    return absl::OkStatus();
  }
  return absl::OutOfRangeError(absl::StrCat(
      "the step would make the ", what, " non-finite: its bound ", value,
      " (largest |mean| ", delta, ") is past ", kLimit,
      ", FLT_MAX less a margin for rounding"));
}

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
    case MomentumKind::kDelayedNesterov:
      if (config.momentum_period < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "momentum_period must be >= 1 with delayed Nesterov momentum, "
            "got ",
            config.momentum_period));
      }
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

OuterStepStats OuterStep(const OuterConfig& config, uint64_t round,
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

  const Totals totals =
      Step(CoefficientsOf(config, round), mean_delta, gap, momentum, update);
  OuterStepStats stats;
  stats.mean_penalty =
      n == 0 ? 1.0 : totals.penalty_sum / static_cast<double>(n);
  stats.momentum_norm_sq = totals.norm_sq;
  if (config.momentum == MomentumKind::kDelayedNesterov) {
    const double period = config.momentum_period;
    stats.momentum_norm_sq /= period * period;
  }
  stats.clipped = totals.clipped;
  return stats;
}

}  // namespace co2::server
