#include "common/codec.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/kernel_isa.h"

// The wire is little-endian and the fp32/bf16 paths copy host floats as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

namespace co2::common {
namespace {

// Elements per group of the kernels' loops (codec_kernels.inc).
constexpr size_t kLanes = 16;
// "No element" for the non-finite scans.
constexpr size_t kNone = std::numeric_limits<size_t>::max();

constexpr int32_t kAbsMask = 0x7FFFFFFF;
constexpr uint16_t kBf16ExpMask = 0x7F80;
// Largest int8 scale for which every int8 value, -128 included, decodes to a
// finite float: FLT_MAX / 128 (exact: a power-of-two division).
constexpr float kMaxInt8Scale = std::numeric_limits<float>::max() / 128.0f;
// 1.5 * 2^23. For |y| < 2^22, y + kRoundMagic lies in [2^23, 2^24) where the
// float spacing is 1, so the addition rounds y to an integer, ties to even as
// lrintf does, and the sum's bits are kRoundMagicBits + round(y). Unlike
// lrintf it vectorises, with no libm call. Needs IEEE math (no -ffast-math).
constexpr float kRoundMagic = 12582912.0f;
constexpr int32_t kRoundMagicBits = 0x4B400000;

template <typename T>
inline T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// This Abseil build has its own string_view type; StrCat needs it.
inline absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Round-to-nearest-even truncation to the upper 16 bits. A finite input that
// rounds up past the largest finite bf16 would carry into the exponent and
// become ±Inf, which Validate rejects; it saturates to ±max bf16 instead, so
// every finite input encodes to a valid payload.
inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = absl::bit_cast<uint32_t>(f);
  uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  r -= static_cast<uint32_t>((r & 0x7FFFu) == kBf16ExpMask);
  return static_cast<uint16_t>(r);
}

inline float Bf16ToFloat(uint16_t h) {
  return absl::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// lrintf(y) as an int8 for |y| < 127.5, clamped to [-127, 127] when kClamp
// (for |y| < 2^22); see kRoundMagic. (Clamping y as a float first would be
// cheaper, but then GCC 12 stops vectorising the loop.)
template <bool kClamp>
inline int8_t QuantizeInt8(float y) {
  int32_t q = absl::bit_cast<int32_t>(y + kRoundMagic) - kRoundMagicBits;
  if (kClamp) {
    q = q < -127 ? -127 : q;
    q = q > 127 ? 127 : q;
  }
  return static_cast<int8_t>(q);
}

inline float DequantizeInt8(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

size_t NumInt8Blocks(size_t elements) {
  return (elements + kInt8BlockElements - 1) / kInt8BlockElements;
}

// The element codecs: Word is uint32_t for fp32, uint16_t for bf16.
inline uint32_t ToWord(float f, uint32_t) {
  return absl::bit_cast<uint32_t>(f);
}
inline uint16_t ToWord(float f, uint16_t) { return FloatToBf16(f); }
inline float FromWord(uint32_t w) { return absl::bit_cast<float>(w); }
inline float FromWord(uint16_t w) { return Bf16ToFloat(w); }

// The decode loops apply op(out[i], decode(i)), where Op stores (Decode) or
// adds weight * decode(i) (AccumulateDecoded). Sharing the loops makes both
// compute decode(i) with the same operations, hence the same bits.
struct Store {
  void operator()(float& dst, float x) const { dst = x; }
};
struct Axpy {
  float weight;
  void operator()(float& dst, float x) const { dst += weight * x; }
};
// Error feedback: residual −= decode(i).
struct Subtract {
  void operator()(float& dst, float x) const { dst -= x; }
};
// The overflow check's fast pass: ORs into `flags` a term whose top bit is
// set when dst + weight · x, computed as Axpy computes it, is Inf or NaN
// (the exponent test of FindNonFinite), and stores nothing else: the loops
// vectorise it, where a test that records the first index per element does
// not (a tenth of memcpy's rate). `flags` is a uint32_t, so it cannot alias
// the floats.
struct SumFlags {
  float weight;
  uint32_t& flags;
  void operator()(float& dst, float x) const {
    float sum = dst;
    sum += weight * x;
    flags |= (absl::bit_cast<uint32_t>(sum) & 0x7F800000u) + 0x00800000u;
  }
};

std::string FormatFloat(float f) {
  if (std::isnan(f)) {
    return absl::StrFormat("nan (bits 0x%08x)", absl::bit_cast<uint32_t>(f));
  }
  if (std::isinf(f)) return f > 0 ? "+inf" : "-inf";
  return absl::StrCat(f);
}

// The kernels, once per KernelIsa (see codec_kernels.inc).
#define CO2_KERNELS_FILE "common/codec_kernels.inc"
#include "common/per_isa_kernels.inc"
#undef CO2_KERNELS_FILE

template <typename Op>
void DecodeWith(const EncodedRun& run, Op op, absl::Span<float> out) {
  assert(out.size() == run.count);
  assert(run.codec == Codec::kInt8
             ? run.bytes.size() == run.count &&
                   run.int8_scales.size() >=
                       NumInt8Blocks(run.first + run.count) * sizeof(float)
             : run.bytes.size() == EncodedSize(run.codec, run.count));
  const char* p = run.bytes.data();
  WithKernels([&](auto kernels) {
    using K = decltype(kernels);
    switch (run.codec) {
      case Codec::kFp32:
        return K::template Decode<uint32_t>(p, op, out.data(), out.size());
      case Codec::kBf16:
        return K::template Decode<uint16_t>(p, op, out.data(), out.size());
      case Codec::kInt8:
        return K::DecodeInt8(run.int8_scales.data(), p, run.first, op,
                             out.data(), out.size());
    }
    assert(false && "unknown codec");
  });
}

// OK if no element of p[0, n) is Inf or NaN, else INVALID_ARGUMENT naming the
// first by its index in the payload (p holds elements from `first`). Word is
// uint32_t (fp32) or uint16_t (bf16).
template <typename Word>
absl::Status CheckFinite(std::string_view codec_name, const char* p,
                         size_t first, size_t n) {
  const size_t i = WithKernels([&](auto kernels) {
    return decltype(kernels)::template FirstNonFinite<Word>(p, n);
  });
  if (i == kNone) return absl::OkStatus();
  const float bad = FromWord(Load<Word>(p + sizeof(Word) * i));
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(codec_name), " payload element ", first + i,
                   " is not finite: ", FormatFloat(bad)));
}

}  // namespace

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kFp32:
      return "fp32";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::StatusOr<Codec> ParseCodec(std::string_view name) {
  for (Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8}) {
    if (name == CodecName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec \"", ToAbsl(name), "\"; expected fp32, bf16 or int8"));
}

