#include "common/codec.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

// The wire is little-endian and the fp32/bf16 paths copy host floats as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

namespace co2::common {
namespace {

// Each hot loop is a loop over groups of kLanes elements with a fixed-count
// inner loop, then a scalar tail, in a function whose pointers are
// __restrict__. GCC 12 at -O2 uses the "very cheap" vectoriser cost model,
// which only vectorises loops whose trip count is a known multiple of the
// vector width and that need no runtime alias checks; this shape gives it
// both. (A generic loop helper taking a lambda defeats it: the lambda's
// captured pointers lose __restrict__.) Loop bodies are branch-free; bit
// casts and unaligned payload access use memcpy.
constexpr size_t kLanes = 16;
// "No element" for FirstNonFiniteSum's scan.
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

template <typename To, typename From>
inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

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
  const uint32_t bits = BitCast<uint32_t>(f);
  uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  r -= static_cast<uint32_t>((r & 0x7FFFu) == kBf16ExpMask);
  return static_cast<uint16_t>(r);
}

inline float Bf16ToFloat(uint16_t h) {
  return BitCast<float>(static_cast<uint32_t>(h) << 16);
}

#if defined(__SSE2__)
// FloatToBf16 of eight floats (as bits in a, b). The sum is shifted
// arithmetically: its low 16 bits are the same as with the logical shift and
// it fits int16, so SSE2's signed pack narrows it exactly (GCC 12 narrows
// with six shuffles instead).
inline __m128i EightToBf16(__m128i a, __m128i b) {
  const __m128i bias = _mm_set1_epi32(0x7FFF), one = _mm_set1_epi32(1);
  a = _mm_add_epi32(_mm_add_epi32(a, bias),
                    _mm_and_si128(_mm_srli_epi32(a, 16), one));
  b = _mm_add_epi32(_mm_add_epi32(b, bias),
                    _mm_and_si128(_mm_srli_epi32(b, 16), one));
  const __m128i h =
      _mm_packs_epi32(_mm_srai_epi32(a, 16), _mm_srai_epi32(b, 16));
  const __m128i inf = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)),
                                      _mm_set1_epi16(kBf16ExpMask));
  return _mm_add_epi16(h, inf);  // inf is -1 where rounding reached ±Inf
}
#endif

// lrintf(y) as an int8 for |y| < 127.5, clamped to [-127, 127] when kClamp
// (for |y| < 2^22); see kRoundMagic. (Clamping y as a float first would be
// cheaper, but then GCC 12 stops vectorising the loop.)
template <bool kClamp>
inline int8_t QuantizeInt8(float y) {
  int32_t q = BitCast<int32_t>(y + kRoundMagic) - kRoundMagicBits;
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

// An int8 payload is [NumInt8Blocks fp32 scales][elements int8 values].
size_t Int8ValuesOffset(size_t elements) {
  return NumInt8Blocks(elements) * sizeof(float);
}

// q[i] = QuantizeInt8(in[i] / scale) for i in [0, count).
template <bool kClamp>
void QuantizeBlock(const float* __restrict__ in, size_t count, float scale,
                   int8_t* __restrict__ q) {
  size_t i = 0;
#if defined(__SSE2__)
  // Without the clamp every value is in [-127, 127], so SSE2's signed packs
  // narrow it exactly (GCC 12 narrows with a long series of shuffles).
  if constexpr (!kClamp) {
    const __m128 s = _mm_set1_ps(scale), magic = _mm_set1_ps(kRoundMagic);
    const __m128i magic_bits = _mm_set1_epi32(kRoundMagicBits);
    const auto quantize = [&](size_t k) {
      const __m128 y = _mm_add_ps(_mm_div_ps(_mm_loadu_ps(in + k), s), magic);
      return _mm_sub_epi32(_mm_castps_si128(y), magic_bits);
    };
    for (; i + kLanes <= count; i += kLanes) {
      const __m128i lo = _mm_packs_epi32(quantize(i), quantize(i + 4));
      const __m128i hi = _mm_packs_epi32(quantize(i + 8), quantize(i + 12));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                       _mm_packs_epi16(lo, hi));
    }
  }
#endif
  for (; i + kLanes <= count; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      q[i + j] = QuantizeInt8<kClamp>(in[i + j] / scale);
    }
  }
  for (; i < count; ++i) q[i] = QuantizeInt8<kClamp>(in[i] / scale);
}

