#include "common/codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernel_isa.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::common {

// Names test parameters readably ("bf16" rather than raw bytes).
void PrintTo(Codec codec, std::ostream* os) { *os << CodecName(codec); }

namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kFltMax = std::numeric_limits<float>::max();

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// Values spanning many binades (x = normal * 2^k, k in [-20, 20]), so bf16
// and int8 are exercised on more than one exponent.
std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(normal(rng), exponent(rng));
  return v;
}

std::string EncodeToString(Codec codec, const std::vector<float>& in) {
  std::string out(EncodedSize(codec, in.size()), '\0');
  Encode(codec, in, absl::MakeSpan(out.data(), out.size()));
  return out;
}

std::vector<float> DecodeToVector(Codec codec, const std::string& bytes,
                                  size_t n) {
  std::vector<float> out(n, -12345.0f);
  Decode(codec, bytes, absl::MakeSpan(out));
  return out;
}

// Bit-for-bit equality, reporting the first difference.
void ExpectBitsEqual(const std::vector<float>& want,
                     const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (Bits(want[i]) != Bits(got[i])) {
      ADD_FAILURE() << "first difference at element " << i << ": want "
                    << want[i] << " (0x" << std::hex << Bits(want[i])
                    << "), got " << got[i] << " (0x" << Bits(got[i]) << ")";
      return;
    }
  }
}

float Int8ScaleFromPayload(const std::string& bytes, size_t block) {
  float scale;
  std::memcpy(&scale, bytes.data() + block * sizeof(float), sizeof scale);
  return scale;
}

float AbsMax(const std::vector<float>& v, size_t begin, size_t end) {
  float m = 0.0f;
  for (size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

// The int8 codec as specified, written the obvious way.
std::string ReferenceInt8(const std::vector<float>& in) {
  const size_t n = in.size();
  const size_t blocks = (n + kInt8BlockElements - 1) / kInt8BlockElements;
  std::string out(blocks * 4 + n, '\0');
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kInt8BlockElements;
    const size_t end = std::min(n, begin + kInt8BlockElements);
    const float scale = AbsMax(in, begin, end) / 127.0f;
    std::memcpy(&out[b * 4], &scale, 4);
    // Values are multiplied by 1 / scale, computed once per block, unless
    // that reciprocal could overflow (a subnormal scale) or the scale is
    // capped.
    const bool reciprocal =
        scale >= std::numeric_limits<float>::min() && scale < kFltMax / 128.0f;
    for (size_t i = begin; i < end; ++i) {
      const float y = reciprocal ? in[i] * (1.0f / scale) : in[i] / scale;
      long q = scale == 0.0f ? 0 : std::lrintf(y);
      q = std::min(127L, std::max(-127L, q));
      out[blocks * 4 + i] = static_cast<char>(static_cast<int8_t>(q));
    }
  }
  return out;
}

class CodecSizeTest
    : public ::testing::TestWithParam<std::tuple<Codec, size_t>> {
 protected:
  Codec codec() const { return std::get<0>(GetParam()); }
  size_t n() const { return std::get<1>(GetParam()); }
};

TEST_P(CodecSizeTest, EncodedSizeFollowsLayout) {
  const size_t blocks = (n() + 1023) / 1024;
  const size_t want = codec() == Codec::kFp32   ? 4 * n()
                      : codec() == Codec::kBf16 ? 2 * n()
                                                : 4 * blocks + n();
  EXPECT_EQ(EncodedSize(codec(), n()), want);
}

TEST_P(CodecSizeTest, RoundTripIsWithinCodecError) {
  const std::vector<float> in = RandomVector(n(), 1);
  const std::string bytes = EncodeToString(codec(), in);
  CO2_ASSERT_OK(Validate(codec(), bytes, n()));
  const std::vector<float> out = DecodeToVector(codec(), bytes, n());
  switch (codec()) {
    case Codec::kFp32:
      ExpectBitsEqual(in, out);
      break;
    case Codec::kBf16:
      for (size_t i = 0; i < n(); ++i) {
        ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -8))
            << "element " << i << " in " << in[i];
        // The low 16 bits of a decoded bf16 are zero.
        ASSERT_EQ(Bits(out[i]) & 0xFFFFu, 0u) << "element " << i;
      }
      break;
    case Codec::kInt8:
      for (size_t b = 0; b * kInt8BlockElements < n(); ++b) {
        const size_t begin = b * kInt8BlockElements;
        const size_t end = std::min(n(), begin + kInt8BlockElements);
        const float step = AbsMax(in, begin, end) / 127.0f;
        ASSERT_EQ(Int8ScaleFromPayload(bytes, b), step) << "block " << b;
        for (size_t i = begin; i < end; ++i) {
          ASSERT_LE(std::fabs(out[i] - in[i]), step)
              << "element " << i << " in " << in[i] << " block " << b;
        }
      }
      break;
  }
}

