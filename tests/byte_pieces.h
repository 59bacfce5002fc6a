// Byte strings cut into pieces, and gRPC ByteBuffers made of and read into
// such pieces, for the tests of the hand-written wire code. Header only.
#ifndef CO2_TESTS_BYTE_PIECES_H_
#define CO2_TESTS_BYTE_PIECES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace co2::testing {

// `bytes` cut at each of `cuts` (ascending offsets; a repeated cut gives an
// empty piece). The pieces point into `bytes`.
inline std::vector<std::string_view> Cut(std::string_view bytes,
                                         const std::vector<size_t>& cuts) {
  std::vector<std::string_view> pieces;
  size_t from = 0;
  for (size_t cut : cuts) {
    pieces.push_back(bytes.substr(from, cut - from));
    from = cut;
  }
  pieces.push_back(bytes.substr(from));
  return pieces;
}

// The pieces, concatenated.
inline std::string Joined(absl::Span<const std::string_view> pieces) {
  std::string all;
  for (std::string_view piece : pieces) all.append(piece);
  return all;
}

// `bytes` as a ByteBuffer of slices (copies) cut at `cuts`.
inline grpc::ByteBuffer InSlices(std::string_view bytes,
                                 const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  for (std::string_view piece : Cut(bytes, cuts)) {
    slices.emplace_back(piece.data(), piece.size());
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The bytes of `buffer`; its slices (references, not copies) go to `slices`.
inline std::string BufferBytes(const grpc::ByteBuffer& buffer,
                               std::vector<grpc::Slice>* slices) {
  std::string all;
  if (!buffer.Dump(slices).ok()) return all;
  for (const grpc::Slice& s : *slices) {
    all.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return all;
}

}  // namespace co2::testing

#endif  // CO2_TESTS_BYTE_PIECES_H_
