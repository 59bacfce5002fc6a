#include "server/job/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/codec.h"
#include "common/kernel_isa.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

using common::Codec;
using ::testing::HasSubstr;

struct Term {
  std::vector<float> x;
  float w;
};

// `count` contributions of n values spread over many exponents (and some
// zeros and exact cancellations), with weights from 1 to 10^6.
std::vector<Term> RandomTerms(size_t count, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 12);
  std::uniform_real_distribution<float> weight(1.0f, 1e6f);
  std::vector<Term> terms(count);
  for (Term& t : terms) {
    t.w = std::round(weight(rng));
    t.x.resize(n);
    for (size_t i = 0; i < n; ++i) {
      t.x[i] = i % 97 == 0 ? 0.0f : std::ldexp(normal(rng), exponent(rng));
    }
  }
  return terms;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

TEST(ExactSumTest, AnyOrderAndAnyKernelGiveTheSameBits) {
  const size_t n = 1000 + 3;  // vector groups and a tail
  const std::vector<Term> terms = RandomTerms(24, n, 1);
  std::vector<size_t> order(terms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(2);
  std::vector<uint32_t> first;
  for (const common::KernelIsa isa : common::SupportedKernelIsas()) {
    common::ScopedKernelIsaForTesting pin(isa);
    for (int trial = 0; trial < 20; ++trial) {
      std::shuffle(order.begin(), order.end(), rng);
      ExactSum sum(n);
      ExactScalar weight;
      for (const size_t i : order) {
        CO2_ASSERT_OK(sum.Add(terms[i].x, terms[i].w));
        CO2_ASSERT_OK(weight.Add(terms[i].w));
      }
      // Both kinds of element: sums that fit a double, and wide ones.
      ASSERT_GT(sum.wide_elements(), 0u);
      ASSERT_LT(sum.wide_elements(), n);
      const std::vector<uint32_t> bits = Bits(sum.Mean(weight.Value()));
      if (first.empty()) first = bits;
      ASSERT_EQ(bits, first)
          << common::KernelIsaName(isa) << " trial " << trial;
    }
  }
}

// Mean's vector loop rounds like the scalar Value(i) / divisor, for sums
// of both signs and every magnitude the terms reach, with every kernel.
TEST(ExactSumTest, MeanRoundsLikeTheScalarValue) {
  const size_t n = 1000 + 3;
  const std::vector<Term> terms = RandomTerms(24, n, 5);
  for (const common::KernelIsa isa : common::SupportedKernelIsas()) {
    common::ScopedKernelIsaForTesting pin(isa);
    ExactSum sum(n);
    for (const Term& t : terms) CO2_ASSERT_OK(sum.Add(t.x, t.w));
    for (const double divisor : {1.0, 3.0, 7.5e6, 1e-5}) {
      const std::vector<float> mean = sum.Mean(divisor);
      for (size_t i = 0; i < n; ++i) {
        const float expected = static_cast<float>(sum.Value(i) / divisor);
        ASSERT_EQ(Bits({mean[i]}), Bits({expected}))
            << common::KernelIsaName(isa) << " element " << i << " divisor "
            << divisor;
      }
    }
  }
}

// Against a double-precision sum, the exact sum is at least as accurate as
// adding in fp32, element by element, and within one fp32 rounding of it.
TEST(ExactSumTest, AtLeastAsAccurateAsAnFp32Sum) {
  const size_t n = 4096;
  const std::vector<Term> terms = RandomTerms(16, n, 3);
  ExactSum sum(n);
  std::vector<float> fp32(n, 0.0f);
  std::vector<double> reference(n, 0.0);
  double weight = 0;
  for (const Term& t : terms) {
    CO2_ASSERT_OK(sum.Add(t.x, t.w));
    weight += t.w;
    for (size_t i = 0; i < n; ++i) {
      fp32[i] += t.w * t.x[i];
      reference[i] += static_cast<double>(t.w) * t.x[i];
    }
  }
  const std::vector<float> mean = sum.Mean(weight);
  double exact_error = 0, fp32_error = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = reference[i] / weight;
    const float exact = mean[i];
    const float rounded = static_cast<float>(want);
    EXPECT_LE(std::abs(exact - rounded),
              std::nextafter(std::abs(rounded), INFINITY) - std::abs(rounded))
        << "element " << i;
    const double e = std::abs(exact - want);
    const double f = std::abs(static_cast<float>(fp32[i] / weight) - want);
    EXPECT_LE(e, f + 1e-300) << "element " << i;
    exact_error += e;
    fp32_error += f;
  }
  EXPECT_LT(exact_error, fp32_error);
}