// Encodes one int8 block in[0, count): scale = absmax / 127 (capped at
// kMaxInt8Scale) to `scale_out`, the quantised values to q. Returns the scale.
float EncodeInt8Block(const float* __restrict__ in, size_t count,
                      char* __restrict__ scale_out, int8_t* __restrict__ q) {
  // absmax on the bit patterns: for non-negative non-NaN floats the integer
  // order is the float order, and a signed int32 max vectorises (SSE2 has no
  // unsigned one); a NaN input (a diverged worker) gives a NaN scale, which
  // the receiver rejects. Four registers of lanes, as GCC vector types so
  // that they stay in registers (see CheckFinite).
  typedef int32_t Lanes __attribute__((vector_size(16)));
  constexpr size_t kPerVector = sizeof(Lanes) / sizeof(int32_t);
  const auto abs_bits = [in](size_t i) {
    Lanes v;
    std::memcpy(&v, in + i, sizeof v);
    return v & kAbsMask;
  };
  const auto max = [](Lanes a, Lanes b) { return a > b ? a : b; };
  Lanes max0 = {}, max1 = {}, max2 = {}, max3 = {};
  size_t i = 0;
  for (; i + 4 * kPerVector <= count; i += 4 * kPerVector) {
    max0 = max(max0, abs_bits(i));
    max1 = max(max1, abs_bits(i + kPerVector));
    max2 = max(max2, abs_bits(i + 2 * kPerVector));
    max3 = max(max3, abs_bits(i + 3 * kPerVector));
  }
  int32_t m = 0;
  for (; i < count; ++i) {
    const int32_t a = BitCast<int32_t>(in[i]) & kAbsMask;
    m = m > a ? m : a;
  }
  const Lanes lanes = max(max(max0, max1), max(max2, max3));
  for (size_t j = 0; j < kPerVector; ++j) m = m > lanes[j] ? m : lanes[j];
  const float scale = std::min(BitCast<float>(m) / 127.0f, kMaxInt8Scale);
  std::memcpy(scale_out, &scale, sizeof scale);
  if (!(scale > 0.0f)) {  // All zeros, or too small to have a scale.
    std::memset(q, 0, count);
  } else if (scale >= std::numeric_limits<float>::min() &&
             scale < kMaxInt8Scale) {
    // |x| <= absmax and scale >= (absmax / 127)(1 - 2^-24) bound |x / scale|
    // below 127.0001, which rounds to at most 127: no clamp needed.
    QuantizeBlock<false>(in, count, scale, q);
  } else {
    // A capped or subnormal scale can be well below absmax / 127.
    QuantizeBlock<true>(in, count, scale, q);
  }
  return scale;
}

// The element codecs: Word is uint32_t for fp32, uint16_t for bf16.
inline uint32_t ToWord(float f, uint32_t) { return BitCast<uint32_t>(f); }
inline uint16_t ToWord(float f, uint16_t) { return FloatToBf16(f); }
inline float FromWord(uint32_t w) { return BitCast<float>(w); }
inline float FromWord(uint16_t w) { return Bf16ToFloat(w); }

// Encodes v = value (+ residual, with kFeedback) in one pass; with kFeedback
// the residual keeps v − decode(encoded v), which is 0 for fp32.
template <typename Word, bool kFeedback>
void EncodeWords(const float* __restrict__ value, float* __restrict__ residual,
                 char* __restrict__ out, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<Word, uint16_t>) {
    for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 2
      for (size_t k = i; k < i + kLanes; k += 8) {
        __m128 v0 = _mm_loadu_ps(value + k), v1 = _mm_loadu_ps(value + k + 4);
        if (kFeedback) {
          v0 = _mm_add_ps(v0, _mm_loadu_ps(residual + k));
          v1 = _mm_add_ps(v1, _mm_loadu_ps(residual + k + 4));
        }
        const __m128i h =
            EightToBf16(_mm_castps_si128(v0), _mm_castps_si128(v1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * k), h);
        if (kFeedback) {  // v − Bf16ToFloat(h)
          const __m128i zero = _mm_setzero_si128();
          _mm_storeu_ps(
              residual + k,
              _mm_sub_ps(v0, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, h))));
          _mm_storeu_ps(
              residual + k + 4,
              _mm_sub_ps(v1, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, h))));
        }
      }
    }
  }