absl::StatusOr<Codec> CodecFromWire(int value) {
  switch (value) {
    case static_cast<int>(Codec::kFp32):
    case static_cast<int>(Codec::kBf16):
    case static_cast<int>(Codec::kInt8):
      return static_cast<Codec>(value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec wire value ", value,
                   "; expected 1 (fp32), 2 (bf16) or 3 (int8)"));
}

size_t EncodedSize(Codec codec, size_t elements) {
  switch (codec) {
    case Codec::kFp32:
      return elements * sizeof(float);
    case Codec::kBf16:
      return elements * sizeof(uint16_t);
    case Codec::kInt8:
      return Int8ValuesOffset(elements) + elements;
  }
  return 0;
}

void Encode(Codec codec, absl::Span<const float> in, absl::Span<char> out) {
  assert(out.size() >= EncodedSize(codec, in.size()));
  const size_t n = in.size();
  switch (codec) {
    case Codec::kFp32:
      if (n > 0) std::memcpy(out.data(), in.data(), n * sizeof(float));
      return;
    case Codec::kBf16:
      return WithKernels([&](auto kernels) {
        decltype(kernels)::template Encode<uint16_t, false>(in.data(), nullptr,
                                                            out.data(), n);
      });
    case Codec::kInt8:
      return WithKernels([&](auto kernels) {
        decltype(kernels)::EncodeInt8(in.data(), nullptr, n, out.data());
      });
  }
  assert(false && "unknown codec");
}

absl::Status Validate(Codec codec, std::string_view bytes, size_t elements) {
  if (CodecName(codec) == "unknown") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown codec ", static_cast<int>(codec)));
  }
  // A hostile element count must not overflow EncodedSize.
  if (elements > std::numeric_limits<size_t>::max() / sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count ", elements, " is too large"));
  }
  const size_t want = EncodedSize(codec, elements);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(CodecName(codec)), " payload for ", elements,
                     " elements must be ", want, " bytes, got ", bytes.size()));
  }
  return ValidateRun(WholeRun(codec, bytes, elements));
}

