#include "server/service/exchange_wire.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_frames.h"
#include "google/protobuf/wire_format_lite.h"

namespace co2::server {
namespace {

using common::WireReader;
using google::protobuf::internal::WireFormatLite;

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ExchangeRequest: ", std::string(what)));
}

// Reads a Contribution's fields; its payload stays in `message->payload`.
absl::Status ParseContribution(WireReader reader, ExchangeMessage* message) {
  ContributionView c;
  message->payload.clear();
  while (!reader.done()) {
    int field = 0, type = 0;
    if (!reader.ReadTag(&field, &type)) {
      return Malformed("truncated contribution");
    }
    uint64_t value = 0;
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
      ok = reader.ReadLengthDelimited(&message->payload);
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
  // copy the payload): those numbered below it ahead of it and
  // anchor_digest and held_out after it, so that the frame is the message's
  // own encoding.
  v1::OuterUpdate fields;
  fields.set_round(update->round());
  fields.set_anchor_round(update->anchor_round());
  fields.set_chunk_index(update->chunk_index());
  fields.set_num_chunks(update->num_chunks());
  fields.set_codec(update->codec());
  fields.set_contributors(update->contributors());
  v1::OuterUpdate tail;
  tail.set_anchor_digest(update->anchor_digest());
  *tail.mutable_held_out() = update->held_out();
  const std::string_view payload = update->payload();
  return common::FrameWithPayload(fields.SerializeAsString(),
                                  v1::OuterUpdate::kPayloadFieldNumber, payload,
                                  std::move(update), tail.SerializeAsString());
}

absl::StatusOr<ExchangeMessage> ParseExchangeRequest(grpc::ByteBuffer* buffer) {
  ExchangeMessage message;
  std::vector<std::string_view> pieces;
  if (!common::TakeSlices(buffer, &message.slices, &pieces)) {
    return Malformed("unreadable");
  }
  WireReader reader(std::move(pieces));
  while (!reader.done()) {
    int field = 0, type = 0;
    if (!reader.ReadTag(&field, &type)) return Malformed("truncated tag");
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        (field != v1::ExchangeRequest::kOpenFieldNumber &&
         field != v1::ExchangeRequest::kContributionFieldNumber)) {
      if (!reader.Skip(type)) return Malformed(absl::StrCat("field ", field));
      continue;
    }
    std::vector<std::string_view> body;
    if (!reader.ReadLengthDelimited(&body)) {
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
