#include "server/job/outer_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/kernel_isa.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;

constexpr size_t kBlock = common::kBlockElements;

struct StepResult {
  std::vector<float> momentum;
  std::vector<float> update;
  OuterStepStats stats;
};

// Runs OuterStep of `round` on copies, so the inputs can be reused.
StepResult Step(const OuterConfig& config, const std::vector<float>& delta,
                const std::vector<float>& gap, std::vector<float> momentum,
                uint64_t round = 0) {
  StepResult r;
  r.update.assign(delta.size(), std::nanf(""));
  r.stats = OuterStep(config, round, delta, gap, absl::MakeSpan(momentum),
                      absl::MakeSpan(r.update));
  r.momentum = std::move(momentum);
  return r;
}

// The algorithm written the obvious way, in double, one block at a time;
// for delayed Nesterov, `m` is the period's v (outer_optimizer.h).
struct ReferenceStats {
  double mean_penalty = 1.0;
  double momentum_norm_sq = 0.0;
  size_t clipped = 0;
};

ReferenceStats ReferenceStep(const OuterConfig& c,
                             const std::vector<float>& delta,
                             const std::vector<float>& gap,
                             std::vector<double>& m,
                             std::vector<double>& update, uint64_t round = 0) {
  const size_t n = delta.size();
  const bool delayed = c.momentum == MomentumKind::kDelayedNesterov;
  const double period = delayed ? c.momentum_period : 1.0;
  const bool milestone = !delayed || (round + 1) % c.momentum_period == 0;
  const double decay = delayed ? 1.0 : c.beta;
  ReferenceStats stats;
  double penalty_sum = 0.0;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    const double len = static_cast<double>(end - begin);
    double mean_abs_gap = 0.0;
    for (size_t j = begin; j < end; ++j) mean_abs_gap += std::fabs(gap[j]);
    mean_abs_gap /= len;
    std::vector<double> scaled(end - begin);
    for (size_t j = begin; j < end; ++j) {
      double lambda = 1.0;
      if (c.penalty == GapPenalty::kConstant) lambda = c.penalty_lambda;
      if (c.penalty == GapPenalty::kGapAware) {
        lambda =
            std::max(1.0, std::fabs(gap[j]) / (mean_abs_gap + kGapEpsilon));
      }
      penalty_sum += lambda;
      scaled[j - begin] = delta[j] / lambda;
      m[j] = decay * m[j] + scaled[j - begin];
    }
    double bound = std::numeric_limits<double>::infinity();
    if (milestone && c.clip == ClipMode::kValue) bound = period * c.clip_value;
    if (milestone && c.clip == ClipMode::kAdaptive) {
      double sum_sq = 0.0;
      for (size_t j = begin; j < end; ++j) sum_sq += m[j] * m[j];
      bound = c.clip_value * std::sqrt(sum_sq / len);
    }
    for (size_t j = begin; j < end; ++j) {
      const double clipped = std::clamp(m[j], -bound, bound);
      if (clipped != m[j]) ++stats.clipped;
      m[j] = clipped;
      stats.momentum_norm_sq += m[j] * m[j] / (period * period);
      if (c.momentum == MomentumKind::kHeavyBall) {
        update[j] = -c.alpha * m[j];
      } else {
        const double lookahead = milestone ? c.beta : 0.0;
        update[j] = -c.alpha / period * (lookahead * m[j] + scaled[j - begin]);
      }
      if (delayed && milestone) m[j] *= c.beta;
    }
  }
  if (n > 0) stats.mean_penalty = penalty_sum / static_cast<double>(n);
  return stats;
}

