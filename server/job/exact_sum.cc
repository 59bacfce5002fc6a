#include "server/job/exact_sum.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "common/kernel_isa.h"

namespace co2::server {
namespace {

// 1.5·2^52: for |v| <= 2^51, v + kMagic rounds v to the nearest integer
// (ties to even) and holds it in its low mantissa bits, so that
// bits(v + kMagic) − bits(kMagic) is that integer as int64.
constexpr double kMagic = 6755399441055744.0;
// A term t is hs = t·2^(F−52) in units of the hi limb; hi = round(hs) and
// lo = round((hs − hi)·2^52), so t·2^F = hi·2^52 + lo up to lo's rounding.
constexpr double kToHi = 0x1p8;      // 2^(F − 52), F = 60
constexpr double kToLo = 0x1p52;     // units of the hi limb in units of 2^−F
constexpr double kHiLimit = 0x1p51;  // |hs| < 2^51 ⟺ |t| < kExactSumMaxTerm
static_assert(kExactSumFractionBits == 60, "kToHi is 2^(F − 52)");
static_assert(kExactSumMaxTerm == kHiLimit / kToHi, "the range of a term");
static_assert(sizeof(double) == sizeof(uint64_t), "bit casts");

// The limbs of `term` (hi, lo as two's complement words); false if it is
// out of range, and then they are meaningless. The kernels do exactly these
// operations lane by lane.
inline bool SplitTerm(double term, uint64_t* hi, uint64_t* lo) {
  const double hs = term * kToHi;
  const double ht = hs + kMagic;
  const double lt = (hs - (ht - kMagic)) * kToLo + kMagic;
  *hi = absl::bit_cast<uint64_t>(ht) - absl::bit_cast<uint64_t>(kMagic);
  *lo = absl::bit_cast<uint64_t>(lt) - absl::bit_cast<uint64_t>(kMagic);
  return hs < kHiLimit && hs > -kHiLimit;
}

// hi·2^52 + lo in units of 2^−F, rounded once to double. |lo| < 2^63 and
// the carry of lo into hi is at most 2^11, so hi + carry cannot overflow.
inline double ValueOf(uint64_t hi, uint64_t lo) {
  const int64_t l = static_cast<int64_t>(lo);
  const int64_t carry = l >> 52;                        // floor(l / 2^52)
  const int64_t rest = l - carry * (int64_t{1} << 52);  // in [0, 2^52)
  const int64_t h = static_cast<int64_t>(hi) + carry;
  return (static_cast<double>(h) * kToLo + static_cast<double>(rest)) * 0x1p-60;
}

enum class Op { kStore, kAdd, kTakeBack };

// The kernels, once per KernelIsa.
#define CO2_KERNELS_FILE "server/job/exact_sum_kernels.inc"
#include "common/per_isa_kernels.inc"
#undef CO2_KERNELS_FILE

template <Op kOp>
bool AddTermsWithActiveIsa(const char* x, size_t n, double w, uint64_t* hi,
                           uint64_t* lo) {
  switch (common::ActiveKernelIsa()) {
#if defined(__x86_64__)
    case common::KernelIsa::kSse2:
      return sse2::Kernels::AddTerms<kOp>(x, n, w, hi, lo);
    case common::KernelIsa::kAvx2:
      return avx2::Kernels::AddTerms<kOp>(x, n, w, hi, lo);
#endif
    default:
      return portable::Kernels::AddTerms<kOp>(x, n, w, hi, lo);
  }
}

void DivideWithActiveIsa(const uint64_t* hi, const uint64_t* lo, size_t n,
                         double divisor, float* out) {
  switch (common::ActiveKernelIsa()) {
#if defined(__x86_64__)
    case common::KernelIsa::kSse2:
      return sse2::Kernels::Divide(hi, lo, n, divisor, out);
    case common::KernelIsa::kAvx2:
      return avx2::Kernels::Divide(hi, lo, n, divisor, out);
#endif
    default:
      return portable::Kernels::Divide(hi, lo, n, divisor, out);
  }
}

// Decoded values are taken in blocks of this many, in a buffer that stays
// in L1 (fp32 payloads are read in place).
constexpr size_t kBlock = 1024;

absl::Status TooManyTerms() {
  return absl::InvalidArgumentError(
      absl::StrCat("more than ", kExactSumMaxTerms,
                   " contributions to one chunk of a round"));
}

}  // namespace

absl::Status ExactScalar::Add(double term) {
  if (terms_ >= kExactSumMaxTerms) return TooManyTerms();
  uint64_t h, l;
  if (!std::isfinite(term) || !SplitTerm(term, &h, &l)) {
    return absl::InvalidArgumentError(
        absl::StrCat(term, " is outside the exact sum's range (magnitude < ",
                     kExactSumMaxTerm, ")"));
  }
  hi_ += h;
  lo_ += l;
  ++terms_;
  return absl::OkStatus();
}

double ExactScalar::Value() const { return ValueOf(hi_, lo_); }

// The limbs are left uninitialised: the first Add stores its terms instead
// of adding them, which saves writing zeros and reading them back.
ExactSum::ExactSum(size_t elements)
    : size_(elements),
      hi_(new uint64_t[elements]),
      lo_(new uint64_t[elements]) {}

bool ExactSum::AddRun(const float* x, size_t first, size_t n, float w,
                      int sign) {
  const char* bytes = reinterpret_cast<const char*>(x);
  uint64_t* hi = &hi_[first];
  uint64_t* lo = &lo_[first];
  if (sign < 0)
    return AddTermsWithActiveIsa<Op::kTakeBack>(bytes, n, w, hi, lo);
  if (terms_ == 0)
    return AddTermsWithActiveIsa<Op::kStore>(bytes, n, w, hi, lo);
  return AddTermsWithActiveIsa<Op::kAdd>(bytes, n, w, hi, lo);
}

bool ExactSum::AddEncodedRun(const common::EncodedRun& run, float w, int sign,
                             size_t* bad) {
  bool in_range = true;
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
    if (!AddRun(x, run.first + done, n, w, sign) && in_range) {
      in_range = false;
      for (size_t i = 0; i < n; ++i) {
        uint64_t h, l;
        float xi;
        std::memcpy(&xi, &x[i], sizeof xi);
        if (!SplitTerm(static_cast<double>(xi) * w, &h, &l)) {
          *bad = run.first + done + i;
          break;
        }
      }
    }
  }
  return in_range;
}