TEST_P(CodecSizeTest, EncodeAndDecodeAreDeterministic) {
  const std::vector<float> in = RandomVector(n(), 3);
  const std::string a = EncodeToString(codec(), in);
  const std::string b = EncodeToString(codec(), in);
  EXPECT_TRUE(a == b);
  ExpectBitsEqual(DecodeToVector(codec(), a, n()),
                  DecodeToVector(codec(), b, n()));
}

TEST_P(CodecSizeTest, AccumulateDecodedEqualsDecodeThenAxpyBitExactly) {
  const std::vector<float> in = RandomVector(n(), 4);
  const std::string bytes = EncodeToString(codec(), in);
  for (float weight : {1.0f, 0.37f, -2.5f}) {
    std::vector<float> want = RandomVector(n(), 5);
    std::vector<float> got = want;
    const std::vector<float> x = DecodeToVector(codec(), bytes, n());
    for (size_t i = 0; i < n(); ++i) want[i] += weight * x[i];
    AccumulateDecoded(codec(), bytes, weight, absl::MakeSpan(got));
    SCOPED_TRACE(weight);
    ExpectBitsEqual(want, got);
  }
}

TEST_P(CodecSizeTest, ValidateRejectsWrongSize) {
  const std::string bytes = EncodeToString(codec(), RandomVector(n(), 6));
  for (const std::string& bad :
       {bytes + "x", bytes.substr(0, bytes.empty() ? 0 : bytes.size() - 1)}) {
    if (bad.size() == bytes.size()) continue;
    const absl::Status s = Validate(codec(), bad, n());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(),
                HasSubstr(std::to_string(n()) + " elements must be " +
                          std::to_string(bytes.size()) + " bytes, got " +
                          std::to_string(bad.size())));
  }
}

TEST_P(CodecSizeTest, FeedbackEncodesValuePlusResidualAndKeepsTheError) {
  const std::vector<float> value = RandomVector(n(), 7);
  std::vector<float> residual = RandomVector(n(), 8);
  for (float& r : residual) r *= 0.01f;
  std::vector<float> v(n());
  for (size_t i = 0; i < n(); ++i) v[i] = value[i] + residual[i];
  std::string out(EncodedSize(codec(), n()), '\0');
  EncodeWithFeedback(codec(), value, absl::MakeSpan(residual),
                     absl::MakeSpan(out.data(), out.size()));
  EXPECT_TRUE(out == EncodeToString(codec(), v));
  const std::vector<float> decoded = DecodeToVector(codec(), out, n());
  std::vector<float> want(n());
  for (size_t i = 0; i < n(); ++i) {
    want[i] = codec() == Codec::kFp32 ? 0.0f : v[i] - decoded[i];
  }
  ExpectBitsEqual(want, residual);
}

std::string SizeTestName(
    const ::testing::TestParamInfo<CodecSizeTest::ParamType>& info) {
  return std::string(CodecName(std::get<0>(info.param))) + "_" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllCodecs, CodecSizeTest,
    ::testing::Combine(
        ::testing::Values(Codec::kFp32, Codec::kBf16, Codec::kInt8),
        ::testing::Values(size_t{0}, size_t{1}, size_t{1023}, size_t{1024},
                          size_t{1025}, size_t{262144 + 7})),
    SizeTestName);

class Int8SizeTest : public ::testing::TestWithParam<size_t> {};

