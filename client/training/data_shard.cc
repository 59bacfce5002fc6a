#include "client/training/data_shard.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace co2::client {

uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  // Reject the top partial copy of [0, bound) so every residue is equally
  // likely; at most half of the draws are rejected, usually almost none.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

void DeterministicShuffle(absl::Span<int64_t> values, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = values.size(); i > 1; --i) {
    const size_t j = UniformBelow(rng, i);
    std::swap(values[i - 1], values[j]);
  }
}

absl::StatusOr<IndexRange> ContiguousPart(int64_t n, int worker,
                                          int num_workers) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative size ", n));
  }
  if (num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be >= 1, got ", num_workers));
  }
  if (worker < 0 || worker >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " out of range [0, ", num_workers, ")"));
  }
  const int64_t base = n / num_workers;
  const int64_t extra = n % num_workers;
  IndexRange range;
  range.begin = worker * base + std::min<int64_t>(worker, extra);
  range.end = range.begin + base + (worker < extra ? 1 : 0);
  return range;
}

absl::StatusOr<std::vector<int64_t>> ShardIndices(int64_t num_examples,
                                                  int worker, int num_workers,
                                                  uint64_t seed) {
  auto part = ContiguousPart(num_examples, worker, num_workers);
  if (!part.ok()) return part.status();
  if (num_examples < num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_examples, " examples cannot be shared among ",
                     num_workers, " workers"));
  }
  std::vector<int64_t> all(num_examples);
  std::iota(all.begin(), all.end(), int64_t{0});
  DeterministicShuffle(absl::MakeSpan(all), seed);
  return std::vector<int64_t>(all.begin() + part->begin,
                              all.begin() + part->end);
}

}  // namespace co2::client