absl::Status ExactSum::Add(common::Codec codec, common::Pieces payload,
                           float w) {
  if (terms_ >= kExactSumMaxTerms) return TooManyTerms();
  // Added run by run; if a term is out of range, the runs added so far are
  // taken back (integer sums undo exactly), so nothing changes.
  size_t bad = 0;
  std::vector<common::EncodedRun> added;
  const absl::Status status = common::ForEachPart(
      codec, payload, size(), [&](const common::EncodedRun& run) {
        added.push_back(run);
        if (AddEncodedRun(run, w, 1, &bad)) return absl::OkStatus();
        return absl::OutOfRangeError("");
      });
  if (status.ok()) {
    ++terms_;
    return absl::OkStatus();
  }
  // A first term was stored, not added: with terms_ still 0 the limbs are
  // unused, as before.
  if (terms_ > 0) {
    for (const common::EncodedRun& run : added) {
      size_t unused;
      AddEncodedRun(run, w, -1, &unused);
    }
  }
  if (status.code() != absl::StatusCode::kOutOfRange) return status;
  return absl::InvalidArgumentError(absl::StrCat(
      "element ", bad, ": weight ", w,
      " times the value is outside the exact sum's range (magnitude < ",
      kExactSumMaxTerm, ")"));
}

absl::Status ExactSum::Add(absl::Span<const float> x, float w) {
  assert(x.size() == size());
  const std::string_view bytes(reinterpret_cast<const char*>(x.data()),
                               x.size() * sizeof(float));
  return Add(common::Codec::kFp32, common::Pieces(&bytes, 1), w);
}

void ExactSum::Divide(double divisor, absl::Span<float> out) const {
  assert(out.size() == size());
  if (terms_ == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  DivideWithActiveIsa(hi_.get(), lo_.get(), out.size(), divisor, out.data());
}

double ExactSum::Value(size_t i) const {
  return terms_ == 0 ? 0.0 : ValueOf(hi_[i], lo_[i]);
}

}  // namespace co2::server
