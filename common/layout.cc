#include "common/layout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace co2::common {

absl::StatusOr<Range> ShardRangeFor(size_t num_parameters, size_t num_shards,
                                    size_t index) {
  if (num_shards == 0) {
    return absl::InvalidArgumentError("num_shards must be at least 1, got 0");
  }
  if (index >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard index ", index, " out of range for ", num_shards, " shards"));
  }
  const size_t full_blocks = num_parameters / kBlockElements;
  const size_t base = full_blocks / num_shards;
  const size_t extra = full_blocks % num_shards;
  auto blocks_before = [&](size_t i) { return i * base + std::min(i, extra); };
  Range r;
  r.begin = blocks_before(index) * kBlockElements;
  r.end = index + 1 == num_shards ? num_parameters
                                  : blocks_before(index + 1) * kBlockElements;
  return r;
}

absl::StatusOr<Range> OwnedShards(size_t num_shards, size_t local_ranks,
                                  size_t rank) {
  if (local_ranks == 0) {
    return absl::InvalidArgumentError("local_ranks must be at least 1, got 0");
  }
  if (rank >= local_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", rank, " out of range for ", local_ranks, " local ranks"));
  }
  if (num_shards < local_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a node of ", local_ranks, " local ranks cannot split ", num_shards,
        " shards among them: each rank exchanges whole shards, so give at "
        "least ", local_ranks, " shards (a multiple of ", local_ranks,
        " for equal slices) or exchange from the local leader alone"));
  }
  const size_t base = num_shards / local_ranks;
  const size_t extra = num_shards % local_ranks;
  auto shards_before = [&](size_t k) { return k * base + std::min(k, extra); };
  return Range{shards_before(rank), shards_before(rank + 1)};
}

absl::StatusOr<Range> RankRange(size_t num_parameters, size_t num_shards,
                                size_t local_ranks, size_t rank) {
  CO2_ASSIGN_OR_RETURN(const Range owned,
                       OwnedShards(num_shards, local_ranks, rank));
  CO2_ASSIGN_OR_RETURN(const Range first,
                       ShardRangeFor(num_parameters, num_shards, owned.begin));
  CO2_ASSIGN_OR_RETURN(const Range last, ShardRangeFor(num_parameters,
                                                       num_shards, owned.end - 1));
  return Range{first.begin, last.end};
}

size_t NumChunks(size_t elements) {
  return (elements + kChunkElements - 1) / kChunkElements;
}

Range ChunkRange(size_t shard_elements, size_t chunk_index) {
  Range r;
  r.begin = chunk_index * kChunkElements;
  r.end = std::min(shard_elements, r.begin + kChunkElements);
  return r;
}

}  // namespace co2::common