TEST_P(Int8SizeTest, MatchesReferenceQuantiser) {
  // Shifted by 2^-125 most blocks get subnormal scales, whose rounding can
  // leave |x / scale| well above 127.
  for (int shift : {0, 90, -125}) {
    SCOPED_TRACE(shift);
    std::vector<float> in = RandomVector(GetParam(), 2);
    for (float& x : in) x = std::ldexp(x, shift);
    const std::string got = EncodeToString(Codec::kInt8, in);
    const std::string want = ReferenceInt8(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "payload byte " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, Int8SizeTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{1023},
                                           size_t{1024}, size_t{1025},
                                           size_t{262144 + 7}));

TEST(CodecTest, EncodedSizeExamples) {
  EXPECT_EQ(EncodedSize(Codec::kInt8, 0), 0u);
  EXPECT_EQ(EncodedSize(Codec::kInt8, 1000), 1004u);
  EXPECT_EQ(EncodedSize(Codec::kInt8, 1025), 1033u);
  EXPECT_EQ(EncodedSize(Codec::kBf16, 1000), 2000u);
  EXPECT_EQ(EncodedSize(Codec::kFp32, 1000), 4000u);
}

TEST(CodecTest, Bf16RoundsToNearestEven) {
  struct Case {
    uint32_t in;
    uint16_t want;
  };
  const Case cases[] = {
      {0x3F800000, 0x3F80},  // 1.0: exact.
      {0x3F807FFF, 0x3F80},  // Just below half: down.
      {0x3F808000, 0x3F80},  // Tie, even below: down.
      {0x3F808001, 0x3F81},  // Just above half: up.
      {0x3F818000, 0x3F82},  // Tie, odd below: up to even.
      {0xBF808000, 0xBF80},  // Negative tie, even: toward zero.
      {0xBF818000, 0xBF82},  // Negative tie, odd: away from zero.
      {0x3FFF8000, 0x4000},  // Tie that carries into the exponent.
      {0x00000000, 0x0000}, {0x80000000, 0x8000},  // ±0.
      {0x00008000, 0x0000},                        // Subnormal tie, even.
      {0x00018000, 0x0002},                        // Subnormal tie, odd.
      {0x7F7F7FFF, 0x7F7F},                        // Near FLT_MAX, rounds down.
      {0x7F7FFFFF, 0x7F7F},  // FLT_MAX would round to Inf: saturates.
      {0xFF7FFFFF, 0xFF7F},  // -FLT_MAX likewise.
  };
  constexpr size_t kCases = sizeof(cases) / sizeof(cases[0]);
  // Repeated so that both the vectorised body and the scalar tail see them.
  std::vector<float> in;
  for (int rep = 0; rep < 3; ++rep) {
    for (const Case& c : cases) in.push_back(FromBits(c.in));
  }
  const std::string bytes = EncodeToString(Codec::kBf16, in);
  CO2_ASSERT_OK(Validate(Codec::kBf16, bytes, in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, bytes.data() + 2 * i, 2);
    EXPECT_EQ(got, cases[i % kCases].want)
        << std::hex << "input 0x" << cases[i % kCases].in << " at " << std::dec
        << i;
  }
}

TEST(CodecTest, Bf16DecodeShiftsLeft) {
  const uint16_t words[] = {0x3F80, 0xC000, 0x0001, 0x8000};
  const std::string bytes(reinterpret_cast<const char*>(words), sizeof words);
  const std::vector<float> out = DecodeToVector(Codec::kBf16, bytes, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(Bits(out[2]), 0x00010000u);
  EXPECT_EQ(Bits(out[3]), 0x80000000u);
}

TEST(CodecTest, Int8QuantisesHandPickedValues) {
  // absmax 127 gives scale 1, so q is lrintf(x): ties go to even.
  const std::vector<float> in = {127.0f, -63.5f, 0.5f,    1.5f, 2.5f,
                                 -0.5f,  0.0f,   -127.0f, 3.49f};
  const std::string bytes = EncodeToString(Codec::kInt8, in);
  ASSERT_EQ(bytes.size(), 4 + in.size());
  EXPECT_EQ(Int8ScaleFromPayload(bytes, 0), 1.0f);
  const int8_t want[] = {127, -64, 0, 2, 2, 0, 0, -127, 3};
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(static_cast<int8_t>(bytes[4 + i]), want[i]) << "element " << i;
  }
}

TEST(CodecTest, Int8MultipliesByTheReciprocalOfTheScale) {
  // absmax 1 gives scale fl(1/127), whose reciprocal is exactly 127. For this
  // x, x · 127 rounds to 5 but x / scale to 6: the codec divides once per
  // block and multiplies, in every kernel variant.
  std::vector<float> in(64, FromBits(0x3d3162c5));
  in[0] = 1.0f;
  for (KernelIsa isa : SupportedKernelIsas()) {
    SCOPED_TRACE(KernelIsaName(isa));
    ScopedKernelIsaForTesting pin(isa);
    const std::string bytes = EncodeToString(Codec::kInt8, in);
    for (size_t i = 1; i < in.size(); ++i) {
      ASSERT_EQ(static_cast<int8_t>(bytes[4 + i]), 5) << "element " << i;
    }
  }
}

TEST(CodecTest, Int8SubnormalScaleStillClamps) {
  // absmax / 127 = 1.496 · 2^-149 rounds down to 2^-149, so 190 · 2^-149
  // divides to 190 and must clamp to 127.
  const float d = std::numeric_limits<float>::denorm_min();
  const std::vector<float> in = {190 * d, -3 * d, 0.0f, -190 * d, 100 * d};
  const std::string bytes = EncodeToString(Codec::kInt8, in);
  EXPECT_EQ(Int8ScaleFromPayload(bytes, 0), d);
  const int8_t want[] = {127, -3, 0, -127, 100};
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(static_cast<int8_t>(bytes[4 + i]), want[i]) << "element " << i;
  }
  CO2_EXPECT_OK(Validate(Codec::kInt8, bytes, in.size()));
}

