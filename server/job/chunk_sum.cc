#include "server/job/chunk_sum.h"

#include <algorithm>
#include <cassert>
#include <cfloat>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "server/job/exact_sum.h"

namespace co2::server {
namespace {

// x[i] ← x[i] / divisor, divided in double: Σ w may exceed fp32's range, and
// a quotient of fp32 values rounded via double is the correctly rounded fp32
// one (the rank-valued mean (N − 1) / 2 comes out exact). In groups of eight
// with a fixed-count inner loop, the shape GCC's -O2 vectoriser takes
// (common/codec_kernels.inc): packed divisions, the same bits as one by one.
void DivideInPlace(float* __restrict__ x, size_t n, double divisor) {
  constexpr size_t kGroup = 8;
  size_t i = 0;
  for (; i + kGroup <= n; i += kGroup) {
    for (size_t j = 0; j < kGroup; ++j) {
      x[i + j] = static_cast<float>(static_cast<double>(x[i + j]) / divisor);
    }
  }
  for (; i < n; ++i) {
    x[i] = static_cast<float>(static_cast<double>(x[i]) / divisor);
  }
}

class Fp32ChunkSum : public ChunkSum {
 public:
  explicit Fp32ChunkSum(size_t elements) : ChunkSum(elements) {}

  absl::Status Add(common::Codec codec, common::Pieces payload,
                   float w) override {
    if (acc_.empty()) acc_.assign(size(), 0.0f);
    const absl::Span<float> acc = absl::MakeSpan(acc_);
    // Checked before anything is added: a float sum cannot be rolled back
    // exactly, and one Inf would poison the round for every worker. The
    // payload is read in place, part by part (common/payload_pieces.h).
    CO2_RETURN_IF_ERROR(common::ForEachPart(
        codec, payload, size(), [&](const common::EncodedRun& run) {
          const std::optional<size_t> bad = common::FirstNonFiniteSum(
              run, w, acc.subspan(run.first, run.count));
          if (!bad) return absl::OkStatus();
          return absl::InvalidArgumentError(absl::StrCat(
              "element ", run.first + *bad,
              " of the chunk is not finite once "
              "weight ",
              w,
              " times it is added to the round's sum (fp32 "
              "overflow: the contribution's values are too large)"));
        }));
    common::AccumulatePieces(codec, payload, w, acc);
    weight_sum_ += w;
    return absl::OkStatus();
  }

  std::vector<float> TakeMean() override {
    std::vector<float> mean = std::move(acc_);
    acc_ = {};
    if (mean.empty()) {
      mean.assign(size(), 0.0f);
    } else if (weight_sum_ > 0) {
      DivideInPlace(mean.data(), mean.size(), weight_sum_);
    } else {
      std::fill(mean.begin(), mean.end(), 0.0f);
    }
    weight_sum_ = 0;
    return mean;
  }

 private:
  std::vector<float> acc_;  // empty until the first Add
  double weight_sum_ = 0;
};

class ExactChunkSum : public ChunkSum {
 public:
  explicit ExactChunkSum(size_t elements) : ChunkSum(elements) {}

  absl::Status Add(common::Codec codec, common::Pieces payload,
                   float w) override {
    if (sum_ == nullptr) sum_ = std::make_unique<ExactSum>(size());
    CO2_RETURN_IF_ERROR(sum_->Add(codec, payload, w));
    // In range: a finite fp32 weight.
    const absl::Status weighed = weight_sum_.Add(w);
    assert(weighed.ok());
    (void)weighed;
    return absl::OkStatus();
  }

  std::vector<float> TakeMean() override {
    const double weight = weight_sum_.Value();
    std::vector<float> mean = sum_ != nullptr && weight > 0
                                  ? sum_->Mean(weight)
                                  : std::vector<float>(size(), 0.0f);
    // The sums are kept: memory the kernel hands out afresh is zeroed page
    // by page, which costs more than the sum itself.
    if (sum_ != nullptr) sum_->Clear();
    weight_sum_ = ExactScalar();
    return mean;
  }

 private:
  std::unique_ptr<ExactSum> sum_;  // null until the first Add
  ExactScalar weight_sum_;
};

}  // namespace

std::unique_ptr<ChunkSum> ChunkSum::Create(bool exact, size_t elements) {
  if (exact) return std::make_unique<ExactChunkSum>(elements);
  return std::make_unique<Fp32ChunkSum>(elements);
}

absl::Status ChunkSum::CheckWeight(double weight) {
  // Either sum applies the weight in fp32: outside fp32's normal range it
  // would round to 0 or inf.
  if (weight >= FLT_MIN && weight <= FLT_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("weight ", weight,
                                                 " is outside the fp32 range [",
                                                 FLT_MIN, ", ", FLT_MAX, "]"));
}

}  // namespace co2::server