absl::Status ValidateRun(const EncodedRun& run) {
  const std::string_view name = CodecName(run.codec);
  switch (run.codec) {
    case Codec::kFp32:
      return CheckFinite<uint32_t>(name, run.bytes.data(), run.first,
                                   run.count);
    case Codec::kBf16:
      return CheckFinite<uint16_t>(name, run.bytes.data(), run.first,
                                   run.count);
    case Codec::kInt8:
      // Any int8 value times a scale in [0, kMaxInt8Scale] is finite.
      if (run.count == 0) break;
      if (run.int8_scales.size() <
          NumInt8Blocks(run.first + run.count) * sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "int8 run of elements [", run.first, ", ", run.first + run.count,
            ") has ", run.int8_scales.size(), " bytes of scales"));
      }
      for (size_t b = run.first / kInt8BlockElements;
           b <= (run.first + run.count - 1) / kInt8BlockElements; ++b) {
        const float scale =
            Load<float>(run.int8_scales.data() + b * sizeof(float));
        if (!(scale >= 0.0f && scale <= kMaxInt8Scale)) {
          return absl::InvalidArgumentError(
              absl::StrCat("int8 scale of block ", b, " (elements from ",
                           b * kInt8BlockElements, ") is ", FormatFloat(scale),
                           "; must be finite, >= 0 and <= ", kMaxInt8Scale));
        }
      }
      break;
  }
  return absl::OkStatus();
}

size_t Int8ValuesOffset(size_t elements) {
  return NumInt8Blocks(elements) * sizeof(float);
}

EncodedRun WholeRun(Codec codec, std::string_view bytes, size_t elements) {
  if (codec != Codec::kInt8) return EncodedRun{codec, bytes, {}, 0, elements};
  const size_t offset = std::min(Int8ValuesOffset(elements), bytes.size());
  return EncodedRun{codec, bytes.substr(offset), bytes.substr(0, offset), 0,
                    elements};
}

void Decode(Codec codec, std::string_view bytes, absl::Span<float> out) {
  DecodeWith(WholeRun(codec, bytes, out.size()), Store{}, out);
}

void Decode(const EncodedRun& run, absl::Span<float> out) {
  DecodeWith(run, Store{}, out);
}

void AccumulateDecoded(Codec codec, std::string_view bytes, float weight,
                       absl::Span<float> acc) {
  AccumulateDecoded(WholeRun(codec, bytes, acc.size()), weight, acc);
}

void AccumulateDecoded(const EncodedRun& run, float weight,
                       absl::Span<float> acc) {
  DecodeWith(run, Axpy{weight}, acc);
}

std::optional<size_t> FirstNonFiniteSum(Codec codec, std::string_view bytes,
                                        float weight,
                                        absl::Span<const float> acc) {
  return FirstNonFiniteSum(WholeRun(codec, bytes, acc.size()), weight, acc);
}

std::optional<size_t> FirstNonFiniteSum(const EncodedRun& run, float weight,
                                        absl::Span<const float> acc) {
  // DecodeWith hands out the accumulator element by reference; these ops
  // only read it. A vectorised pass says whether any sum overflows, and
  // only then does an element-by-element pass find the first.
  const absl::Span<float> readable(const_cast<float*>(acc.data()), acc.size());
  uint32_t flags = 0;
  DecodeWith(run, SumFlags{weight, flags}, readable);
  if ((flags & 0x80000000u) == 0) return std::nullopt;
  struct Check {
    float weight;
    const float* base;
    size_t* first;
    void operator()(float& dst, float x) const {
      float sum = dst;
      sum += weight * x;
      if (!std::isfinite(sum) && *first == kNone) {
        *first = static_cast<size_t>(&dst - base);
      }
    }
  };
  size_t first = kNone;
  DecodeWith(run, Check{weight, acc.data(), &first}, readable);
  if (first == kNone) return std::nullopt;
  return first;
}

void EncodeWithFeedback(Codec codec, absl::Span<const float> value,
                        absl::Span<float> residual, absl::Span<char> out) {
  assert(residual.size() == value.size());
  assert(out.size() >= EncodedSize(codec, value.size()));
  const size_t n = value.size();
  WithKernels([&](auto kernels) {
    using K = decltype(kernels);
    switch (codec) {
      case Codec::kFp32:
        return K::template Encode<uint32_t, true>(value.data(), residual.data(),
                                                  out.data(), n);
      case Codec::kBf16:
        return K::template Encode<uint16_t, true>(value.data(), residual.data(),
                                                  out.data(), n);
      case Codec::kInt8:
        return K::EncodeInt8(value.data(), residual.data(), n, out.data());
    }
    assert(false && "unknown codec");
  });
}

}  // namespace co2::common