TEST(CodecTest, Int8AllZeroBlockHasZeroScale) {
  std::vector<float> in(1030, 0.0f);
  in[1027] = -3.0f;  // Second block only.
  const std::string bytes = EncodeToString(Codec::kInt8, in);
  EXPECT_EQ(Int8ScaleFromPayload(bytes, 0), 0.0f);
  EXPECT_EQ(Int8ScaleFromPayload(bytes, 1), 3.0f / 127.0f);
  EXPECT_EQ(static_cast<int8_t>(bytes[8 + 1027]), -127);
  CO2_ASSERT_OK(Validate(Codec::kInt8, bytes, in.size()));
  const std::vector<float> out = DecodeToVector(Codec::kInt8, bytes, 1030);
  for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(out[i], 0.0f) << i;
  EXPECT_EQ(out[1027], -127.0f * (3.0f / 127.0f));
}

TEST(CodecTest, HugeFiniteInputsStillEncodeToValidPayloads) {
  const std::vector<float> in = {kFltMax, -kFltMax, 1.0f, -3.0e38f};
  for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    SCOPED_TRACE(CodecName(codec));
    const std::string bytes = EncodeToString(codec, in);
    CO2_ASSERT_OK(Validate(codec, bytes, in.size()));
    const std::vector<float> out = DecodeToVector(codec, bytes, in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_TRUE(std::isfinite(out[i])) << out[i];
      // bf16 saturates (error < 2^-8 relative); int8 caps the scale at
      // FLT_MAX / 128 and clamps, so the error stays within about one step.
      const double bound = codec == Codec::kFp32   ? 0.0
                           : codec == Codec::kBf16 ? std::ldexp(in[i], -8)
                                                   : kFltMax / 127.0;
      EXPECT_LE(std::fabs(static_cast<double>(out[i]) - in[i]),
                std::fabs(bound))
          << "element " << i;
    }
  }
}

TEST(CodecTest, ValidateNamesTheExactSizeExpected) {
  const absl::Status s = Validate(Codec::kInt8, std::string(1003, '\0'), 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("int8 payload for 1000 elements must be 1004 bytes, "
                        "got 1003"));
}

