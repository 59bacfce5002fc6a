// Seeded, reproducible partitioning of a data set among the W workers of a
// job. Every worker computes its own part from (seed, worker, W) alone, so no
// index list ever travels and the parts are disjoint and cover everything by
// construction. Pure functions; any thread.
#ifndef CO2_CLIENT_TRAINING_DATA_SHARD_H_
#define CO2_CLIENT_TRAINING_DATA_SHARD_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace co2::client {

// A half-open range [begin, end) of example (or byte) positions.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Derives an independent generator seed for `stream` (a worker id, an epoch)
// from one job seed (SplitMix64 finaliser), so that nearby seeds and streams
// still give unrelated sequences.
uint64_t MixSeed(uint64_t seed, uint64_t stream);

// Uniform integer in [0, bound), bound > 0. Rejection sampling rather than
// std::uniform_int_distribution, whose algorithm is implementation-defined:
// workers built against different standard libraries must agree.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound);

// Fisher-Yates shuffle driven by UniformBelow: the same seed gives the same
// order everywhere.
void DeterministicShuffle(absl::Span<int64_t> values, uint64_t seed);

// The contiguous part of worker `worker` of `num_workers` over [0, n): sizes
// differ by at most one (earlier workers get the extra element).
// INVALID_ARGUMENT when n < 0, num_workers < 1 or worker is out of range.
absl::StatusOr<IndexRange> ContiguousPart(int64_t n, int worker,
                                          int num_workers);

// Example indices of worker `worker` of `num_workers` for a data set of
// `num_examples`: the permutation DeterministicShuffle(0..n-1, seed) cut into
// ContiguousPart slices. Disjoint across workers, union = all indices, and a
// worker's share is a random sample rather than a run of neighbouring
// examples. INVALID_ARGUMENT for a bad worker/num_workers or when there are
// fewer examples than workers (some worker would have nothing to train on).
absl::StatusOr<std::vector<int64_t>> ShardIndices(int64_t num_examples,
                                                  int worker, int num_workers,
                                                  uint64_t seed);

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_DATA_SHARD_H_
