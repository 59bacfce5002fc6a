// How the flat parameter vector is cut: into blocks (the unit of every
// reduction in the outer step), shards (contiguous, block-aligned ranges, one
// per aggregator process) and chunks (the unit on the wire). Pure functions;
// any thread. Both sides of the wire compute ranges with these functions, so
// the shard map never travels.
#ifndef CO2_COMMON_LAYOUT_H_
#define CO2_COMMON_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace co2::common {

// Reductions (mean |g|, rms(m)) are taken per block of this many elements, so
// results do not depend on the number of shards.
inline constexpr size_t kBlockElements = 65536;
// Elements per wire chunk: one block, 256 KiB of fp32 payload. A multiple of
// the int8 codec's block and of kBlockElements. A chunk is also the unit a
// shard steps and streams back once every worker has sent all of it, so the
// download runs a chunk behind the upload and a round over a link takes
// about (P·b + S·chunk) / bandwidth (docs/performance.md §2).
inline constexpr size_t kChunkElements = kBlockElements;

struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const Range& o) const {
    return begin == o.begin && end == o.end;
  }
};

// The range of shard `index` of `num_shards` over `num_parameters` elements:
// whole blocks dealt out as evenly as possible (earlier shards get the extra
// block), the last shard also takes the final partial block. A shard may be
// empty when there are fewer blocks than shards. INVALID_ARGUMENT when
// num_shards is 0 or index >= num_shards.
absl::StatusOr<Range> ShardRangeFor(size_t num_parameters, size_t num_shards,
                                    size_t index);

// The shards [begin, end) that local rank `rank` of a node's `local_ranks`
// exchanges when the node's ranks split its exchange: the shards dealt out
// as ShardRangeFor deals blocks (earlier ranks get the extra shard), so with
// num_shards = local_ranks · s every rank owns s. INVALID_ARGUMENT naming
// the values when local_ranks is 0, rank >= local_ranks, or there are fewer
// shards than local ranks (a rank would own nothing).
absl::StatusOr<Range> OwnedShards(size_t num_shards, size_t local_ranks,
                                  size_t rank);

// The parameters local rank `rank` exchanges: the union of its
// OwnedShards' ShardRangeFor ranges, which is contiguous and starts on the
// chunk grid. The ranks' ranges tile [0, num_parameters) in rank order.
// OwnedShards' errors.
absl::StatusOr<Range> RankRange(size_t num_parameters, size_t num_shards,
                                size_t local_ranks, size_t rank);

// Number of wire chunks for `elements` elements (0 for 0).
size_t NumChunks(size_t elements);

// The element range, relative to the shard, of chunk `chunk_index`. Requires
// chunk_index < NumChunks(shard_elements).
Range ChunkRange(size_t shard_elements, size_t chunk_index);

}  // namespace co2::common

#endif  // CO2_COMMON_LAYOUT_H_