TEST(CodecTest, ValidateRejectsNonFiniteValuesNamingTheFirst) {
  struct Bad {
    float value;
    uint16_t bf16;
    const char* text;
  };
  const Bad bads[] = {{kNaN, 0x7FC0, "nan"},
                      {kInf, 0x7F80, "+inf"},
                      {-kInf, 0xFF80, "-inf"},
                      {FromBits(0x7F800001), 0x7F81, "nan"}};  // Signalling.
  constexpr size_t kN = 262144 + 7;
  for (Codec codec : {Codec::kFp32, Codec::kBf16}) {
    const std::string good = EncodeToString(codec, RandomVector(kN, 9));
    CO2_ASSERT_OK(Validate(codec, good, kN));
    const size_t width = codec == Codec::kFp32 ? 4 : 2;
    for (const Bad& bad : bads) {
      for (size_t pos : {size_t{0}, size_t{1}, size_t{17}, size_t{4095},
                         size_t{4096}, size_t{200003}, kN - 1}) {
        SCOPED_TRACE(::testing::Message()
                     << CodecName(codec) << " " << bad.text << " at " << pos);
        std::string bytes = good;
        auto put_bad = [&](size_t at) {
          const void* src = codec == Codec::kFp32
                                ? static_cast<const void*>(&bad.value)
                                : static_cast<const void*>(&bad.bf16);
          std::memcpy(&bytes[at * width], src, width);
        };
        put_bad(pos);
        // A later bad value must not hide the first one.
        if (pos + 5 < kN) put_bad(pos + 5);
        const absl::Status s = Validate(codec, bytes, kN);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("element " + std::to_string(pos) +
                                           " is not finite"));
        EXPECT_THAT(s.message(), HasSubstr(bad.text));
      }
    }
  }
}

TEST(CodecTest, ValidateRejectsBadInt8Scales) {
  const size_t n = 3 * 1024 + 5;
  const std::string good = EncodeToString(Codec::kInt8, RandomVector(n, 10));
  CO2_ASSERT_OK(Validate(Codec::kInt8, good, n));
  struct Bad {
    float scale;
    size_t block;
    const char* text;
  };
  const Bad bads[] = {{-1.0f, 2, "-1"},
                      {kNaN, 0, "nan"},
                      {kInf, 3, "+inf"},
                      {-kInf, 1, "-inf"},
                      {1e37f, 1, "1e+37"}};  // 127·1e37 overflows.
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.text);
    std::string bytes = good;
    std::memcpy(&bytes[bad.block * 4], &bad.scale, 4);
    const absl::Status s = Validate(Codec::kInt8, bytes, n);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(),
                HasSubstr("block " + std::to_string(bad.block) + " "));
    EXPECT_THAT(s.message(), HasSubstr(bad.text));
  }
  // Zero (an all-zero block) and -0 are valid scales.
  for (float zero : {0.0f, -0.0f}) {
    std::string bytes = good;
    std::memcpy(&bytes[4], &zero, 4);
    CO2_EXPECT_OK(Validate(Codec::kInt8, bytes, n));
  }
}

