// Payload pieces: an encoded payload that arrived in several buffers (gRPC's
// receive slices), read where it lies. ForEachPart cuts it into runs of
// elements (common::EncodedRun) that the codec's functions (ValidateRun,
// AccumulateDecoded, FirstNonFiniteSum) read in place. fp32 and bf16 encode
// element by element: each piece's whole elements are a run as they lie, and
// an element split between two pieces (at most one per piece boundary, 2 or
// 4 bytes) is assembled in a small buffer. int8 keeps all block scales ahead
// of all values: its runs are each piece's values as they lie (one byte per
// element, so none is split), all reading the one scale region, which is
// assembled in a buffer only if it straddles pieces (4 bytes per 1,024
// elements). Pure functions; any thread.
#ifndef CO2_COMMON_PAYLOAD_PIECES_H_
#define CO2_COMMON_PAYLOAD_PIECES_H_

#include <cstddef>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"

namespace co2::common {

// The pieces of one payload, in order; borrowed.
using Pieces = absl::Span<const std::string_view>;

size_t TotalSize(Pieces pieces);

// Calls `part(run)` for consecutive runs covering elements [0, elements).
// TotalSize(pieces) must be EncodedSize(codec, elements). Stops at, and
// returns, the first error of `part`.
absl::Status ForEachPart(
    Codec codec, Pieces pieces, size_t elements,
    absl::FunctionRef<absl::Status(const EncodedRun& run)> part);

// acc += weight · decode(payload), part by part: the same bits as
// AccumulateDecoded of the payload in one piece. The payload must have
// passed ValidatePieces for acc.size().
void AccumulatePieces(Codec codec, Pieces pieces, float weight,
                      absl::Span<float> acc);

// common::Validate of the whole payload, part by part: its size, then every
// part (ValidateRun).
absl::Status ValidatePieces(Codec codec, Pieces pieces, size_t elements);

}  // namespace co2::common

#endif  // CO2_COMMON_PAYLOAD_PIECES_H_