std::vector<float> RandomVector(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// |actual − expected| ≤ 1e-5·|expected| + 1e-6 (the absolute part covers
// values that cancel to near zero in β·m + Δ/Λ).
::testing::AssertionResult Close(const char* what, size_t index, double actual,
                                 double expected) {
  if (std::fabs(actual - expected) <= 1e-5 * std::fabs(expected) + 1e-6) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << what << "[" << index << "] = " << actual << ", expected "
         << expected;
}

// ---------------------------------------------------------------------------
// Every penalty × clip × momentum variant at several sizes.

using Variant = std::tuple<GapPenalty, ClipMode, MomentumKind, size_t>;

class OuterOptimizerSweepTest : public ::testing::TestWithParam<Variant> {
 protected:
  OuterConfig Config() const {
    OuterConfig c;
    c.alpha = 0.7f;
    c.beta = 0.9f;
    c.penalty = std::get<0>(GetParam());
    c.penalty_lambda = 2.5f;
    c.clip = std::get<1>(GetParam());
    // Small enough that both clip modes cut a good share of the elements.
    c.clip_value = c.clip == ClipMode::kValue ? 1.5f : 1.2f;
    c.momentum = std::get<2>(GetParam());
    if (c.momentum == MomentumKind::kDelayedNesterov) {
      c.momentum_period = 2;
      // Its value bound is N·φ, on v, a sum of N rounds.
      if (c.clip == ClipMode::kValue) c.clip_value = 0.5f;
    }
    return c;
  }
  size_t Size() const { return std::get<3>(GetParam()); }
};

TEST_P(OuterOptimizerSweepTest, MatchesDoubleReferenceOverSeveralSteps) {
  const OuterConfig config = Config();
  CO2_ASSERT_OK(ValidateOuterConfig(config));
  const size_t n = Size();
  std::mt19937 rng(1234 + static_cast<unsigned>(n));

  std::vector<float> momentum(n, 0.0f);
  std::vector<double> ref_momentum(n, 0.0);
  std::vector<float> gap = RandomVector(n, 0.3f, rng);
  // Some large gaps, so the gap-aware Λ is well above 1 somewhere.
  for (size_t j = 0; j < n; j += 97) gap[j] *= 20.0f;
  std::vector<float> update(n);
  std::vector<double> ref_update(n);
  size_t total_clipped = 0;

  for (uint64_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<float> delta = RandomVector(n, 1.0f, rng);
    const ReferenceStats want =
        ReferenceStep(config, delta, gap, ref_momentum, ref_update, round);
    const OuterStepStats got =
        OuterStep(config, round, delta, gap, absl::MakeSpan(momentum),
                  absl::MakeSpan(update));
    for (size_t j = 0; j < n; ++j) {
      ASSERT_TRUE(Close("momentum", j, momentum[j], ref_momentum[j]));
      ASSERT_TRUE(Close("update", j, update[j], ref_update[j]));
    }
    // Λ is a float per element, summed in double.
    EXPECT_NEAR(got.mean_penalty, want.mean_penalty, 1e-6 * want.mean_penalty);
    EXPECT_NEAR(got.momentum_norm_sq, want.momentum_norm_sq,
                1e-5 * want.momentum_norm_sq);
    // A float and a double can fall on either side of the bound for a value
    // that sits right on it; allow one such element.
    EXPECT_LE(std::max(got.clipped, want.clipped) -
                  std::min(got.clipped, want.clipped),
              1u);
    if (config.penalty == GapPenalty::kGapAware && n > 1) {
      EXPECT_GT(got.mean_penalty, 1.05);
    }
    total_clipped += got.clipped;
    // The next round's gap is this round's update, as on the shard.
    gap = update;
  }
  if (config.clip == ClipMode::kNone) {
    EXPECT_EQ(total_clipped, 0u);
  } else if (n >= 1000) {
    EXPECT_GT(total_clipped, n / 100) << "the sweep does not exercise clipping";
  }
}

TEST_P(OuterOptimizerSweepTest, GapMayBeTheUpdateBuffer) {
  // A shard with one U buffer passes U_{r+1} as gap and receives U_{r+2} in
  // the same memory.
  const OuterConfig config = Config();
  const size_t n = Size();
  std::mt19937 rng(99);
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  const std::vector<float> gap = RandomVector(n, 0.5f, rng);
  const std::vector<float> m0 = RandomVector(n, 0.5f, rng);
  const StepResult separate = Step(config, delta, gap, m0);

  std::vector<float> m = m0;
  std::vector<float> buffer = gap;
  const OuterStepStats stats = OuterStep(
      config, 0, delta, buffer, absl::MakeSpan(m), absl::MakeSpan(buffer));
  EXPECT_EQ(m, separate.momentum);
  EXPECT_EQ(buffer, separate.update);
  EXPECT_EQ(stats.mean_penalty, separate.stats.mean_penalty);
  EXPECT_EQ(stats.momentum_norm_sq, separate.stats.momentum_norm_sq);
  EXPECT_EQ(stats.clipped, separate.stats.clipped);
}

TEST_P(OuterOptimizerSweepTest, IsDeterministic) {
  const OuterConfig config = Config();
  const size_t n = Size();
  std::mt19937 rng(7);
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  const std::vector<float> gap = RandomVector(n, 0.5f, rng);
  const std::vector<float> m0 = RandomVector(n, 0.5f, rng);
  const StepResult a = Step(config, delta, gap, m0);
  const StepResult b = Step(config, delta, gap, m0);
  EXPECT_EQ(a.momentum, b.momentum);
  EXPECT_EQ(a.update, b.update);
  EXPECT_EQ(a.stats.momentum_norm_sq, b.stats.momentum_norm_sq);
  EXPECT_EQ(a.stats.mean_penalty, b.stats.mean_penalty);
}

TEST(OuterOptimizerTest, AdaptiveClipHoldsAtEveryMagnitudeOfM) {
  // Σm² is summed in float over short runs and in double where a float m²
  // overflows or underflows: at any scale the bound k·rms(m), the clipped
  // elements and ||m||² must be those of the double reference, scaled. Zeros
  // sprinkled in (a frozen part of the model) must count as zeros.
  OuterConfig config;
  config.alpha = 0.7f;
  config.beta = 0.9f;
  config.clip = ClipMode::kAdaptive;
  config.clip_value = 1.2f;
  const size_t n = kBlock + 37;
  for (const float scale : {1e30f, 1e19f, 1.0f, 1e-18f, 1e-30f, 1e-38f}) {
    SCOPED_TRACE(absl::StrCat("scale ", scale));
    std::mt19937 rng(5);
    std::vector<float> delta = RandomVector(n, 1.0f, rng);
    for (size_t j = 0; j < n; ++j) delta[j] = j % 300 < 150 ? 0.0f : delta[j] * scale;
    const std::vector<float> gap(n, 0.0f);
    std::vector<double> ref_m(n, 0.0), ref_update(n);
    const ReferenceStats want = ReferenceStep(config, delta, gap, ref_m, ref_update);
    const StepResult got = Step(config, delta, gap, std::vector<float>(n, 0.0f));
    const double s = scale;
    for (size_t j = 0; j < n; ++j) {
      ASSERT_TRUE(Close("momentum", j, got.momentum[j] / s, ref_m[j] / s));
      ASSERT_TRUE(Close("update", j, got.update[j] / s, ref_update[j] / s));
    }
    EXPECT_NEAR(got.stats.momentum_norm_sq / (s * s),
                want.momentum_norm_sq / (s * s),
                1e-5 * want.momentum_norm_sq / (s * s));
    EXPECT_LE(std::max(got.stats.clipped, want.clipped) -
                  std::min(got.stats.clipped, want.clipped),
              1u);
    EXPECT_GT(got.stats.clipped, n / 100);
  }
}

// Bits of a float vector, for exact comparisons that treat NaN as a value.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

uint64_t Bits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

// `v` with every 53rd element (from `offset`) replaced by the next of
// `specials`.
void Sprinkle(std::vector<float>& v, size_t offset,
              std::initializer_list<float> specials) {
  size_t k = 0;
  for (size_t j = offset; j < v.size(); j += 53, ++k) {
    v[j] = specials.begin()[k % specials.size()];
  }
}

TEST_P(OuterOptimizerSweepTest, EveryKernelIsaGivesThePortableBits) {
  // Workers and shards on machines with and without AVX2 must hold the same
  // anchors, so every variant of the kernels must give the portable bits,
  // corner cases included.
  const std::vector<common::KernelIsa> isas = common::SupportedKernelIsas();
  if (isas.size() < 2) GTEST_SKIP() << "only the portable kernels run here";
  const OuterConfig config = Config();
  const size_t n = Size();
  constexpr float kMax = std::numeric_limits<float>::max();
  constexpr float kMin = std::numeric_limits<float>::min();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::nanf("");
  // Round 1 is a milestone of delayed Nesterov's period of 2, round 0 not.
  for (int kind = 0; kind < 8; ++kind) {
    const uint64_t round = kind / 4;
    std::mt19937 rng(17 + kind % 4);
    std::vector<float> delta = RandomVector(n, 1.0f, rng);
    std::vector<float> gap = RandomVector(n, 0.5f, rng);
    std::vector<float> m0 = RandomVector(n, 0.5f, rng);
    if (kind % 4 == 1) {  // subnormal and tiny values
      for (float* v : {&delta[0], &gap[0], &m0[0]}) {
        for (size_t j = 0; j < n; ++j) v[j] *= kMin * 0x1p-10f;
      }
    } else if (kind % 4 == 2) {  // near FLT_MAX: products and sums overflow
      Sprinkle(delta, 3, {kMax, -kMax, 0.9f * kMax});
      Sprinkle(gap, 5, {kMax, -0.5f * kMax});
      Sprinkle(m0, 7, {kMax, -kMax});
    } else if (kind % 4 == 3) {  // NaN and ±Inf
      Sprinkle(delta, 11, {nan, kInf});
      Sprinkle(gap, 13, {-kInf, nan});
      Sprinkle(m0, 2, {nan, -kInf, kInf});
    }
    SCOPED_TRACE(absl::StrCat("input kind ", kind % 4, ", round ", round));
    StepResult want;
    {
      common::ScopedKernelIsaForTesting pin(common::KernelIsa::kPortable);
      want = Step(config, delta, gap, m0, round);
    }
    for (common::KernelIsa isa : isas) {
      SCOPED_TRACE(common::KernelIsaName(isa));
      common::ScopedKernelIsaForTesting pin(isa);
      const StepResult got = Step(config, delta, gap, m0, round);
      EXPECT_EQ(Bits(got.momentum), Bits(want.momentum));
      EXPECT_EQ(Bits(got.update), Bits(want.update));
      EXPECT_EQ(Bits(got.stats.mean_penalty), Bits(want.stats.mean_penalty));
      EXPECT_EQ(Bits(got.stats.momentum_norm_sq),
                Bits(want.stats.momentum_norm_sq));
      EXPECT_EQ(got.stats.clipped, want.stats.clipped);
      // And with the update written over the gap, as a shard does.
      std::vector<float> m = m0, buffer = gap;
      OuterStep(config, round, delta, buffer, absl::MakeSpan(m),
                absl::MakeSpan(buffer));
      EXPECT_EQ(Bits(m), Bits(want.momentum));
      EXPECT_EQ(Bits(buffer), Bits(want.update));
    }
  }
}

std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  const char* penalty[] = {"NoPenalty", "Constant", "GapAware"};
  const char* clip[] = {"NoClip", "ValueClip", "AdaptiveClip"};
  const char* momentum[] = {"HeavyBall", "Nesterov", "DelayedNesterov"};
  return absl::StrCat(penalty[static_cast<int>(std::get<0>(info.param))],
                      clip[static_cast<int>(std::get<1>(info.param))],
                      momentum[static_cast<int>(std::get<2>(info.param))], "N",
                      std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllVariants, OuterOptimizerSweepTest,
    ::testing::Combine(::testing::Values(GapPenalty::kNone,
                                         GapPenalty::kConstant,
                                         GapPenalty::kGapAware),
                       ::testing::Values(ClipMode::kNone, ClipMode::kValue,
                                         ClipMode::kAdaptive),
                       ::testing::Values(MomentumKind::kHeavyBall,
                                         MomentumKind::kNesterov,
                                         MomentumKind::kDelayedNesterov),
                       ::testing::Values(size_t{1}, size_t{13}, size_t{1000},
                                         kBlock, 2 * kBlock + 17)),
    VariantName);

// ---------------------------------------------------------------------------
// Hand-computed cases.

// CheckStepFits reads every element of each span, under every kernel
// variant: one value too large (or NaN) anywhere, in a lane of a group or
// in the tail past the last whole group, refuses the step.
TEST(OuterOptimizerTest, CheckStepFitsSeesEveryElementUnderEveryKernelIsa) {
  OuterConfig config;
  config.alpha = 1.0f;
  config.beta = 0.5f;
  config.momentum = MomentumKind::kHeavyBall;
  const size_t n = 3 * 16 + 5;
  const std::vector<float> ones(n, 1.0f);
  for (common::KernelIsa isa : common::SupportedKernelIsas()) {
    SCOPED_TRACE(common::KernelIsaName(isa));
    common::ScopedKernelIsaForTesting pin(isa);
    CO2_EXPECT_OK(CheckStepFits(config, ones, ones, ones));
    for (size_t i = 0; i < n; ++i) {
      SCOPED_TRACE(absl::StrCat("element ", i));
      std::vector<float> bad = ones;
      bad[i] = -3.39e38f;  // finite, past FLT_MAX less the margin
      EXPECT_THAT(CheckStepFits(config, ones, ones, bad).message(),
                  HasSubstr("the anchor non-finite"));
      EXPECT_THAT(CheckStepFits(config, ones, bad, ones).message(),
                  HasSubstr("the momentum non-finite"));
      bad[i] = std::nanf("");
      EXPECT_THAT(CheckStepFits(config, bad, ones, ones).message(),
                  HasSubstr("the momentum non-finite"));
    }
  }
}

TEST(OuterOptimizerTest, HeavyBallGapAwareClosedForm) {
  OuterConfig c;
  c.alpha = 0.5f;
  c.beta = 0.9f;
  c.penalty = GapPenalty::kGapAware;
  c.clip = ClipMode::kNone;
  // mean |g| = 2, so Λ = max(1, |g|/2) = [1, 1, 1, 2].
  const StepResult r =
      Step(c, /*delta=*/{1, 2, -3, 4}, /*gap=*/{1, -1, 2, 4}, {1, -1, 0, 2});
  // m = 0.9·m + Δ/Λ = [0.9 + 1, −0.9 + 2, 0 − 3, 1.8 + 2].
  EXPECT_THAT(r.momentum, ElementsAre(FloatEq(1.9f), FloatEq(1.1f),
                                      FloatEq(-3.0f), FloatEq(3.8f)));
  EXPECT_THAT(r.update, ElementsAre(FloatEq(-0.95f), FloatEq(-0.55f),
                                    FloatEq(1.5f), FloatEq(-1.9f)));
  EXPECT_DOUBLE_EQ(r.stats.mean_penalty, 1.25);
  // 3.61 + 1.21 + 9 + 14.44.
  EXPECT_NEAR(r.stats.momentum_norm_sq, 28.26, 1e-5);
  EXPECT_EQ(r.stats.clipped, 0u);
}

TEST(OuterOptimizerTest, ValueClipClosedForm) {
  OuterConfig c;
  c.alpha = 0.5f;
  c.beta = 0.9f;
  c.penalty = GapPenalty::kNone;
  c.clip = ClipMode::kValue;
  c.clip_value = 2.0f;
  // Unclipped m = [1.9, 1.1, −3, 5.8].
  const StepResult r = Step(c, {1, 2, -3, 4}, {1, -1, 2, 4}, {1, -1, 0, 2});
  EXPECT_THAT(r.momentum, ElementsAre(FloatEq(1.9f), FloatEq(1.1f),
                                      FloatEq(-2.0f), FloatEq(2.0f)));
  EXPECT_THAT(r.update, ElementsAre(FloatEq(-0.95f), FloatEq(-0.55f),
                                    FloatEq(1.0f), FloatEq(-1.0f)));
  EXPECT_EQ(r.stats.mean_penalty, 1.0);
  EXPECT_NEAR(r.stats.momentum_norm_sq, 3.61 + 1.21 + 4 + 4, 1e-5);
  EXPECT_EQ(r.stats.clipped, 2u);
}

TEST(OuterOptimizerTest, AdaptiveClipNesterovConstantPenaltyClosedForm) {
  OuterConfig c;
  c.alpha = 0.5f;
  c.beta = 0.5f;
  c.momentum = MomentumKind::kNesterov;
  c.penalty = GapPenalty::kConstant;
  c.penalty_lambda = 2.0f;
  c.clip = ClipMode::kAdaptive;
  c.clip_value = 1.5f;
  // Δ/Λ = [0, −1, 4, −5]; m = 0.5·[2, 0, −2, 0] + Δ/Λ = [1, −1, 3, −5];
  // rms = sqrt((1 + 1 + 9 + 25)/4) = 3, bound 4.5: only −5 is cut.
  const StepResult r = Step(c, {0, -2, 8, -10}, {100, 0, 0, 0}, {2, 0, -2, 0});
  EXPECT_THAT(r.momentum, ElementsAre(1.0f, -1.0f, 3.0f, -4.5f));
  // −0.5·(0.5·m + Δ/Λ) = −0.5·[0.5, −1.5, 5.5, −7.25].
  EXPECT_THAT(r.update, ElementsAre(-0.25f, 0.75f, -2.75f, 3.625f));
  EXPECT_EQ(r.stats.mean_penalty, 2.0);
  EXPECT_EQ(r.stats.momentum_norm_sq, 1 + 1 + 9 + 20.25);
  EXPECT_EQ(r.stats.clipped, 1u);
}

TEST(OuterOptimizerTest, NesterovGapAwareClosedForm) {
  OuterConfig c;
  c.alpha = 1.0f;
  c.beta = 0.5f;
  c.momentum = MomentumKind::kNesterov;
  c.penalty = GapPenalty::kGapAware;
  c.clip = ClipMode::kNone;
  // mean |g| = (0 + 1 + 3 + 8)/4 = 3; Λ = [1, 1, 1, 8/3].
  const StepResult r = Step(c, {2, 2, 2, 8}, {0, -1, 3, 8}, {4, 0, 0, 0});
  // Δ/Λ = [2, 2, 2, 3]; m = [2 + 2, 2, 2, 3].
  EXPECT_THAT(r.momentum, ElementsAre(FloatEq(4.0f), FloatEq(2.0f),
                                      FloatEq(2.0f), FloatEq(3.0f)));
  // −(0.5·m + Δ/Λ).
  EXPECT_THAT(r.update, ElementsAre(FloatEq(-4.0f), FloatEq(-3.0f),
                                    FloatEq(-3.0f), FloatEq(-4.5f)));
  EXPECT_NEAR(r.stats.mean_penalty, (3 + 8.0 / 3) / 4, 1e-6);
  EXPECT_NEAR(r.stats.momentum_norm_sq, 16 + 4 + 4 + 9, 1e-5);
}

TEST(OuterOptimizerTest, RoundZeroGapGivesUnitPenalty) {
  std::mt19937 rng(5);
  const size_t n = kBlock + 100;
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  const std::vector<float> zero_gap(n, 0.0f);
  const std::vector<float> m0 = RandomVector(n, 1.0f, rng);
  OuterConfig gap_aware;
  gap_aware.beta = 0.9f;
  gap_aware.penalty = GapPenalty::kGapAware;
  OuterConfig none = gap_aware;
  none.penalty = GapPenalty::kNone;

  const StepResult a = Step(gap_aware, delta, zero_gap, m0);
  const StepResult b = Step(none, delta, zero_gap, m0);
  EXPECT_EQ(a.stats.mean_penalty, 1.0);
  EXPECT_EQ(a.momentum, b.momentum);
  EXPECT_EQ(a.update, b.update);
}

TEST(OuterOptimizerTest, UnitAlphaZeroBetaUpdateIsMinusMeanDelta) {
  std::mt19937 rng(6);
  const size_t n = 2 * kBlock + 3;
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  const std::vector<float> gap = RandomVector(n, 1.0f, rng);
  OuterConfig c;
  c.alpha = 1.0f;
  c.beta = 0.0f;
  c.penalty = GapPenalty::kNone;
  c.clip = ClipMode::kNone;
  for (MomentumKind kind :
       {MomentumKind::kHeavyBall, MomentumKind::kNesterov}) {
    c.momentum = kind;
    const StepResult r = Step(c, delta, gap, RandomVector(n, 1.0f, rng));
    for (size_t j = 0; j < n; ++j) {
      ASSERT_EQ(r.update[j], -delta[j]) << j;
      ASSERT_EQ(r.momentum[j], delta[j]) << j;
    }
    EXPECT_EQ(r.stats.mean_penalty, 1.0);
    EXPECT_EQ(r.stats.clipped, 0u);
  }
}

TEST(OuterOptimizerTest, DelayedNesterovMovesAPeriodAsOneNesterovStep) {
  // Over a period of N rounds the updates add up to one Nesterov step on
  // the period's mean D, and the momentum carries into the next period.
  OuterConfig delayed;
  delayed.alpha = 0.5f;
  delayed.beta = 0.75f;
  delayed.penalty = GapPenalty::kNone;
  delayed.clip = ClipMode::kNone;
  delayed.momentum = MomentumKind::kDelayedNesterov;
  delayed.momentum_period = 4;
  OuterConfig nesterov = delayed;
  nesterov.momentum = MomentumKind::kNesterov;
  nesterov.momentum_period = 1;
  const std::vector<float> gap(2, 0.0f);
  std::vector<float> v(2, 0.0f), m(2, 0.0f);
  for (uint64_t period = 0; period < 2; ++period) {
    SCOPED_TRACE(absl::StrCat("period ", period));
    std::vector<float> moved(2, 0.0f), sum(2, 0.0f);
    for (uint64_t i = 0; i < 4; ++i) {
      const uint64_t round = 4 * period + i;
      // Powers of two: every sum and product below is exact.
      const std::vector<float> d = {static_cast<float>(1 << i),
                                    -static_cast<float>(2 << (3 - i))};
      const StepResult r = Step(delayed, d, gap, v, round);
      v = r.momentum;
      for (size_t j = 0; j < 2; ++j) {
        moved[j] += r.update[j];
        sum[j] += d[j];
      }
      if (i < 3) {
        EXPECT_THAT(r.update, ElementsAre(FloatEq(-0.125f * d[0]),
                                          FloatEq(-0.125f * d[1])));
      }
    }
    const std::vector<float> mean = {sum[0] / 4, sum[1] / 4};
    const StepResult one = Step(nesterov, mean, gap, m);
    m = one.momentum;
    EXPECT_THAT(moved,
                ElementsAre(FloatEq(one.update[0]), FloatEq(one.update[1])));
    // The next period starts from β·m, scaled by N.
    EXPECT_THAT(
        v, ElementsAre(FloatEq(4 * 0.75f * m[0]), FloatEq(4 * 0.75f * m[1])));
  }
}

TEST(OuterOptimizerTest, DelayedNesterovNeedsAPeriod) {
  OuterConfig c;
  c.momentum = MomentumKind::kDelayedNesterov;
  c.momentum_period = 0;
  const absl::Status status = ValidateOuterConfig(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("momentum_period must be >= 1"));
}

TEST(OuterOptimizerTest, EmptySpans) {
  OuterConfig c;
  const OuterStepStats stats = OuterStep(c, 0, {}, {}, {}, {});
  EXPECT_EQ(stats.mean_penalty, 1.0);
  EXPECT_EQ(stats.momentum_norm_sq, 0.0);
  EXPECT_EQ(stats.clipped, 0u);
}

// ---------------------------------------------------------------------------
// Block independence: why the number of shards does not matter.

TEST(OuterOptimizerTest, BlockAlignedPartsGiveTheSameResultAsTheWhole) {
  const size_t n = 3 * kBlock + 17;
  std::mt19937 rng(11);
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  std::vector<float> gap = RandomVector(n, 0.5f, rng);
  // Blocks with very different scales, so per-block reductions differ.
  for (size_t j = kBlock; j < 2 * kBlock; ++j) gap[j] *= 50.0f;
  const std::vector<float> m0 = RandomVector(n, 3.0f, rng);

  for (MomentumKind kind :
       {MomentumKind::kHeavyBall, MomentumKind::kNesterov}) {
    OuterConfig c;
    c.alpha = 0.8f;
    c.beta = 0.9f;
    c.momentum = kind;
    c.penalty = GapPenalty::kGapAware;
    c.clip = ClipMode::kAdaptive;
    c.clip_value = 1.5f;
    const StepResult whole = Step(c, delta, gap, m0);

    for (size_t split : {kBlock, 2 * kBlock, 3 * kBlock}) {
      SCOPED_TRACE(absl::StrCat("split at ", split));
      auto part = [&](const std::vector<float>& v, size_t b, size_t e) {
        return std::vector<float>(v.begin() + b, v.begin() + e);
      };
      const StepResult first = Step(c, part(delta, 0, split),
                                    part(gap, 0, split), part(m0, 0, split));
      const StepResult second = Step(c, part(delta, split, n),
                                     part(gap, split, n), part(m0, split, n));
      std::vector<float> momentum = first.momentum;
      momentum.insert(momentum.end(), second.momentum.begin(),
                      second.momentum.end());
      std::vector<float> update = first.update;
      update.insert(update.end(), second.update.begin(), second.update.end());
      EXPECT_EQ(momentum, whole.momentum);
      EXPECT_EQ(update, whole.update);
      EXPECT_EQ(first.stats.clipped + second.stats.clipped,
                whole.stats.clipped);
      EXPECT_DOUBLE_EQ(
          first.stats.momentum_norm_sq + second.stats.momentum_norm_sq,
          whole.stats.momentum_norm_sq);
      EXPECT_NEAR((first.stats.mean_penalty * split +
                   second.stats.mean_penalty * (n - split)) /
                      n,
                  whole.stats.mean_penalty, 1e-12);
    }
    EXPECT_GT(whole.stats.clipped, 0u);
  }
}

TEST(OuterOptimizerTest, ReductionsAreTakenPerBlock) {
  // Scaling block 1 changes nothing in block 0 but does change block 1 and
  // the stats; an unaligned split is not equivalent to the whole.
  const size_t n = 2 * kBlock;
  std::mt19937 rng(12);
  const std::vector<float> delta = RandomVector(n, 1.0f, rng);
  const std::vector<float> gap = RandomVector(n, 0.5f, rng);
  const std::vector<float> m0 = RandomVector(n, 1.0f, rng);
  std::vector<float> scaled_gap = gap;
  for (size_t j = kBlock; j < n; ++j) scaled_gap[j] *= 4.0f;
  std::vector<float> shifted_gap = gap;
  for (size_t j = kBlock; j < n; j += 2) shifted_gap[j] = 0.0f;

  OuterConfig c;
  c.beta = 0.9f;
  c.penalty = GapPenalty::kGapAware;
  c.clip = ClipMode::kAdaptive;
  c.clip_value = 1.2f;
  const StepResult base = Step(c, delta, gap, m0);
  // Λ is invariant to scaling the gap of a whole block: |g|/mean|g|.
  const StepResult scaled = Step(c, delta, scaled_gap, m0);
  EXPECT_EQ(scaled.momentum, base.momentum);
  // Zeroing half of block 1's gap moves block 1 only.
  const StepResult shifted = Step(c, delta, shifted_gap, m0);
  EXPECT_TRUE(std::equal(base.update.begin(), base.update.begin() + kBlock,
                         shifted.update.begin()));
  EXPECT_FALSE(std::equal(base.update.begin() + kBlock, base.update.end(),
                          shifted.update.begin() + kBlock));

  const size_t split = 1000;
  const StepResult head =
      Step(c, std::vector<float>(delta.begin(), delta.begin() + split),
           std::vector<float>(gap.begin(), gap.begin() + split),
           std::vector<float>(m0.begin(), m0.begin() + split));
  EXPECT_FALSE(
      std::equal(head.update.begin(), head.update.end(), base.update.begin()));
}

// ---------------------------------------------------------------------------
// Config validation.

void ExpectRejected(const OuterConfig& c, const std::string& field,
                    const std::string& value) {
  const absl::Status status = ValidateOuterConfig(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
      << field << " " << value << ": " << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  EXPECT_THAT(std::string(status.message()), HasSubstr(value));
}

TEST(OuterOptimizerTest, ValidateAcceptsDefaultsAndEdgeValues) {
  CO2_EXPECT_OK(ValidateOuterConfig(OuterConfig{}));
  OuterConfig c;
  c.beta = 0.0f;
  c.alpha = 1e-6f;
  CO2_EXPECT_OK(ValidateOuterConfig(c));
  c.beta = 0.999f;
  c.penalty = GapPenalty::kConstant;
  c.penalty_lambda = 1.0f;
  CO2_EXPECT_OK(ValidateOuterConfig(c));
  // Fields of modes that are off are not checked.
  c.penalty = GapPenalty::kGapAware;
  c.penalty_lambda = 0.5f;
  c.clip = ClipMode::kNone;
  c.clip_value = -1.0f;
  CO2_EXPECT_OK(ValidateOuterConfig(c));
}

TEST(OuterOptimizerTest, ValidateRejectsBadAlpha) {
  const float inf = std::numeric_limits<float>::infinity();
  for (auto [alpha, text] : {std::pair<float, const char*>{0.0f, "0"},
                             {-1.5f, "-1.5"},
                             {inf, "inf"},
                             {std::nanf(""), "nan"}}) {
    OuterConfig c;
    c.alpha = alpha;
    ExpectRejected(c, "alpha", text);
  }
}

TEST(OuterOptimizerTest, ValidateRejectsBadBeta) {
  for (auto [beta, text] : {std::pair<float, const char*>{1.0f, "1"},
                            {1.5f, "1.5"},
                            {-0.25f, "-0.25"},
                            {std::nanf(""), "nan"}}) {
    OuterConfig c;
    c.beta = beta;
    ExpectRejected(c, "beta", text);
  }
  OuterConfig c;
  c.beta = 1.5f;
  EXPECT_EQ(ValidateOuterConfig(c).message(),
            "beta must be in [0, 1), got 1.5");
}

TEST(OuterOptimizerTest, ValidateRejectsBadPenaltyLambda) {
  for (auto [lambda, text] : {std::pair<float, const char*>{0.5f, "0.5"},
                              {0.0f, "0"},
                              {-2.0f, "-2"},
                              {std::nanf(""), "nan"}}) {
    OuterConfig c;
    c.penalty = GapPenalty::kConstant;
    c.penalty_lambda = lambda;
    ExpectRejected(c, "penalty_lambda", text);
  }
}

TEST(OuterOptimizerTest, ValidateRejectsBadClipValue) {
  const float inf = std::numeric_limits<float>::infinity();
  for (ClipMode mode : {ClipMode::kValue, ClipMode::kAdaptive}) {
    for (auto [value, text] : {std::pair<float, const char*>{0.0f, "0"},
                               {-3.0f, "-3"},
                               {inf, "inf"},
                               {std::nanf(""), "nan"}}) {
      OuterConfig c;
      c.clip = mode;
      c.clip_value = value;
      ExpectRejected(c, "clip_value", text);
    }
  }
}

TEST(OuterOptimizerTest, ValidateRejectsUnknownEnumValues) {
  OuterConfig c;
  c.penalty = static_cast<GapPenalty>(7);
  ExpectRejected(c, "penalty", "7");
  c = OuterConfig{};
  c.clip = static_cast<ClipMode>(9);
  ExpectRejected(c, "clip", "9");
  c = OuterConfig{};
  c.momentum = static_cast<MomentumKind>(5);
  ExpectRejected(c, "momentum", "5");
}

}  // namespace
}  // namespace co2::server