TEST(CodecTest, ValidateAcceptsEmptyPayloads) {
  for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    CO2_EXPECT_OK(Validate(codec, "", 0));
    EXPECT_EQ(Validate(codec, "x", 0).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Error feedback: after R rounds of sending the same vector, the decoded
// values sum to R·value − residual_R (the residual telescopes), so the sum
// stays within one quantisation step of the truth. Without feedback the
// per-round bias adds up instead.
TEST(CodecTest, ErrorFeedbackKeepsTheRunningSumWithinOneStep) {
  constexpr size_t kN = 2 * 1024 + 100;
  constexpr int kRounds = 300;
  const std::vector<float> value = RandomVector(kN, 11);
  for (Codec codec : {Codec::kInt8, Codec::kBf16, Codec::kFp32}) {
    SCOPED_TRACE(CodecName(codec));
    std::vector<float> residual(kN, 0.0f);
    std::vector<double> sum_decoded(kN, 0.0), sum_plain(kN, 0.0);
    std::string out(EncodedSize(codec, kN), '\0');
    const std::vector<float> plain =
        DecodeToVector(codec, EncodeToString(codec, value), kN);
    for (int r = 0; r < kRounds; ++r) {
      EncodeWithFeedback(codec, value, absl::MakeSpan(residual),
                         absl::MakeSpan(out.data(), out.size()));
      const std::vector<float> decoded = DecodeToVector(codec, out, kN);
      for (size_t i = 0; i < kN; ++i) {
        sum_decoded[i] += decoded[i];
        sum_plain[i] += plain[i];
      }
    }
    double worst_plain = 0.0;
    for (size_t i = 0; i < kN; ++i) {
      const size_t block = i / kInt8BlockElements;
      const size_t begin = block * kInt8BlockElements;
      const double step =
          codec == Codec::kInt8
              ? AbsMax(value, begin, std::min(kN, begin + kInt8BlockElements)) /
                    127.0
              : std::ldexp(std::fabs(value[i]), -7);  // One bf16 ulp.
      const double truth = static_cast<double>(value[i]) * kRounds;
      ASSERT_LE(std::fabs(sum_decoded[i] - truth), step)
          << "element " << i << " value " << value[i];
      ASSERT_LE(std::fabs(residual[i]), step) << "element " << i;
      if (step > 0) {
        worst_plain =
            std::max(worst_plain, std::fabs(sum_plain[i] - truth) / step);
      }
    }
    // The check above can fail: without feedback the drift is many steps.
    if (codec != Codec::kFp32) {
      EXPECT_GT(worst_plain, 10.0);
    }
  }
}

TEST(CodecTest, Fp32FeedbackLeavesZeroResidual) {
  const std::vector<float> value = {1.0f, -2.0f, 3.5f};
  std::vector<float> residual = {0.25f, 0.0f, -0.5f};
  std::string out(12, '\0');
  EncodeWithFeedback(Codec::kFp32, value, absl::MakeSpan(residual),
                     absl::MakeSpan(out.data(), out.size()));
  ExpectBitsEqual({1.25f, -2.0f, 3.0f}, DecodeToVector(Codec::kFp32, out, 3));
  ExpectBitsEqual({0.0f, 0.0f, 0.0f}, residual);
}

// Inputs for the kernel variants' corner cases.
enum class KernelInput {
  kRandom,        // many binades
  kSubnormal,     // random sign and mantissa, zero exponent (±0 included)
  kNearMax,       // within 2^21 ulps of ±FLT_MAX: bf16 saturates
  kBf16Ties,      // low 16 bits exactly 0x8000
  kInt8Ties,      // (k + ½) · scale, exact, with a power-of-two scale
  kInt8NearTies,  // a few ulps from (k + ½) · fl(3/127), where x · (1/scale)
                  // and x / scale round to different integers
  kNonFinite,     // NaN and ±Inf among random values
};

std::vector<float> MakeKernelInput(KernelInput kind, size_t n) {
  std::vector<float> v = RandomVector(n, 11 + static_cast<uint32_t>(n));
  std::mt19937 rng(static_cast<uint32_t>(n));
  const auto bits = [&rng] { return static_cast<uint32_t>(rng()); };
  for (size_t i = 0; i < n; ++i) {
    switch (kind) {
      case KernelInput::kRandom:
        break;
      case KernelInput::kSubnormal:
        v[i] = FromBits(bits() & 0x807FFFFFu);
        break;
      case KernelInput::kNearMax:
        v[i] = FromBits((bits() & 0x80000000u) |
                        (0x7F7FFFFFu - bits() % 0x200000u));
        break;
      case KernelInput::kBf16Ties:
        v[i] = FromBits((bits() & 0xBFFF0000u) | 0x8000u);
        break;
      case KernelInput::kInt8Ties:
        // Each 1,024-block starts with its absmax 127 · 2^-5.
        v[i] = i % kInt8BlockElements == 0
                   ? 127.0f / 32.0f
                   : (static_cast<float>(bits() % 254) - 126.5f) / 32.0f;
        break;
      case KernelInput::kInt8NearTies: {
        // Each 1,024-block starts with its absmax 3.
        const float tie =
            (static_cast<float>(bits() % 127) + 0.5f) * (3.0f / 127.0f);
        v[i] = i % kInt8BlockElements == 0
                   ? 3.0f
                   : FromBits(Bits(tie) + bits() % 9 - 4);
        break;
      }
      case KernelInput::kNonFinite:
        if (i % 37 == 5 || i + 1 == n) {
          const float specials[] = {kNaN, kInf, -kInf};
          v[i] = specials[i % 3];
        }
        break;
    }
  }
  return v;
}

std::string BytesOf(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// Every codec entry point on `in`, with the kernels of `isa`: each output's
// bytes, by name.
std::vector<std::pair<std::string, std::string>> RunEveryKernel(
    KernelIsa isa, const std::vector<float>& in) {
  ScopedKernelIsaForTesting pin(isa);
  const size_t n = in.size();
  std::vector<std::pair<std::string, std::string>> out;
  for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    const std::string name(CodecName(codec));
    const std::string payload = EncodeToString(codec, in);
    out.emplace_back(name + " Encode", payload);
    out.emplace_back(name + " Validate",
                     Validate(codec, payload, n).ToString());
    out.emplace_back(name + " Decode",
                     BytesOf(DecodeToVector(codec, payload, n)));
    std::vector<float> acc = RandomVector(n, 5);
    const std::optional<size_t> overflow =
        FirstNonFiniteSum(codec, payload, 3e38f, acc);
    out.emplace_back(name + " FirstNonFiniteSum",
                     overflow ? std::to_string(*overflow) : "none");
    AccumulateDecoded(codec, payload, 0.75f, absl::MakeSpan(acc));
    out.emplace_back(name + " AccumulateDecoded", BytesOf(acc));
    std::vector<float> residual = RandomVector(n, 6);
    for (float& r : residual) r *= 1e-3f;
    std::string feedback(EncodedSize(codec, n), '\0');
    EncodeWithFeedback(codec, in, absl::MakeSpan(residual),
                       absl::MakeSpan(feedback.data(), feedback.size()));
    out.emplace_back(name + " EncodeWithFeedback", feedback);
    out.emplace_back(name + " EncodeWithFeedback residual", BytesOf(residual));
  }
  return out;
}

TEST(CodecTest, FirstNonFiniteSumFindsTheFirstOverflow) {
  // A fast pass says whether any sum overflows; only then is the first one
  // looked for. Overflows at the edges of vectors, blocks and the tail, for
  // every codec and every kernel variant.
  for (KernelIsa isa : SupportedKernelIsas()) {
    ScopedKernelIsaForTesting pin(isa);
    for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
      for (size_t n : {size_t{9}, size_t{1000}, size_t{4097}}) {
        SCOPED_TRACE(absl::StrCat(std::string(KernelIsaName(isa)), " ",
                                  std::string(CodecName(codec)),
                                  " n=", n));
        std::vector<float> x(n, 1.0f);
        std::vector<float> acc(n, 1.0f);
        const std::string finite = EncodeToString(codec, x);
        EXPECT_EQ(FirstNonFiniteSum(codec, finite, 1.5f, acc), std::nullopt);
        for (size_t at : {size_t{0}, size_t{7}, size_t{8}, n / 2, n - 1}) {
          std::vector<float> big = x;
          big[at] = 3e38f;
          if (at + 3 < n) big[at + 3] = -3e38f;  // a later one too
          std::vector<float> near = acc;
          near[at] = 3e38f;
          if (at + 3 < n) near[at + 3] = -3e38f;
          const std::string payload = EncodeToString(codec, big);
          EXPECT_EQ(FirstNonFiniteSum(codec, payload, 1.5f, near), at);
          // The same payload onto a zero accumulator stays finite.
          EXPECT_EQ(FirstNonFiniteSum(codec, payload, 0.5f,
                                      std::vector<float>(n, 0.0f)),
                    std::nullopt);
        }
      }
    }
  }
}

TEST(CodecTest, FirstNonFiniteSumAgreesWithTheSumsNearFloatMax) {
  // The int8 check skips a block whose bounds prove every sum finite (all
  // |acc| and |weight · scale| · 127 below FLT_MAX / 4) and tests the others
  // sum by sum: at magnitudes on both sides of that bound, the answer must
  // be the first index where acc + weight · decode(x), computed in float,
  // is not finite.
  constexpr float kMax = std::numeric_limits<float>::max();
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const size_t n = 1000;
  for (KernelIsa isa : SupportedKernelIsas()) {
    ScopedKernelIsaForTesting pin(isa);
    for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
      for (float acc_scale : {1e30f, 0.2f * kMax, 0.26f * kMax, 0.6f * kMax}) {
        for (float x_scale : {1e30f, 0.1f * kMax, 0.3f * kMax, kMax}) {
          for (float weight : {0.5f, 1.0f, 3.0f}) {
            SCOPED_TRACE(absl::StrCat(std::string(KernelIsaName(isa)), " ",
                                      std::string(CodecName(codec)), " acc ",
                                      acc_scale, " x ", x_scale, " w ",
                                      weight));
            std::vector<float> acc(n), x(n);
            for (size_t i = 0; i < n; ++i) {
              acc[i] = acc_scale * unit(rng);
              x[i] = x_scale * unit(rng);
            }
            const std::string payload = EncodeToString(codec, x);
            std::vector<float> decoded(n);
            Decode(codec, payload, absl::MakeSpan(decoded));
            std::optional<size_t> want;
            for (size_t i = 0; i < n && !want; ++i) {
              float sum = acc[i];
              sum += weight * decoded[i];
              if (!std::isfinite(sum)) want = i;
            }
            EXPECT_EQ(FirstNonFiniteSum(codec, payload, weight, acc), want);
          }
        }
      }
    }
  }
}

