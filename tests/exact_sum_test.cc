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

std::vector<float> MeanOf(const ExactSum& sum, double weight) {
  std::vector<float> mean(sum.size());
  sum.Divide(weight, absl::MakeSpan(mean));
  return mean;
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
        ASSERT_TRUE(sum.Add(terms[i].x, terms[i].w).ok());
        ASSERT_TRUE(weight.Add(terms[i].w).ok());
      }
      const std::vector<uint32_t> bits = Bits(MeanOf(sum, weight.Value()));
      if (first.empty()) first = bits;
      ASSERT_EQ(bits, first)
          << common::KernelIsaName(isa) << " trial " << trial;
    }
  }
}

// Divide's vector loop rounds like the scalar Value(i) / divisor, for sums
// of both signs and every magnitude the terms reach, with every kernel.
TEST(ExactSumTest, DivideRoundsLikeTheScalarValue) {
  const size_t n = 1000 + 3;
  const std::vector<Term> terms = RandomTerms(24, n, 5);
  for (const common::KernelIsa isa : common::SupportedKernelIsas()) {
    common::ScopedKernelIsaForTesting pin(isa);
    ExactSum sum(n);
    for (const Term& t : terms) ASSERT_TRUE(sum.Add(t.x, t.w).ok());
    for (const double divisor : {1.0, 3.0, 7.5e6, 1e-5}) {
      const std::vector<float> mean = MeanOf(sum, divisor);
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
    ASSERT_TRUE(sum.Add(t.x, t.w).ok());
    weight += t.w;
    for (size_t i = 0; i < n; ++i) {
      fp32[i] += t.w * t.x[i];
      reference[i] += static_cast<double>(t.w) * t.x[i];
    }
  }
  double exact_error = 0, fp32_error = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = reference[i] / weight;
    const float exact = MeanOf(sum, weight)[i];
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
      ASSERT_TRUE(sum.Add(std::vector<float>(5, float(r)), 1.0f).ok());
      ASSERT_TRUE(weight.Add(1.0).ok());
    }
    EXPECT_EQ(MeanOf(sum, weight.Value()),
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
      ASSERT_TRUE(
          encoded
              .Add(codec, common::Pieces(pieces, codec == Codec::kInt8 ? 1 : 2),
                   t.w)
              .ok());
      ASSERT_TRUE(decoded.Add(values, t.w).ok());
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(encoded.Value(i), decoded.Value(i))
          << common::CodecName(codec) << " element " << i;
    }
  }
}

TEST(ExactSumTest, ATermOutOfRangeIsRejectedAndChangesNothing) {
  const size_t n = 2500;
  std::vector<float> x(n, 1.5f);
  ExactSum sum(n);
  ASSERT_TRUE(sum.Add(x, 2.0f).ok());
  // 2^40 · 8 = 2^43 is the first magnitude out of range.
  x[2100] = -8.0f;
  const absl::Status status = sum.Add(x, 0x1p40f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("element 2100"));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sum.Value(i), 3.0) << i;
  EXPECT_EQ(sum.terms(), 1u);
  // Just inside the range, the sum is exact.
  x[2100] = std::nextafter(-8.0f, 0.0f);
  ASSERT_TRUE(sum.Add(x, 0x1p40f).ok());
  EXPECT_EQ(sum.Value(2100), 3.0 + static_cast<double>(x[2100]) * 0x1p40);
  ExactScalar weight;
  EXPECT_EQ(weight.Add(kExactSumMaxTerm).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(weight.Add(INFINITY).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(weight.terms(), 0u);
}

TEST(ExactSumTest, TermsBelowTheGridRoundToIt) {
  ExactSum sum(3);
  ASSERT_TRUE(sum.Add({0x1p-60f, 0x1p-62f, 0x1.8p-60f}, 1.0f).ok());
  EXPECT_EQ(sum.Value(0), 0x1p-60);
  EXPECT_EQ(sum.Value(1), 0.0);
  EXPECT_EQ(sum.Value(2), 0x1p-59);  // 1.5 units: ties to even
  // Large and small terms that cancel leave the small ones exactly.
  ExactSum cancel(1);
  ASSERT_TRUE(cancel.Add({0x1p42f}, 1.0f).ok());
  ASSERT_TRUE(cancel.Add({0x1p-50f}, 1.0f).ok());
  ASSERT_TRUE(cancel.Add({-0x1p42f}, 1.0f).ok());
  EXPECT_EQ(cancel.Value(0), 0x1p-50);
}

TEST(ExactSumTest, AtMostMaxTermsContributions) {
  ExactSum sum(1);
  for (uint32_t i = 0; i < kExactSumMaxTerms; ++i) {
    ASSERT_TRUE(sum.Add({-0x1p42f}, 1.99f).ok());
  }
  EXPECT_EQ(sum.Value(0), -0x1p42 * double(1.99f) * kExactSumMaxTerms);
  const absl::Status status = sum.Add({1.0f}, 1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("4095"));
}

}  // namespace
}  // namespace co2::server