TEST(ExactSumTest, IntegerMeansAreExact) {
  // The mean of rank-valued buffers of N workers is (N − 1) / 2.
  for (int workers : {2, 3, 4, 7}) {
    ExactSum sum(5);
    ExactScalar weight;
    for (int r = 0; r < workers; ++r) {
      CO2_ASSERT_OK(sum.Add(std::vector<float>(5, float(r)), 1.0f));
      CO2_ASSERT_OK(weight.Add(1.0));
    }
    EXPECT_EQ(sum.Mean(weight.Value()),
              std::vector<float>(5, (workers - 1) / 2.0f));
  }
}

TEST(ExactSumTest, EncodedPayloadsAddTheirDecodedValues) {
  const size_t n = 3000;
  const std::vector<Term> terms = RandomTerms(3, n, 4);
  for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    ExactSum encoded(n), decoded(n);
    for (const Term& t : terms) {
      std::string bytes(common::EncodedSize(codec, n), '\0');
      common::Encode(codec, t.x, absl::MakeSpan(bytes.data(), bytes.size()));
      std::vector<float> values(n);
      common::Decode(codec, bytes, absl::MakeSpan(values));
      // Two pieces, split inside an element where the codec allows it.
      const size_t cut = codec == Codec::kInt8 ? bytes.size() : 4097;
      const std::string_view all(bytes);
      const std::string_view pieces[2] = {all.substr(0, cut), all.substr(cut)};
      CO2_ASSERT_OK(encoded.Add(
          codec, common::Pieces(pieces, codec == Codec::kInt8 ? 1 : 2), t.w));
      CO2_ASSERT_OK(decoded.Add(values, t.w));
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(encoded.Value(i), decoded.Value(i))
          << common::CodecName(codec) << " element " << i;
    }
  }
}

TEST(ExactSumTest, ANonFiniteTermIsRejectedAndChangesNothing) {
  const size_t n = 2500;
  // Terms over 60 binades, so that many elements' sums are wide.
  const std::vector<Term> terms = RandomTerms(3, n, 6);
  for (const common::KernelIsa isa : common::SupportedKernelIsas()) {
    common::ScopedKernelIsaForTesting pin(isa);
    ExactSum sum(n);
    for (const Term& t : terms) CO2_ASSERT_OK(sum.Add(t.x, t.w));
    const size_t wide = sum.wide_elements();
    ASSERT_GT(wide, 0u);
    std::vector<double> before(n);
    for (size_t i = 0; i < n; ++i) before[i] = sum.Value(i);
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
      std::vector<float> x = RandomTerms(1, n, 7)[0].x;
      x[2100] = bad;
      const absl::Status status = sum.Add(x, 1e6f);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(), HasSubstr("element 2100"));
      EXPECT_THAT(status.message(), HasSubstr("is not finite"));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(sum.Value(i), before[i]) << common::KernelIsaName(isa) << i;
      }
      EXPECT_EQ(sum.terms(), 3u);
    }
    // The rejected terms moved elements to the side table before the bad
    // one was found (w = 1e6 puts them far from the sums): the take-back
    // above went through wide sums too, and they kept their values.
    EXPECT_GT(sum.wide_elements(), wide) << common::KernelIsaName(isa);
    // A first contribution that is refused leaves the sum empty.
    ExactSum empty(3);
    EXPECT_FALSE(empty.Add({1.0f, NAN, 2.0f}, 1.0f).ok());
    EXPECT_EQ(empty.terms(), 0u);
    EXPECT_EQ(empty.Value(0), 0.0);
  }
}