TEST(CodecTest, EveryKernelIsaGivesThePortableBits) {
  // Workers and shards on machines with and without AVX2 must agree bit for
  // bit, so every variant of the kernels must give the portable bits.
  const std::vector<KernelIsa> isas = SupportedKernelIsas();
  if (isas.size() < 2) GTEST_SKIP() << "only the portable kernels run here";
  for (size_t n : {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 1023, 1024, 1025,
                   4095, 4097, 9001}) {
    for (KernelInput kind :
         {KernelInput::kRandom, KernelInput::kSubnormal, KernelInput::kNearMax,
          KernelInput::kBf16Ties, KernelInput::kInt8Ties,
          KernelInput::kInt8NearTies, KernelInput::kNonFinite}) {
      SCOPED_TRACE(
          absl::StrCat("n ", n, ", input kind ", static_cast<int>(kind)));
      const std::vector<float> in = MakeKernelInput(kind, n);
      const auto want = RunEveryKernel(KernelIsa::kPortable, in);
      for (KernelIsa isa : isas) {
        const auto got = RunEveryKernel(isa, in);
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < want.size(); ++k) {
          EXPECT_TRUE(got[k].second == want[k].second)
              << KernelIsaName(isa) << " differs from portable in "
              << want[k].first;
        }
      }
    }
  }
}

