#include "server/job/chunk_screen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/layout.h"

namespace co2::server {
namespace {

// Σ x² of `count` little-endian fp32 values at `bytes` (any alignment): in
// float over runs of kRun groups of kLanes (one partial sum per lane, the
// shape GCC's -O2 vectoriser takes), each run's sums then added in double.
// A norm only has to be good to a few digits; float keeps the pass at the
// speed of reading the payload.
double SumOfSquares(const char* bytes, size_t count) {
  constexpr size_t kLanes = 16;
  constexpr size_t kRun = 16;
  double sum = 0;
  size_t i = 0;
  for (; i + kLanes * kRun <= count; i += kLanes * kRun) {
    float x[kLanes * kRun];
    std::memcpy(x, bytes + i * sizeof(float), sizeof x);
    float lanes[kLanes] = {};
    for (size_t g = 0; g < kRun; ++g) {
      for (size_t l = 0; l < kLanes; ++l) {
        lanes[l] += x[g * kLanes + l] * x[g * kLanes + l];
      }
    }
    for (const float lane : lanes) sum += lane;
  }
  for (; i < count; ++i) {
    float x;
    std::memcpy(&x, bytes + i * sizeof(float), sizeof x);
    sum += static_cast<double>(x) * x;
  }
  return sum;
}

}  // namespace

double WeightedNorm(common::Codec codec, common::Pieces payload,
                    size_t elements, double weight) {
  // Decoded one run at a time into a buffer of at most a chunk.
  thread_local std::vector<float> decoded;
  double sum = 0;
  const absl::Status read = common::ForEachPart(
      codec, payload, elements, [&](const common::EncodedRun& run) {
        if (run.codec == common::Codec::kFp32) {
          // Read in place: the payload is the values.
          sum += SumOfSquares(run.bytes.data(), run.count);
          return absl::OkStatus();
        }
        decoded.resize(std::max(decoded.size(), run.count));
        const absl::Span<float> out = absl::MakeSpan(decoded).first(run.count);
        common::Decode(run, out);
        sum += SumOfSquares(reinterpret_cast<const char*>(out.data()),
                            out.size());
        return absl::OkStatus();
      });
  (void)read;  // the callback never fails
  return weight * std::sqrt(sum);
}

double Median(std::vector<double>& values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

uint32_t ChunkContributors(uint32_t complete,
                           const std::vector<HeldOut>& held_out,
                           uint32_t chunk_index) {
  uint32_t held = 0;
  for (const HeldOut& out : held_out) held += out.chunk_index == chunk_index;
  return complete > held ? complete - held : 0;
}

bool ChunkScreen::ShouldHold(double norm, double k,
                             std::optional<double> last_median) const {
  if (k <= 0) return false;
  std::optional<double> estimate = last_median;
  if (!estimate.has_value() && norms_.size() + 1 >= 3) {
    std::vector<double> so_far = norms_;
    so_far.push_back(norm);
    estimate = Median(so_far);
  }
  return !estimate.has_value() || norm > k * *estimate;
}

void ChunkScreen::Hold(std::string_view worker, double norm,
                       common::Codec codec, common::Pieces payload,
                       float weight) {
  Held held{std::string(worker), norm, codec, {}, weight};
  held.payload.reserve(common::TotalSize(payload));
  for (const std::string_view piece : payload) held.payload.append(piece);
  held_.push_back(std::move(held));
  norms_.push_back(norm);
}

ChunkScreen::Settled ChunkScreen::Settle(double k, uint32_t chunk_index,
                                         AddFn add,
                                         std::vector<HeldOut>* held_out) {
  Settled settled;
  if (norms_.empty()) return settled;
  const double most = *std::max_element(norms_.begin(), norms_.end());
  const size_t count = norms_.size();
  const double median = Median(norms_);
  settled.median = median;
  settled.max_ratio = median > 0 ? most / median : 0;
  for (Held& held : held_) {
    // Fewer than 3 contributions have no majority to judge by.
    const bool outlier = count >= 3 && held.norm > k * median;
    absl::Status added;
    if (!outlier) {
      const std::string_view payload = held.payload;
      added = add(held.codec, common::Pieces(&payload, 1), held.weight);
      if (added.ok()) continue;
    }
    held_out->push_back(HeldOut{
        std::move(held.worker), chunk_index, held.norm, median,
        outlier ? absl::StrCat("its norm ", held.norm, " is ",
                               median > 0 ? held.norm / median : INFINITY,
                               " x the chunk's median ", median,
                               " (outlier_ratio ", k, ")")
                : std::string(added.message()),
        outlier});
  }
  norms_.clear();
  held_.clear();
  return settled;
}

}  // namespace co2::server
