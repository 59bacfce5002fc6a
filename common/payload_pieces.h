// Payload pieces: an encoded payload that arrived in several buffers (gRPC's
// receive slices), read where it lies. ForEachPart cuts it into parts that
// are each the complete encoding of a run of elements, so the codec's
// functions (Validate, AccumulateDecoded, ...) run on them in place: each
// piece's whole elements are a part as they lie; an element split between
// two pieces (at most one per piece boundary, 2 or 4 bytes) is assembled in
// a small buffer. That works for fp32 and bf16, which encode element by
// element; int8 keeps all block scales ahead of all values, so a run of its
// elements is not contiguous: an int8 payload in more than one piece is
// gathered into one buffer first (Gather; one copy, of a payload a quarter
// the size of fp32's). Pure functions; any thread.
#ifndef CO2_COMMON_PAYLOAD_PIECES_H_
#define CO2_COMMON_PAYLOAD_PIECES_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"

namespace co2::common {

// The pieces of one payload, in order; borrowed.
using Pieces = absl::Span<const std::string_view>;

size_t TotalSize(Pieces pieces);

// Whether the payload must be gathered into one piece (Gather) before the
// functions below can read it: an int8 payload in more than one piece.
bool NeedsGather(Codec codec, Pieces pieces);

// The pieces, concatenated.
std::string Gather(Pieces pieces);

// Calls `part(bytes, first, count)` for consecutive parts covering elements
// [0, elements): `bytes` is the exact encoding of elements [first, first +
// count). TotalSize(pieces) must be EncodedSize(codec, elements), and an int8
// payload must be one piece. Stops at, and returns, the first error of `part`.
absl::Status ForEachPart(
    Codec codec, Pieces pieces, size_t elements,
    absl::FunctionRef<absl::Status(std::string_view bytes, size_t first,
                                   size_t count)>
        part);

// acc += weight · decode(payload), part by part: the same bits as
// AccumulateDecoded of the payload in one piece, which it requires for int8.
// The payload must have passed ValidatePieces for acc.size().
void AccumulatePieces(Codec codec, Pieces pieces, float weight,
                      absl::Span<float> acc);

// common::Validate of the whole payload, part by part: its size, then every
// part; a failing part's message names the elements it covers. An int8
// payload must be one piece.
absl::Status ValidatePieces(Codec codec, Pieces pieces, size_t elements);

}  // namespace co2::common

#endif  // CO2_COMMON_PAYLOAD_PIECES_H_
