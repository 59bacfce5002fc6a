#include "server/exchange_wire.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/slice.h"

namespace co2::server {
namespace {

using google::protobuf::internal::WireFormatLite;

// Keeps the shared message, and so the payload a slice points into, alive
// until gRPC drops its last reference to that slice.
void ReleaseUpdate(void* held) {
  delete static_cast<std::shared_ptr<const v1::OuterUpdate>*>(held);
}

// Reads protobuf wire format from a sequence of byte pieces, in place.
class WireReader {
 public:
  explicit WireReader(std::vector<std::string_view> pieces)
      : pieces_(std::move(pieces)) {
    for (std::string_view p : pieces_) remaining_ += p.size();
  }

  bool done() const { return remaining_ == 0; }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool ReadFixed64(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < 8; ++i) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= uint64_t{byte} << (8 * i);
    }
    return true;
  }

  // The next `n` bytes, as views into the pieces.
  bool Take(uint64_t n, std::vector<std::string_view>* out) {
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

  // Skips the value of a field of `wire_type` (groups are not supported).
  bool Skip(int wire_type) {
    uint64_t value = 0;
    std::vector<std::string_view> ignored;
    switch (wire_type) {
      case WireFormatLite::WIRETYPE_VARINT:
        return ReadVarint(&value);
      case WireFormatLite::WIRETYPE_FIXED64:
        return Take(8, &ignored);
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return ReadVarint(&value) && Take(value, &ignored);
      case WireFormatLite::WIRETYPE_FIXED32:
        return Take(4, &ignored);
      default:
        return false;
    }
  }

 private:
  bool ReadByte(uint8_t* byte) {
    if (remaining_ == 0) return false;
    while (offset_ == pieces_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
    *byte = static_cast<uint8_t>(pieces_[index_][offset_++]);
    --remaining_;
    return true;
  }

  std::vector<std::string_view> pieces_;
  size_t index_ = 0;   // the piece being read
  size_t offset_ = 0;  // in it
  uint64_t remaining_ = 0;
};

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ExchangeRequest: ", std::string(what)));
}

// Reads a Contribution's fields; its payload stays in `message->payload`.
absl::Status ParseContribution(WireReader reader, ExchangeMessage* message) {
  ContributionView c;
  message->payload.clear();
  while (!reader.done()) {
    uint64_t tag = 0, value = 0;
    if (!reader.ReadVarint(&tag)) return Malformed("truncated contribution");
    const int field = static_cast<int>(tag >> 3);
    const int type = static_cast<int>(tag & 7);
    bool ok = true;
    if (field == v1::Contribution::kRoundFieldNumber &&
        type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      c.round = value;
    } else if (field == v1::Contribution::kChunkIndexFieldNumber &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      c.chunk_index = static_cast<uint32_t>(value);
    } else if (field == v1::Contribution::kCodecFieldNumber &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      c.codec = static_cast<int>(static_cast<int32_t>(value));
    } else if (field == v1::Contribution::kWeightFieldNumber &&
               type == WireFormatLite::WIRETYPE_FIXED64) {
      ok = reader.ReadFixed64(&value);
      c.weight = WireFormatLite::DecodeDouble(value);
    } else if (field == v1::Contribution::kPayloadFieldNumber &&
               type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      ok = reader.ReadVarint(&value) && reader.Take(value, &message->payload);
    } else {
      ok = reader.Skip(type);
    }
    if (!ok) return Malformed(absl::StrCat("contribution field ", field));
  }
  c.payload = message->payload;
  message->open.reset();
  message->contribution = c;
  return absl::OkStatus();
}

}  // namespace

grpc::ByteBuffer SerializeUpdate(
    std::shared_ptr<const v1::OuterUpdate> update) {
  // Every field but the payload (set one by one: copying the message would
  // copy the payload), then the payload's tag and length: payload is the
  // highest-numbered field, so this is the message's own encoding.
  v1::OuterUpdate fields;
  fields.set_round(update->round());
  fields.set_anchor_round(update->anchor_round());
  fields.set_chunk_index(update->chunk_index());
  fields.set_num_chunks(update->num_chunks());
  fields.set_codec(update->codec());
  fields.set_contributors(update->contributors());
  std::string head = fields.SerializeAsString();
  const std::string& payload = update->payload();
  if (payload.empty()) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  head.push_back(static_cast<char>(
      WireFormatLite::MakeTag(v1::OuterUpdate::kPayloadFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED)));
  uint8_t length[5];  // a varint32 takes at most 5 bytes
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(payload.size()), length);
  head.append(reinterpret_cast<const char*>(length), end - length);
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(
          const_cast<char*>(payload.data()), payload.size(), &ReleaseUpdate,
          new std::shared_ptr<const v1::OuterUpdate>(std::move(update))),
  };
  return grpc::ByteBuffer(slices, 2);
}

absl::StatusOr<ExchangeMessage> ParseExchangeRequest(grpc::ByteBuffer* buffer) {
  ExchangeMessage message;
  if (!buffer->Dump(&message.slices).ok()) return Malformed("unreadable");
  buffer->Clear();
  std::vector<std::string_view> pieces;
  pieces.reserve(message.slices.size());
  for (const grpc::Slice& slice : message.slices) {
    pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                        slice.size());
  }
  WireReader reader(std::move(pieces));
  while (!reader.done()) {
    uint64_t tag = 0, length = 0;
    if (!reader.ReadVarint(&tag)) return Malformed("truncated tag");
    const int field = static_cast<int>(tag >> 3);
    const int type = static_cast<int>(tag & 7);
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        (field != v1::ExchangeRequest::kOpenFieldNumber &&
         field != v1::ExchangeRequest::kContributionFieldNumber)) {
      if (!reader.Skip(type)) return Malformed(absl::StrCat("field ", field));
      continue;
    }
    std::vector<std::string_view> body;
    if (!reader.ReadVarint(&length) || !reader.Take(length, &body)) {
      return Malformed(absl::StrCat("truncated field ", field));
    }
    if (field == v1::ExchangeRequest::kContributionFieldNumber) {
      CO2_RETURN_IF_ERROR(
          ParseContribution(WireReader(std::move(body)), &message));
      continue;
    }
    // The opening message is small: parsed by protobuf from a copy.
    v1::ExchangeOpen open;
    std::string bytes;
    for (std::string_view b : body) bytes.append(b);
    if (!open.ParseFromString(bytes)) return Malformed("open");
    message.contribution.reset();
    message.payload.clear();
    message.open = std::move(open);
  }
  if (!message.open && !message.contribution) {
    return absl::InvalidArgumentError(
        "an ExchangeRequest must carry open or contribution");
  }
  return message;
}

}  // namespace co2::server
