#include "server/outer_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
// summation order, so results are bit-for-bit deterministic. The passes with a
// reduction spell the groups out in GCC vector types (see DoubleLanes), with
// the same lanes and operations, so that the partial sums stay in registers.
//
// `gap` may be the very buffer that receives `update` (a shard that keeps one
// U buffer passes U_{r+1} in and gets U_{r+2} back): gap is only read before
// the block's update is written, and the last pass never reads it.

namespace co2::server {
namespace {

constexpr size_t kLanes = 8;

// The reductions keep their kLanes partial sums in registers as GCC vector
// types (SSE2 on x86-64, NEON on AArch64): with a `double partial[kLanes]`
// that a vectorised inner loop indexes, GCC keeps the array in memory and
// every group waits on a store and a reload. Lane l of the vectors is lane l
// of ForEachLane, so the sums and their order are the same.
typedef float F4 __attribute__((vector_size(16)));
typedef double D2 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef uint32_t U4 __attribute__((vector_size(16)));
static_assert(kLanes == 8, "a group is two F4, its lanes four D2");

inline F4 LoadF4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreF4(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }
inline F4 SplatF4(float x) { return F4{x, x, x, x}; }
inline F4 AbsF4(F4 v) { return F4(I4(v) & 0x7FFFFFFF); }
// Lanes 0-1 and 2-3 of v, widened. (GCC 12 widens a 2-float vector one
// element at a time, so x86 gets cvtps2pd by name.)
#if defined(__SSE2__)
inline D2 LowD2(F4 v) { return D2(_mm_cvtps_pd(__m128(v))); }
inline D2 HighD2(F4 v) {
  return D2(_mm_cvtps_pd(_mm_movehl_ps(__m128(v), __m128(v))));
}
#else
inline D2 LowD2(F4 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), D2);
}
inline D2 HighD2(F4 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), D2);
}
#endif

// Eight double lanes: lane 2k + h in sums[k][h].
struct DoubleLanes {
  D2 sums[4] = {};
  // lane (4·half + l) += x[l] widened, for the F4 of one half of a group.
  void Add(int half, F4 x) {
    sums[2 * half] += LowD2(x);
    sums[2 * half + 1] += HighD2(x);
  }
  // lane += x[l]² in double.
  void AddSquares(int half, F4 x) {
    const D2 lo = LowD2(x), hi = HighD2(x);
    sums[2 * half] += lo * lo;
    sums[2 * half + 1] += hi * hi;
  }
  void Store(double (&partial)[kLanes]) const {
    for (int k = 0; k < 4; ++k) {
      partial[2 * k] = sums[k][0];
      partial[2 * k + 1] = sums[k][1];
    }
  }
};

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
  DoubleLanes lanes;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    lanes.Add(0, AbsF4(LoadF4(gap + i)));
    lanes.Add(1, AbsF4(LoadF4(gap + i + 4)));
  }
  double partial[kLanes];
  lanes.Store(partial);
  for (size_t lane = 0; i < n; ++i, ++lane) {
    partial[lane] += std::fabs(static_cast<double>(gap[i]));
  }
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
    // step() on F4: the same operations, element by element.
    const F4 scale = SplatF4(param), one = SplatF4(1.0f), b = SplatF4(beta);
    DoubleLanes lanes;
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const size_t j = i + 4 * half;
        const F4 ratio = AbsF4(LoadF4(gap + j)) / scale;
        const F4 lambda = ratio > one ? ratio : one;
        const F4 scaled_delta = LoadF4(delta + j) / lambda;
        if constexpr (kKeepScaled) StoreF4(scaled + j, scaled_delta);
        StoreF4(m + j, b * LoadF4(m + j) + scaled_delta);
        lanes.Add(half, lambda);
      }
    }
    double partial[kLanes];
    lanes.Store(partial);
    for (size_t lane = 0; i < n; ++i, ++lane) {
      partial[lane] += static_cast<double>(step(i));
    }
    return SumLanes(partial);
  }
}

// rms of the block's m.
ABSL_ATTRIBUTE_NOINLINE double Rms(const float* __restrict m, size_t n) {
  DoubleLanes lanes;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    lanes.AddSquares(0, LoadF4(m + i));
    lanes.AddSquares(1, LoadF4(m + i + 4));
  }
  double partial[kLanes];
  lanes.Store(partial);
  for (size_t lane = 0; i < n; ++i, ++lane) {
    const double v = static_cast<double>(m[i]);
    partial[lane] += v * v;
  }
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
  // The body below on F4, for the full groups.
  const F4 na = SplatF4(neg_alpha), b = SplatF4(beta);
  const F4 hi_bound = SplatF4(bound), lo_bound = SplatF4(-bound);
  const F4 penalty = SplatF4(PenaltyAt<kPenalty>(0.0f, param));
  DoubleLanes norm;
  U4 clipped_lanes[2] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const size_t j = i + 4 * half;
      F4 v = LoadF4(m + j);
      if constexpr (kClip) {
        const I4 low = v < lo_bound;
        const I4 high = v > hi_bound;
        clipped_lanes[half] -= U4(low | high);  // a true lane is all ones
        v = low ? lo_bound : (high ? hi_bound : v);
        StoreF4(m + j, v);
      }
      if constexpr (kNesterov) {
        F4 step;
        if constexpr (kPenalty == GapPenalty::kGapAware) {
          step = LoadF4(scaled + j);
        } else {
          step = LoadF4(delta + j) / penalty;
        }
        StoreF4(update + j, na * (b * v + step));
      } else {
        StoreF4(update + j, na * v);
      }
      norm.AddSquares(half, v);
    }
  }
  double norm_partial[kLanes];
  norm.Store(norm_partial);
  // A block has at most kBlockElements elements, so 32 bits per lane suffice.
  uint32_t clipped_partial[kLanes];
  for (int l = 0; l < 4; ++l) {
    clipped_partial[l] = clipped_lanes[0][l];
    clipped_partial[4 + l] = clipped_lanes[1][l];
  }
  for (size_t lane = 0; i < n; ++i, ++lane) {
    const size_t j = i;
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
  }
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