#endif
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = i; k < i + kLanes; ++k) {
      const float v = kFeedback ? value[k] + residual[k] : value[k];
      const Word w = ToWord(v, Word{});
      std::memcpy(out + sizeof w * k, &w, sizeof w);
      if (kFeedback) residual[k] = v - FromWord(w);
    }
  }
  for (size_t k = i; k < n; ++k) {
    const float v = kFeedback ? value[k] + residual[k] : value[k];
    const Word w = ToWord(v, Word{});
    std::memcpy(out + sizeof w * k, &w, sizeof w);
    if (kFeedback) residual[k] = v - FromWord(w);
  }
}

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

template <typename Word, typename Op>
void DecodeWords(const char* __restrict__ p, Op op, float* __restrict__ out,
                 size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = i; k < i + kLanes; ++k) {
      op(out[k], FromWord(Load<Word>(p + sizeof(Word) * k)));
    }
  }
  for (size_t k = i; k < n; ++k) {
    op(out[k], FromWord(Load<Word>(p + sizeof(Word) * k)));
  }
}

template <typename Op>
void DecodeInt8Block(float scale, const int8_t* __restrict__ q, Op op,
                     float* __restrict__ out, size_t count) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      op(out[i + j], DequantizeInt8(q[i + j], scale));
    }
  }
  for (; i < count; ++i) op(out[i], DequantizeInt8(q[i], scale));
}

template <typename Op>
void DecodeInt8(const char* p, Op op, float* out, size_t n) {
  const int8_t* values =
      reinterpret_cast<const int8_t*>(p + Int8ValuesOffset(n));
  for (size_t b = 0; b < NumInt8Blocks(n); ++b) {
    const size_t begin = b * kInt8BlockElements;
    const size_t count = std::min(kInt8BlockElements, n - begin);
    DecodeInt8Block(Load<float>(p + b * sizeof(float)), values + begin, op,
                    out + begin, count);
  }
}

template <typename Op>
void DecodeWith(Codec codec, std::string_view bytes, Op op,
                absl::Span<float> out) {
  assert(bytes.size() == EncodedSize(codec, out.size()));
  switch (codec) {
    case Codec::kFp32:
      return DecodeWords<uint32_t>(bytes.data(), op, out.data(), out.size());
    case Codec::kBf16:
      return DecodeWords<uint16_t>(bytes.data(), op, out.data(), out.size());
    case Codec::kInt8:
      return DecodeInt8(bytes.data(), op, out.data(), out.size());
  }
  assert(false && "unknown codec");
}

// v[i] = x[i] + v[i].
void AddInto(const float* __restrict__ x, float* __restrict__ v, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) v[i + j] = x[i + j] + v[i + j];
  }
  for (; i < n; ++i) v[i] = x[i] + v[i];
}

// Encodes value[0, n) block by block. With error feedback (residual not
// null), each block of residual first becomes v = value + residual, is
// encoded from there while in cache, and then keeps v − decode(block),
// computed by the same DequantizeInt8 that Decode uses.
void EncodeInt8(const float* value, float* residual, size_t n, char* out) {
  int8_t* values = reinterpret_cast<int8_t*>(out + Int8ValuesOffset(n));
  const auto subtract = [](float& dst, float x) { dst -= x; };
  for (size_t b = 0; b < NumInt8Blocks(n); ++b) {
    const size_t begin = b * kInt8BlockElements;
    const size_t count = std::min(kInt8BlockElements, n - begin);
    const float* v = value + begin;
    if (residual != nullptr) {
      AddInto(v, residual + begin, count);
      v = residual + begin;
    }
    const float scale =
        EncodeInt8Block(v, count, out + b * sizeof(float), values + begin);
    if (residual != nullptr) {
      DecodeInt8Block(scale, values + begin, subtract, residual + begin, count);
    }
  }
}

std::string FormatFloat(float f) {
  if (std::isnan(f)) {
    return absl::StrFormat("nan (bits 0x%08x)", BitCast<uint32_t>(f));
  }
  if (std::isinf(f)) return f > 0 ? "+inf" : "-inf";
  return absl::StrCat(f);
}

