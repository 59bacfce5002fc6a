#include "server/job/exact_sum.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "common/kernel_isa.h"

namespace co2::server {
namespace {

// w·x for the value at x[i] (little-endian fp32, perhaps unaligned): exact
// in double.
inline double Term(const char* x, size_t i, double w) {
  float xi;
  std::memcpy(&xi, x + i * sizeof(float), sizeof xi);
  return static_cast<double>(xi) * w;
}

// Whether sum + term is exactly a double (both finite, `sum` not NaN). The
// sum s = fl(sum + term) is exact iff s − sum and s − term give back term
// and sum: whichever operand is the larger, its difference from s is exact
// (as in FastTwoSum), so it is term or sum only if s is. Infinities and NaN
// fail one of the two.
inline bool AddIsExact(double term, double sum) {
  const double s = sum + term;
  return s - sum == term && s - term == sum;
}

// The kernels, once per KernelIsa.
#define CO2_KERNELS_FILE "server/job/exact_sum_kernels.inc"
#include "common/per_isa_kernels.inc"
#undef CO2_KERNELS_FILE

// Decoded values are taken in blocks of this many, in a buffer that stays
// in L1 (fp32 payloads are read in place).
constexpr size_t kBlock = 1024;

constexpr uint64_t kMantissaMask = (uint64_t{1} << 52) - 1;

}  // namespace

absl::Status ExactScalar::Add(double term) {
  // In units of 2^kExactLowExponent the term must be a whole number: the
  // scaling by a power of two is exact below 2^kExactHighExponent.
  const double units = std::ldexp(term, -kExactLowExponent);
  const bool in_range = std::isfinite(term) &&
                        std::abs(term) < std::ldexp(1.0, kExactHighExponent) &&
                        std::trunc(units) == units;
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(
        term, " is outside the exact sum's range (finite, magnitude below 2^",
        kExactHighExponent, ", no bits below 2^", kExactLowExponent, ")"));
  }
  AddInRange(term);
  return absl::OkStatus();
}

// The term is m·2^(E − 1075) (E its biased exponent, m its 53-bit
// significand), added as an integer in units of 2^kExactLowExponent: m
// shifted into place spans two limbs; the carry or borrow runs up from there.
void ExactScalar::AddInRange(double term) {
  ++terms_;
  if (term == 0) return;
  const uint64_t bits = absl::bit_cast<uint64_t>(term);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  uint64_t m = bits & kMantissaMask;
  if (biased != 0) m |= uint64_t{1} << 52;
  int shift = std::max(biased, 1) - 1075 - kExactLowExponent;
  if (shift < 0) {
    m >>= -shift;  // only zeros go: the term is in range
    shift = 0;
  }
  const unsigned __int128 placed = static_cast<unsigned __int128>(m)
                                   << (shift % 64);
  uint64_t part[2] = {static_cast<uint64_t>(placed),
                      static_cast<uint64_t>(placed >> 64)};
  size_t k = static_cast<size_t>(shift / 64);
  const bool negative = bits >> 63;
  uint64_t carry = 0;
  for (size_t j = 0; k < kLimbs; ++j, ++k) {
    const uint64_t p = j < 2 ? part[j] : 0;
    if (j >= 2 && carry == 0) break;
    const uint64_t before = limbs_[k];
    if (!negative) {
      const uint64_t sum = before + p;
      limbs_[k] = sum + carry;
      carry = (sum < before) + (limbs_[k] < sum);
    } else {
      const uint64_t difference = before - p;
      limbs_[k] = difference - carry;
      carry = (difference > before) + (limbs_[k] > difference);
    }
  }
}

// The magnitude's top two nonzero limbs as a 128-bit integer of at least 65
// bits, with a 1 in its last bit if any lower limb is nonzero: its
// conversion to double rounds as the whole magnitude's would.
double ExactScalar::Value() const {
  std::array<uint64_t, kLimbs> magnitude = limbs_;
  const bool negative = magnitude[kLimbs - 1] >> 63;
  if (negative) {
    uint64_t carry = 1;
    for (uint64_t& limb : magnitude) {
      limb = ~limb + carry;
      carry = carry && limb == 0;
    }
  }
  int top = kLimbs - 1;
  while (top >= 0 && magnitude[top] == 0) --top;
  if (top < 0) return 0.0;
  double value;
  if (top == 0) {
    value = std::ldexp(static_cast<double>(magnitude[0]), kExactLowExponent);
  } else {
    unsigned __int128 head =
        (static_cast<unsigned __int128>(magnitude[top]) << 64) |
        magnitude[top - 1];
    for (int k = 0; k < top - 1; ++k) head |= magnitude[k] != 0;
    value = std::ldexp(static_cast<double>(head),
                       kExactLowExponent + 64 * (top - 1));
  }
  return negative ? -value : value;
}

ExactSum::ExactSum(size_t elements)
    : size_(elements), sum_(new double[elements]) {}

void ExactSum::Clear() {
  terms_ = 0;
  wide_.clear();
}

