// ExactSum: Σ w·x per element of a shard chunk, kept exactly, so that the
// sum of a round's contributions is the same bits whatever order they arrive
// in (docs/algorithm.md, "Order-independent sums").
//
// Each term w·x (an fp32 weight times a decoded fp32 value) is exact in
// double (24 + 24 significant bits). An element's sum is a double for as
// long as every partial sum is one exactly: each addition is checked with
// the error-free TwoSum, in the vector kernel, at 8 bytes per element. An
// element whose sum stops fitting a double (terms over more than about 29
// binades, or with long mantissas that do not cancel) moves to an
// ExactScalar, a fixed-point integer wide enough for every sum of such
// terms, kept in a side table. Either way the value is the exact sum, so
// Value(i) and Mean, which round it once to double, do not depend on the
// order of the terms or on which elements moved (common/kernel_isa.h: every
// kernel variant gives the same bits).
//
// Range: any finite fp32 weight and values; a term that is not finite is
// refused (INVALID_ARGUMENT, nothing added). Memory: 8 bytes per element,
// plus 96 bytes per element that moved. Not thread-safe; a value type.
#ifndef CO2_SERVER_JOB_EXACT_SUM_H_
#define CO2_SERVER_JOB_EXACT_SUM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/payload_pieces.h"

namespace co2::server {

// ExactScalar keeps bits from 2^kExactLowExponent up ...
inline constexpr int kExactLowExponent = -300;
// ... and takes terms below 2^kExactHighExponent in magnitude; with fewer
// than 2^50 terms the sum cannot overflow.
inline constexpr int kExactHighExponent = 288;

// One exactly kept sum of doubles: a two's complement integer in units of
// 2^kExactLowExponent. Every product of two fp32 values, and every sum of
// such products, is in range.
class ExactScalar {
 public:
  // Adds `term`; INVALID_ARGUMENT (nothing added) if it is not finite, its
  // magnitude is 2^kExactHighExponent or more, or it has bits below
  // 2^kExactLowExponent.
  absl::Status Add(double term);
  // The sum, rounded once to double (to nearest, ties to even).
  double Value() const;
  uint64_t terms() const { return terms_; }

 private:
  friend class ExactSum;
  static constexpr int kLimbs = 10;  // 640 bits

  // Add, without the checks.
  void AddInRange(double term);

  std::array<uint64_t, kLimbs> limbs_{};  // least significant first
  uint64_t terms_ = 0;
};

class ExactSum {
 public:
  explicit ExactSum(size_t elements);  // all zero

  size_t size() const { return size_; }
  uint64_t terms() const { return terms_; }
  // Back to all zero (keeps the memory).
  void Clear();

  // sum[i] += w · decode(payload)[i]. `payload` must have passed validation
  // for size() elements of `codec`. All or nothing: INVALID_ARGUMENT naming
  // the first element whose term is not finite.
  absl::Status Add(common::Codec codec, common::Pieces payload, float w);
  // The same for decoded values (size() of them).
  absl::Status Add(absl::Span<const float> x, float w);

  // sum[i] / divisor, rounded to fp32 (via double), for every i; divisor
  // > 0.
  std::vector<float> Mean(double divisor) const;
  // sum[i], rounded once to double.
  double Value(size_t i) const;
  // How many elements' sums did not fit a double (kept in the side table).
  size_t wide_elements() const { return wide_.size(); }

 private:
  // sum += w·x over elements [first, first + n), x being n decoded values,
  // stored instead of added while terms_ == 0. Returns the first element
  // (from `first`) whose term is not finite, or n; such an element is left
  // as it was, every other one added.
  size_t AddRun(const float* x, size_t first, size_t n, float w);
  // AddRun over a run of the payload, block by block; the first element
  // whose term is not finite, or run.first + run.count.
  size_t AddEncodedRun(const common::EncodedRun& run, float w);

  size_t size_;
  // Meaningful once terms_ > 0: the sum of element i, or NaN if that sum is
  // wide_[i].
  std::unique_ptr<double[]> sum_;
  absl::flat_hash_map<size_t, ExactScalar> wide_;
  uint64_t terms_ = 0;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_EXACT_SUM_H_