// OK if no element of p[0, n) has all exponent bits set (Inf or NaN), else
// INVALID_ARGUMENT naming the first. Word is uint32_t (fp32) or uint16_t
// (bf16). Adding the exponent's lowest bit to the masked exponent carries into
// the sign bit exactly when the exponent is all ones, so a window is scanned
// by OR-ing branch-free terms and the element is located only on a hit.
template <typename Word>
absl::Status CheckFinite(std::string_view codec_name, const char* p, size_t n) {
  static constexpr Word kExp =
      static_cast<Word>(0x7F800000u >> (32 - 8 * sizeof(Word)));
  static constexpr Word kCarry = kExp & static_cast<Word>(~kExp + 1);
  static constexpr Word kTop = static_cast<Word>(kExp + kCarry);
  const auto flag = [p](size_t i) {
    return static_cast<Word>((Load<Word>(p + sizeof(Word) * i) & kExp) +
                             kCarry);
  };
  // Four registers of lanes per step, as GCC vector types (SSE2 on x86-64,
  // NEON on AArch64) so that they stay in registers; one register per step
  // would be bound by the loop's own overhead.
  typedef Word Lanes __attribute__((vector_size(16)));
  constexpr size_t kPerVector = sizeof(Lanes) / sizeof(Word);
  constexpr size_t kStep = 4 * kPerVector;
  const auto flags = [p](size_t i) {
    Lanes v;
    std::memcpy(&v, p + sizeof(Word) * i, sizeof v);
    return (v & kExp) + kCarry;
  };
  constexpr size_t kWindow = 4096;
  for (size_t begin = 0; begin < n; begin += kWindow) {
    const size_t end = std::min(n, begin + kWindow);
    Lanes any0 = {}, any1 = {}, any2 = {}, any3 = {};
    size_t i = begin;
    for (; i + kStep <= end; i += kStep) {
      any0 |= flags(i);
      any1 |= flags(i + kPerVector);
      any2 |= flags(i + 2 * kPerVector);
      any3 |= flags(i + 3 * kPerVector);
    }
    Word all = 0;
    for (; i < end; ++i) all |= flag(i);
    const Lanes any = (any0 | any1) | (any2 | any3);
    for (size_t j = 0; j < kPerVector; ++j) all |= any[j];
    if ((all & kTop) == 0) continue;
    for (i = begin; (flag(i) & kTop) == 0; ++i) {
    }
    const float bad = FromWord(Load<Word>(p + sizeof(Word) * i));
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(codec_name), " payload element ", i,
                     " is not finite: ", FormatFloat(bad)));
  }
  return absl::OkStatus();
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
      return EncodeWords<uint16_t, false>(in.data(), nullptr, out.data(), n);
    case Codec::kInt8:
      return EncodeInt8(in.data(), nullptr, n, out.data());
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
  const std::string_view name = CodecName(codec);
  const size_t want = EncodedSize(codec, elements);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(name), " payload for ", elements,
                     " elements must be ", want, " bytes, got ", bytes.size()));
  }
  switch (codec) {
    case Codec::kFp32:
      return CheckFinite<uint32_t>(name, bytes.data(), elements);
    case Codec::kBf16:
      return CheckFinite<uint16_t>(name, bytes.data(), elements);
    case Codec::kInt8:
      // Any int8 value times a scale in [0, kMaxInt8Scale] is finite.
      for (size_t b = 0; b < NumInt8Blocks(elements); ++b) {
        const float scale = Load<float>(bytes.data() + b * sizeof(float));
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

void Decode(Codec codec, std::string_view bytes, absl::Span<float> out) {
  DecodeWith(codec, bytes, Store{}, out);
}

void AccumulateDecoded(Codec codec, std::string_view bytes, float weight,
                       absl::Span<float> acc) {
  DecodeWith(codec, bytes, Axpy{weight}, acc);
}

std::optional<size_t> FirstNonFiniteSum(Codec codec, std::string_view bytes,
                                        float weight,
                                        absl::Span<const float> acc) {
  // Computes each sum as Axpy does, without storing it. DecodeWith hands out
  // the accumulator element by reference; this op only reads it.
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
  DecodeWith(codec, bytes, Check{weight, acc.data(), &first},
             absl::MakeSpan(const_cast<float*>(acc.data()), acc.size()));
  if (first == kNone) return std::nullopt;
  return first;
}

void EncodeWithFeedback(Codec codec, absl::Span<const float> value,
                        absl::Span<float> residual, absl::Span<char> out) {
  assert(residual.size() == value.size());
  assert(out.size() >= EncodedSize(codec, value.size()));
  const size_t n = value.size();
  switch (codec) {
    case Codec::kFp32:
      return EncodeWords<uint32_t, true>(value.data(), residual.data(),
                                         out.data(), n);
    case Codec::kBf16:
      return EncodeWords<uint16_t, true>(value.data(), residual.data(),
                                         out.data(), n);
    case Codec::kInt8:
      return EncodeInt8(value.data(), residual.data(), n, out.data());
  }
  assert(false && "unknown codec");
}

}  // namespace co2::common