TEST(CodecTest, ParseCodecAcceptsNamesAndNamesTheBadValue) {
  for (Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    const absl::StatusOr<Codec> parsed = ParseCodec(CodecName(codec));
    CO2_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, codec);
  }
  EXPECT_EQ(CodecName(Codec::kFp32), "fp32");
  EXPECT_EQ(CodecName(Codec::kBf16), "bf16");
  EXPECT_EQ(CodecName(Codec::kInt8), "int8");
  for (const char* bad : {"fp16", "", "FP32", "int4"}) {
    const absl::StatusOr<Codec> parsed = ParseCodec(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("\"" + std::string(bad) + "\""));
  }
}

TEST(CodecTest, CodecFromWireAcceptsOnlyKnownValues) {
  EXPECT_EQ(*CodecFromWire(1), Codec::kFp32);
  EXPECT_EQ(*CodecFromWire(2), Codec::kBf16);
  EXPECT_EQ(*CodecFromWire(3), Codec::kInt8);
  for (int bad : {0, 4, -1, 100}) {
    const absl::StatusOr<Codec> c = CodecFromWire(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr(std::to_string(bad)));
  }
}

TEST(CodecTest, ValidateRunRefusesAnInt8RunWithTooFewScales) {
  const std::string values(100, '\x01');
  const std::string scales(4, '\0');  // block 0's scale only
  // Elements [1000, 1100) reach into block 1.
  const absl::Status s =
      ValidateRun(EncodedRun{Codec::kInt8, values, scales, 1000, 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[1000, 1100) has 4 bytes of scales"),
            std::string::npos)
      << s.message();
  CO2_EXPECT_OK(ValidateRun(
      EncodedRun{Codec::kInt8, values.substr(0, 24), scales, 1000, 24}));
}

}  // namespace
}  // namespace co2::common
