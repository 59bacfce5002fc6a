#include "common/payload_pieces.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "absl/strings/str_cat.h"

namespace co2::common {
namespace {

using PartFn = absl::FunctionRef<absl::Status(const EncodedRun& run)>;

// fp32 and bf16: each piece's whole elements as they lie; an element that
// straddles two pieces assembled in `split`.
absl::Status ForEachWordPart(Codec codec, Pieces pieces, PartFn part) {
  const size_t width = EncodedSize(codec, 1);
  char split[sizeof(float)];  // an element that straddles two pieces
  size_t have = 0;            // bytes of it in `split`
  size_t next = 0;            // the first element not yet handed on
  for (std::string_view piece : pieces) {
    if (have > 0) {
      const size_t take = std::min(width - have, piece.size());
      std::copy_n(piece.data(), take, split + have);
      have += take;
      piece.remove_prefix(take);
      if (have < width) continue;
      absl::Status s =
          part(EncodedRun{codec, std::string_view(split, width), {}, next, 1});
      if (!s.ok()) return s;
      ++next;
      have = 0;
    }
    const size_t whole = piece.size() / width;
    if (whole > 0) {
      absl::Status s = part(
          EncodedRun{codec, piece.substr(0, whole * width), {}, next, whole});
      if (!s.ok()) return s;
      next += whole;
    }
    have = piece.size() - whole * width;
    std::copy_n(piece.data() + whole * width, have, split);
  }
  assert(have == 0);
  return absl::OkStatus();
}

// int8: the scale region (in place, or assembled if it straddles pieces),
// then each piece's values as they lie.
absl::Status ForEachInt8Part(Pieces pieces, size_t elements, PartFn part) {
  const size_t scale_bytes = Int8ValuesOffset(elements);
  std::string split_scales;
  std::string_view scales;
  size_t seen = 0;  // bytes of the scale region passed
  size_t next = 0;  // the first element not yet handed on
  for (std::string_view piece : pieces) {
    if (seen < scale_bytes) {
      const size_t take = std::min(scale_bytes - seen, piece.size());
      if (seen == 0 && take == scale_bytes) {
        scales = piece.substr(0, take);
      } else {
        split_scales.append(piece.substr(0, take));
        if (split_scales.size() == scale_bytes) scales = split_scales;
      }
      seen += take;
      piece.remove_prefix(take);
    }
    if (piece.empty()) continue;
    absl::Status s =
        part(EncodedRun{Codec::kInt8, piece, scales, next, piece.size()});
    if (!s.ok()) return s;
    next += piece.size();
  }
  assert(next == elements);
  return absl::OkStatus();
}

}  // namespace

size_t TotalSize(Pieces pieces) {
  size_t total = 0;
  for (std::string_view piece : pieces) total += piece.size();
  return total;
}

absl::Status ForEachPart(Codec codec, Pieces pieces, size_t elements,
                         PartFn part) {
  assert(TotalSize(pieces) == EncodedSize(codec, elements));
  if (pieces.size() == 1) return part(WholeRun(codec, pieces[0], elements));
  if (codec == Codec::kInt8) return ForEachInt8Part(pieces, elements, part);
  return ForEachWordPart(codec, pieces, part);
}

void AccumulatePieces(Codec codec, Pieces pieces, float weight,
                      absl::Span<float> acc) {
  (void)ForEachPart(codec, pieces, acc.size(), [&](const EncodedRun& run) {
    AccumulateDecoded(run, weight, acc.subspan(run.first, run.count));
    return absl::OkStatus();
  });
}

absl::Status ValidatePieces(Codec codec, Pieces pieces, size_t elements) {
  if (pieces.size() == 1) return Validate(codec, pieces[0], elements);
  const size_t size = TotalSize(pieces);
  const size_t want = EncodedSize(codec, elements);
  if (size != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(CodecName(codec)), " payload for ", elements,
                     " elements must be ", want, " bytes, got ", size));
  }
  return ForEachPart(codec, pieces, elements, ValidateRun);
}

}  // namespace co2::common
