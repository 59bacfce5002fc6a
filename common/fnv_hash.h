// FNV-1a (64-bit) over the bytes of float buffers: the fingerprint that
// co2-train reports for a model (final_hash, params_hash) and co2-checkpoint
// prints for the anchor the shards hold, so that the two can be compared
// without moving the model. Chained calls over consecutive pieces (shard
// ranges) give the hash of the whole. Pure function; any thread.
#ifndef CO2_COMMON_FNV_HASH_H_
#define CO2_COMMON_FNV_HASH_H_

#include <cstdint>

#include "absl/types/span.h"

namespace co2::common {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// The hash of `values`' bytes, continuing from `hash` (the hash of what came
// before; kFnv1aOffset for the start).
uint64_t Fnv1a(absl::Span<const float> values, uint64_t hash = kFnv1aOffset);

}  // namespace co2::common

#endif  // CO2_COMMON_FNV_HASH_H_
