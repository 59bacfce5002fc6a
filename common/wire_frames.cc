#include "common/wire_frames.h"

#include <algorithm>
#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace co2::common {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;

// Keeps a payload's owner alive until gRPC drops its last reference to the
// slice that aliases the payload.
void ReleaseOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

}  // namespace

void AppendLengthDelimitedHeader(int field, size_t size, std::string* out) {
  uint8_t header[5 + 10];  // a varint32 tag and a varint64 length
  uint8_t* end = CodedOutputStream::WriteVarint32ToArray(
      WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      header);
  end = CodedOutputStream::WriteVarint64ToArray(size, end);
  out->append(reinterpret_cast<const char*>(header), end - header);
}

size_t LengthDelimitedHeaderSize(int field, size_t size) {
  return CodedOutputStream::VarintSize32(WireFormatLite::MakeTag(
             field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) +
         CodedOutputStream::VarintSize64(size);
}

grpc::ByteBuffer FrameWithPayload(std::string head, int payload_field,
                                  std::string_view payload,
                                  std::shared_ptr<const void> owner,
                                  std::string tail) {
  if (payload.empty()) {
    grpc::Slice only(head + tail);
    return grpc::ByteBuffer(&only, 1);
  }
  AppendLengthDelimitedHeader(payload_field, payload.size(), &head);
  grpc::Slice slices[3] = {
      grpc::Slice(head),
      grpc::Slice(const_cast<char*>(payload.data()), payload.size(),
                  &ReleaseOwner,
                  new std::shared_ptr<const void>(std::move(owner))),
      grpc::Slice(tail),
  };
  return grpc::ByteBuffer(slices, tail.empty() ? 2 : 3);
}

bool TakeSlices(grpc::ByteBuffer* buffer, std::vector<grpc::Slice>* slices,
                std::vector<std::string_view>* pieces) {
  slices->clear();
  pieces->clear();
  if (!buffer->Dump(slices).ok()) return false;
  buffer->Clear();
  pieces->reserve(slices->size());
  for (const grpc::Slice& slice : *slices) {
    pieces->emplace_back(reinterpret_cast<const char*>(slice.begin()),
                         slice.size());
  }
  return true;
}

WireReader::WireReader(std::vector<std::string_view> pieces)
    : pieces_(std::move(pieces)) {
  for (std::string_view p : pieces_) remaining_ += p.size();
}

bool WireReader::ReadTag(int* field, int* wire_type) {
  uint64_t tag = 0;
  if (!ReadVarint(&tag) || (tag >> 3) == 0 || (tag >> 3) > INT32_MAX) {
    return false;
  }
  *field = static_cast<int>(tag >> 3);
  *wire_type = static_cast<int>(tag & 7);
  return true;
}

bool WireReader::ReadVarint(uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t byte = 0;
    if (!ReadByte(&byte)) return false;
    *value |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

bool WireReader::ReadFixed64(uint64_t* value) {
  *value = 0;
  for (int i = 0; i < 8; ++i) {
    uint8_t byte = 0;
    if (!ReadByte(&byte)) return false;
    *value |= uint64_t{byte} << (8 * i);
  }
  return true;
}

bool WireReader::ReadLengthDelimited(std::vector<std::string_view>* out) {
  uint64_t length = 0;
  return ReadVarint(&length) && Take(length, out);
}

bool WireReader::Skip(int wire_type) {
  uint64_t value = 0;
  std::vector<std::string_view> ignored;
  switch (wire_type) {
    case WireFormatLite::WIRETYPE_VARINT:
      return ReadVarint(&value);
    case WireFormatLite::WIRETYPE_FIXED64:
      return Take(8, &ignored);
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
      return ReadLengthDelimited(&ignored);
    case WireFormatLite::WIRETYPE_FIXED32:
      return Take(4, &ignored);
    default:
      return false;
  }
}

bool WireReader::ReadByte(uint8_t* byte) {
  if (remaining_ == 0) return false;
  while (offset_ == pieces_[index_].size()) {
    ++index_;
    offset_ = 0;
  }
  *byte = static_cast<uint8_t>(pieces_[index_][offset_++]);
  --remaining_;
  return true;
}

bool WireReader::Take(uint64_t n, std::vector<std::string_view>* out) {
  if (n > remaining_) return false;
  out->clear();
  remaining_ -= n;
  while (n > 0) {
    if (offset_ == pieces_[index_].size()) {
      ++index_;
      offset_ = 0;
      continue;
    }
    const size_t k = std::min<uint64_t>(n, pieces_[index_].size() - offset_);
    out->push_back(pieces_[index_].substr(offset_, k));
    offset_ += k;
    n -= k;
  }
  return true;
}

}  // namespace co2::common
