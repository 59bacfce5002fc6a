// ChunkSum: one chunk's Σ w·x over a round's contributions and its Σ w, and
// the mean Σ w·x / Σ w taken from them when the round closes. Two kinds
// (JobConfig.deterministic, docs/algorithm.md "Order-independent sums"):
//
//   fp32    the values are added in fp32 in the order they arrive (4 bytes
//           per element); the mean is divided in place and handed over.
//   exact   the values are added exactly (server/job/exact_sum.h), so the
//           mean is the same bits in any order of arrival (8 bytes per
//           element); the memory stays with the object for reuse.
//
// Both apply the weight rounded to fp32 and add that same value to Σ w.
// Add is all or nothing: a contribution that does not fit (fp32 overflow, or
// a term that is not finite) changes nothing. Not thread-safe.
#ifndef CO2_SERVER_JOB_CHUNK_SUM_H_
#define CO2_SERVER_JOB_CHUNK_SUM_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/codec.h"
#include "common/payload_pieces.h"

namespace co2::server {

class ChunkSum {
 public:
  // A zero sum of `elements` values; memory is taken at the first Add.
  static std::unique_ptr<ChunkSum> Create(bool exact, size_t elements);
  // OK if `weight` can weigh a contribution (within fp32's normal range,
  // for both kinds), else INVALID_ARGUMENT naming the range.
  static absl::Status CheckWeight(double weight);

  virtual ~ChunkSum() = default;

  size_t size() const { return size_; }
  // sum += w · decode(payload) and Σ w += w. `payload` must have passed
  // validation for size() elements of `codec`, and `w` CheckWeight.
  // INVALID_ARGUMENT naming the first element that does not fit.
  virtual absl::Status Add(common::Codec codec, common::Pieces payload,
                           float w) = 0;
  // The mean (zeros when nothing was added), and back to a zero sum.
  virtual std::vector<float> TakeMean() = 0;

 protected:
  explicit ChunkSum(size_t elements) : size_(elements) {}

 private:
  const size_t size_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CHUNK_SUM_H_
