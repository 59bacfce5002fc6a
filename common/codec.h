// Wire codecs for flat fp32 vectors: fp32 (raw), bf16 (round-to-nearest-even)
// and int8 (per 1,024-element block: an fp32 scale absmax/127, then int8
// values round(x · (1/scale)), or round(x / scale) clamped for a subnormal
// or capped scale; layout [all scales][all values]). Decoding is
// deterministic, so a sender that decodes what it encoded holds the
// receiver's exact bits, and every common::KernelIsa variant of the kernels
// computes the same bits. Pure functions on caller-owned buffers; any thread.
#ifndef CO2_COMMON_CODEC_H_
#define CO2_COMMON_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace co2::common {

// Values match co2.v1.Codec on the wire.
enum class Codec : int { kFp32 = 1, kBf16 = 2, kInt8 = 3 };

inline constexpr size_t kInt8BlockElements = 1024;

// "fp32", "bf16", "int8".
std::string_view CodecName(Codec codec);
// Parses a CodecName; INVALID_ARGUMENT naming the unknown value otherwise.
absl::StatusOr<Codec> ParseCodec(std::string_view name);
// Converts a wire enum value; INVALID_ARGUMENT for anything but 1, 2, 3.
absl::StatusOr<Codec> CodecFromWire(int value);

// Bytes that Encode writes for `elements` elements.
size_t EncodedSize(Codec codec, size_t elements);

// Bytes of an int8 payload of `elements` elements before its values: the
// scales of its blocks.
size_t Int8ValuesOffset(size_t elements);

// Elements [first, first + count) of an encoded payload, read where they lie
// (common/payload_pieces.h): for fp32 and bf16 `bytes` is their encoding;
// for int8 `bytes` is their count values and `int8_scales` the payload's
// whole scale region (the scale of block b at byte 4·b), since int8 keeps
// all scales ahead of all values.
struct EncodedRun {
  Codec codec = Codec::kFp32;
  std::string_view bytes;
  std::string_view int8_scales;
  size_t first = 0;
  size_t count = 0;
};

// The whole of `bytes`, an encoding of `elements` elements, as a run.
EncodedRun WholeRun(Codec codec, std::string_view bytes, size_t elements);

// Writes EncodedSize(codec, in.size()) bytes to `out`. Inputs must be finite.
void Encode(Codec codec, absl::Span<const float> in, absl::Span<char> out);

// Checks that `bytes` is a well-formed encoding of `elements` values: the
// exact size and only finite values (for int8: finite, non-negative scales).
// INVALID_ARGUMENT says which check failed, with the values involved.
absl::Status Validate(Codec codec, std::string_view bytes, size_t elements);

// Validate's value checks for a run of a payload of the right size: finite
// fp32 and bf16 values, for int8 the scales of the blocks the run touches.
// INVALID_ARGUMENT names the element (or block) by its index in the payload.
absl::Status ValidateRun(const EncodedRun& run);

// out = decode(bytes). `bytes` must have passed Validate for out.size().
void Decode(Codec codec, std::string_view bytes, absl::Span<float> out);

// acc += weight · decode(bytes), in one pass with no temporary. `bytes` must
// have passed Validate for acc.size().
void AccumulateDecoded(Codec codec, std::string_view bytes, float weight,
                       absl::Span<float> acc);

// The first index i at which acc[i] + weight · decode(bytes)[i], computed as
// AccumulateDecoded computes it, would not be finite (fp32 overflow); nullopt
// if every sum is finite. `bytes` must have passed Validate for acc.size().
std::optional<size_t> FirstNonFiniteSum(Codec codec, std::string_view bytes,
                                        float weight,
                                        absl::Span<const float> acc);

// The same for a run, which must have passed ValidateRun; out, acc have
// run.count elements, and the index returned is within the run.
void Decode(const EncodedRun& run, absl::Span<float> out);
void AccumulateDecoded(const EncodedRun& run, float weight,
                       absl::Span<float> acc);
std::optional<size_t> FirstNonFiniteSum(const EncodedRun& run, float weight,
                                        absl::Span<const float> acc);

// Error feedback for lossy codecs: encodes v = value + residual into `out` and
// leaves residual = v − decode(out), so the quantisation error is carried into
// the next round instead of being lost. For fp32 the residual stays zero.
void EncodeWithFeedback(Codec codec, absl::Span<const float> value,
                        absl::Span<float> residual, absl::Span<char> out);

}  // namespace co2::common

#endif  // CO2_COMMON_CODEC_H_
