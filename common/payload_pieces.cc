#include "common/payload_pieces.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"

namespace co2::common {

size_t TotalSize(Pieces pieces) {
  size_t total = 0;
  for (std::string_view piece : pieces) total += piece.size();
  return total;
}

bool NeedsGather(Codec codec, Pieces pieces) {
  return codec == Codec::kInt8 && pieces.size() > 1;
}

std::string Gather(Pieces pieces) {
  std::string all;
  all.reserve(TotalSize(pieces));
  for (std::string_view piece : pieces) all.append(piece);
  return all;
}

absl::Status ForEachPart(
    Codec codec, Pieces pieces, size_t elements,
    absl::FunctionRef<absl::Status(std::string_view bytes, size_t first,
                                   size_t count)>
        part) {
  assert(TotalSize(pieces) == EncodedSize(codec, elements));
  assert(!NeedsGather(codec, pieces));
  if (pieces.size() == 1) return part(pieces[0], 0, elements);
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
      absl::Status s = part(std::string_view(split, width), next, 1);
      if (!s.ok()) return s;
      ++next;
      have = 0;
    }
    const size_t whole = piece.size() / width;
    if (whole > 0) {
      absl::Status s = part(piece.substr(0, whole * width), next, whole);
      if (!s.ok()) return s;
      next += whole;
    }
    have = piece.size() - whole * width;
    std::copy_n(piece.data() + whole * width, have, split);
  }
  assert(next == elements && have == 0);
  return absl::OkStatus();
}

void AccumulatePieces(Codec codec, Pieces pieces, float weight,
                      absl::Span<float> acc) {
  (void)ForEachPart(codec, pieces, acc.size(),
                    [&](std::string_view bytes, size_t first, size_t count) {
                      AccumulateDecoded(codec, bytes, weight,
                                        acc.subspan(first, count));
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
  return ForEachPart(codec, pieces, elements,
                     [&](std::string_view bytes, size_t first, size_t count) {
                       absl::Status s = Validate(codec, bytes, count);
                       if (s.ok()) return s;
                       return absl::Status(
                           s.code(),
                           absl::StrCat("elements [", first, ", ",
                                        first + count, "): ", s.message()));
                     });
}

}  // namespace co2::common