// Sums that do not fit a double are still exact, whatever the order: a term
// 2^200 apart from the others, cancelled later.
TEST(ExactSumTest, WideSumsAreExactInAnyOrder) {
  const std::vector<std::vector<float>> terms = {
      {0x1p100f, 1.0f, 0x1p-100f},
      {0x1p-100f, 0x1p-24f, 3.0f},
      {-0x1p100f, 0x1p-48f, -0x1p-100f},
  };
  std::vector<size_t> order = {0, 1, 2};
  do {
    ExactSum sum(3);
    for (const size_t i : order) CO2_ASSERT_OK(sum.Add(terms[i], 1.0f));
    EXPECT_EQ(sum.Value(0), 0x1p-100);
    EXPECT_EQ(sum.Value(1), 1.0 + 0x1p-24 + 0x1p-48);
    EXPECT_EQ(sum.Value(2), 3.0);
  } while (std::next_permutation(order.begin(), order.end()));
  // Typical contributions (values of like magnitude, equal weights) all
  // stay in the 8-byte sums.
  ExactSum typical(4096);
  for (const Term& t : RandomTerms(8, 4096, 8)) {
    std::vector<float> x = t.x;
    for (float& v : x) v = 1e-3f + std::ldexp(v, -30);
    CO2_ASSERT_OK(typical.Add(x, 1.0f));
  }
  EXPECT_EQ(typical.wide_elements(), 0u);
}

// ExactScalar rounds the exact sum once, to nearest with ties to even,
// however far apart its terms are.
TEST(ExactScalarTest, RoundsTheExactSumOnce) {
  auto sum = [](std::initializer_list<double> terms) {
    ExactScalar s;
    for (const double t : terms) CO2_EXPECT_OK(s.Add(t)) << t;
    return s.Value();
  };
  EXPECT_EQ(sum({}), 0.0);
  EXPECT_EQ(sum({1.0, 0x1p-53}), 1.0);                      // a tie: to even
  EXPECT_EQ(sum({1.0, 0x1p-53, 0x1p-290}), 1.0 + 0x1p-52);  // above the tie
  EXPECT_EQ(sum({1.0 + 0x1p-52, 0x1p-53}), 1.0 + 0x1p-51);  // a tie, up
  EXPECT_EQ(sum({-1.0, -0x1p-53, -0x1p-290}), -1.0 - 0x1p-52);
  EXPECT_EQ(sum({-1.0, 0x1p-53, 0x1p-290}), -1.0 + 0x1p-53);
  EXPECT_EQ(sum({0x1p280, 0x1p-300, -0x1p280}), 0x1p-300);
  EXPECT_EQ(sum({0x1p-300, 0x1p-300, -0x1p-299}), 0.0);
  EXPECT_EQ(sum({3.0, -5.0, 0x1p60, -0x1p60}), -2.0);
  // A carry through every limb, and back.
  EXPECT_EQ(sum({-0x1p-300, 0x1p-300}), 0.0);
  EXPECT_EQ(sum({-0x1p-300, 0x1p287, 0x1p-300}), 0x1p287);
  EXPECT_EQ(sum({0x1.fffffffffffffp287, 0x1.fffffffffffffp287}),
            0x1.fffffffffffffp288);
  ExactScalar counted;
  CO2_ASSERT_OK(counted.Add(0.0));
  EXPECT_EQ(counted.terms(), 1u);
}

TEST(ExactScalarTest, TermsOutsideTheRangeAreRejected) {
  ExactScalar s;
  CO2_ASSERT_OK(s.Add(1.5));
  for (const double bad : {double(INFINITY), double(NAN), 0x1p288, -0x1p290,
                           0x1p-301, 0x1.8p-300}) {
    const absl::Status status = s.Add(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("outside the exact sum's range"));
  }
  EXPECT_EQ(s.terms(), 1u);
  EXPECT_EQ(s.Value(), 1.5);
  CO2_EXPECT_OK(s.Add(0x1.fffffffffffffp287));
  CO2_EXPECT_OK(s.Add(0x1p-300));
}

}  // namespace
}  // namespace co2::server
