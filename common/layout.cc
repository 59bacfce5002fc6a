#include "common/layout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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
