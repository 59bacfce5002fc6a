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

// The anchor digest of co2.v1.OuterUpdate.anchor_digest: FNV-1a's step
// (h = (h ^ word) · 1099511628211, from FNV-1a's published 64-bit offset
// basis 14695981039346656037) over the values' bytes
// taken as little-endian 64-bit words (the last one padded with zero bytes
// for an odd count), word i into lane i mod 4, then byte-wise FNV-1a (from
// the same basis) of the four lanes' 32 bytes (little-endian). Four lanes of
// 8-byte words run at memory speed, where byte-wise FNV-1a does not; a change
// of any one word always changes the digest (each step is a bijection of the
// lane).
uint64_t AnchorDigest(absl::Span<const float> values);

}  // namespace co2::common

#endif  // CO2_COMMON_FNV_HASH_H_