// The elements the kernel skipped (a term that is not finite, a sum that is
// not exact, or one that already is wide_[i]) are added one by one: an
// element whose sum a double cannot hold moves to wide_.
size_t ExactSum::AddRun(const float* x, size_t first, size_t n, float w) {
  const char* bytes = reinterpret_cast<const char*>(x);
  double* sum = &sum_[first];
  if (terms_ == 0) {
    if (WithKernels([&](auto kernels) {
          return kernels.StoreTerms(bytes, n, w, sum);
        })) {
      return n;
    }
    size_t i = 0;
    while (std::isfinite(Term(bytes, i, w))) ++i;
    return i;
  }
  uint64_t skipped[kBlock / 64];
  assert(n <= kBlock);
  if (WithKernels([&](auto kernels) {
        return kernels.AddTerms(bytes, n, w, sum, skipped);
      })) {
    return n;
  }
  size_t bad = n;
  for (size_t word = 0; word * 64 < n; ++word) {
    for (uint64_t bits = skipped[word]; bits != 0; bits &= bits - 1) {
      const size_t i = word * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      const double term = Term(bytes, i, w);
      if (!std::isfinite(term)) {
        bad = std::min(bad, i);
      } else if (std::isnan(sum[i])) {
        wide_[first + i].AddInRange(term);
      } else {
        // Not exact in double: TwoSum's error is what the double misses.
        const double old = sum[i];
        const double s = old + term;
        const double term_part = s - old;
        const double error = (old - (s - term_part)) + (term - term_part);
        ExactScalar& wide = wide_[first + i];
        wide.AddInRange(s);
        wide.AddInRange(error);
        sum[i] = std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return bad;
}

size_t ExactSum::AddEncodedRun(const common::EncodedRun& run, float w) {
  size_t bad = run.first + run.count;
  float block[kBlock];
  for (size_t done = 0; done < run.count; done += kBlock) {
    const size_t n = std::min(kBlock, run.count - done);
    const float* x;
    if (run.codec == common::Codec::kFp32) {
      x = reinterpret_cast<const float*>(run.bytes.data() +
                                         done * sizeof(float));
    } else {
      common::EncodedRun part = run;
      part.first = run.first + done;
      part.count = n;
      part.bytes = run.codec == common::Codec::kBf16
                       ? run.bytes.substr(done * 2, n * 2)
                       : run.bytes.substr(done, n);
      common::Decode(part, absl::MakeSpan(block, n));
      x = block;
    }
    const size_t bad_here = AddRun(x, run.first + done, n, w);
    if (bad_here < n) bad = std::min(bad, run.first + done + bad_here);
  }
  return bad;
}

absl::Status ExactSum::Add(common::Codec codec, common::Pieces payload,
                           float w) {
  // Added run by run; if a term is not finite, the runs added so far are
  // taken back by adding −w·x, which undoes every addition exactly (each
  // one either was exact in double, or is in an integer in wide_), so
  // nothing changes. A first Add stored its terms and is not taken back:
  // with terms_ still 0 the sums are unused, as before.
  size_t bad = 0;
  std::vector<common::EncodedRun> added;
  const absl::Status status = common::ForEachPart(
      codec, payload, size(), [&](const common::EncodedRun& run) {
        added.push_back(run);
        bad = AddEncodedRun(run, w);
        if (bad == run.first + run.count) return absl::OkStatus();
        return absl::OutOfRangeError("");
      });
  if (status.ok()) {
    ++terms_;
    return absl::OkStatus();
  }
  if (terms_ > 0) {
    for (const common::EncodedRun& run : added) AddEncodedRun(run, -w);
  }
  if (status.code() != absl::StatusCode::kOutOfRange) return status;
  return absl::InvalidArgumentError(absl::StrCat(
      "element ", bad, ": weight ", w, " times the value is not finite"));
}

absl::Status ExactSum::Add(absl::Span<const float> x, float w) {
  assert(x.size() == size());
  const std::string_view bytes(reinterpret_cast<const char*>(x.data()),
                               x.size() * sizeof(float));
  return Add(common::Codec::kFp32, common::Pieces(&bytes, 1), w);
}

// Divided block by block into L1 and appended: the vector's memory is
// written once, not zeroed first.
std::vector<float> ExactSum::Mean(double divisor) const {
  std::vector<float> mean;
  if (terms_ == 0) {
    mean.assign(size_, 0.0f);
    return mean;
  }
  mean.reserve(size_);
  float block[kBlock];
  for (size_t done = 0; done < size_; done += kBlock) {
    const size_t n = std::min(kBlock, size_ - done);
    WithKernels(
        [&](auto kernels) { kernels.Divide(&sum_[done], n, divisor, block); });
    mean.insert(mean.end(), block, block + n);
  }
  for (const auto& [i, wide] : wide_) {
    mean[i] = static_cast<float>(wide.Value() / divisor);
  }
  return mean;
}

double ExactSum::Value(size_t i) const {
  if (terms_ == 0) return 0.0;
  const auto wide = wide_.find(i);
  return wide == wide_.end() ? sum_[i] : wide->second.Value();
}

}  // namespace co2::server
