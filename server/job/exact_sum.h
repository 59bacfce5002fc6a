// ExactSum: Σ w·x per element of a shard chunk, kept exactly in fixed point,
// so that the sum of a round's contributions is the same bits whatever
// order they arrive in (docs/algorithm.md, "Order-independent sums").
//
// Each term w·x (an fp32 weight times a decoded fp32 value) is exact in
// double (24 + 24 significant bits). It is rounded once, to the nearest
// multiple of 2^−kExactSumFractionBits, which depends on the term alone, and
// added as an integer: integer addition is associative, so the sum does not
// depend on the order of the terms. The integer is kept as two int64 limbs
// per element, hi and lo, worth hi·2^(52−F) + lo·2^−F (F the fraction bits),
// both made with the double rounding trick (x + 1.5·2^52) so that the loop
// vectorises (common/kernel_isa.h: every variant gives the same bits).
//
// Range (checked, never wrapped): |w·x| < kExactSumMaxTerm = 2^43 per term
// and at most kExactSumMaxTerms terms per element; a term below 2^−61 in
// magnitude rounds to 0 or ±2^−60. Outside the range Add returns
// INVALID_ARGUMENT and changes nothing.
//
// Memory: 16 bytes per element. Not thread-safe; a value type.
#ifndef CO2_SERVER_EXACT_SUM_H_
#define CO2_SERVER_EXACT_SUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/payload_pieces.h"

namespace co2::server {

// F: the sum is exact in units of 2^−F.
inline constexpr int kExactSumFractionBits = 60;
// Every term's magnitude must be below this (2^43 ≈ 8.8e12).
inline constexpr double kExactSumMaxTerm = 8796093022208.0;
// Terms per element: the limbs hold 4,095 terms of up to 2^51 each.
inline constexpr uint32_t kExactSumMaxTerms = 4095;

// One exactly kept sum (the weight sum of a chunk).
class ExactScalar {
 public:
  // Adds `term`; INVALID_ARGUMENT (nothing added) if it is not finite,
  // |term| >= kExactSumMaxTerm, or kExactSumMaxTerms were added already.
  absl::Status Add(double term);
  // The sum, rounded once to double.
  double Value() const;
  uint32_t terms() const { return terms_; }

 private:
  uint64_t hi_ = 0;
  uint64_t lo_ = 0;
  uint32_t terms_ = 0;
};

class ExactSum {
 public:
  explicit ExactSum(size_t elements);  // all zero

  size_t size() const { return size_; }
  uint32_t terms() const { return terms_; }
  // Back to all zero (keeps the memory).
  void Clear() { terms_ = 0; }

  // sum[i] += w · decode(payload)[i]. `payload` must have passed validation
  // for size() elements of `codec`. All or nothing: INVALID_ARGUMENT naming
  // the first element whose term is out of range (see above), or past
  // kExactSumMaxTerms.
  absl::Status Add(common::Codec codec, common::Pieces payload, float w);
  // The same for decoded values (size() of them).
  absl::Status Add(absl::Span<const float> x, float w);

  // out[i] = sum[i] / divisor, rounded to fp32 (via double); divisor > 0.
  void Divide(double divisor, absl::Span<float> out) const;
  // sum[i], rounded once to double.
  double Value(size_t i) const;

 private:
  // Adds (sign 1) or takes back (−1) w·x for elements [first, first + n):
  // the kernel, per KernelIsa. True if every term was in range.
  bool AddRun(const float* x, size_t first, size_t n, float w, int sign);
  // Adds or takes back w·decode(run); true if every term was in range,
  // and then `*bad` is untouched, else the first bad element's index.
  bool AddEncodedRun(const common::EncodedRun& run, float w, int sign,
                     size_t* bad);

  size_t size_;
  // Meaningful once terms_ > 0.
  std::unique_ptr<uint64_t[]> hi_;
  std::unique_ptr<uint64_t[]> lo_;
  uint32_t terms_ = 0;
};

}  // namespace co2::server

#endif  // CO2_SERVER_EXACT_SUM_H_
