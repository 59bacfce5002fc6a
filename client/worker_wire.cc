#include "client/worker_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire_frames.h"
#include "google/protobuf/wire_format_lite.h"

namespace co2::client {
namespace {

using google::protobuf::internal::WireFormatLite;

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed OuterUpdate: ", std::string(what)));
}

}  // namespace

ExchangeMethod::ExchangeMethod(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      method_(kName, grpc::internal::RpcMethod::BIDI_STREAMING, channel_) {}

// gRPC 1.51 has no public synchronous generic stub (GenericStub is async or
// callback only); this is the call the generated stub's Exchange makes.
std::unique_ptr<ExchangeStream> ExchangeMethod::Open(
    grpc::ClientContext* context) const {
  return std::unique_ptr<ExchangeStream>(
      grpc::internal::ClientReaderWriterFactory<
          grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(), method_,
                                                      context));
}

grpc::ByteBuffer SerializeOpen(const v1::ExchangeOpen& open) {
  v1::ExchangeRequest request;
  *request.mutable_open() = open;
  grpc::Slice only(request.SerializeAsString());
  return grpc::ByteBuffer(&only, 1);
}

grpc::ByteBuffer SerializeContribution(
    const ContributionHeader& header,
    std::shared_ptr<const std::string> payload) {
  // The contribution's fields but its payload (its last field), inside the
  // ExchangeRequest's contribution field, whose length counts the payload.
  v1::Contribution fields;
  fields.set_round(header.round);
  fields.set_chunk_index(header.chunk_index);
  fields.set_codec(header.codec);
  fields.set_weight(header.weight);
  const std::string serialized = fields.SerializeAsString();
  const std::string_view bytes = *payload;
  size_t length = serialized.size();
  if (!bytes.empty()) {
    length += common::LengthDelimitedHeaderSize(
                  v1::Contribution::kPayloadFieldNumber, bytes.size()) +
              bytes.size();
  }
  std::string head;
  common::AppendLengthDelimitedHeader(
      v1::ExchangeRequest::kContributionFieldNumber, length, &head);
  head += serialized;
  return common::FrameWithPayload(std::move(head),
                                  v1::Contribution::kPayloadFieldNumber, bytes,
                                  std::move(payload));
}

absl::StatusOr<ReceivedUpdate> ParseOuterUpdate(grpc::ByteBuffer* buffer) {
  ReceivedUpdate update;
  std::vector<std::string_view> pieces;
  if (!common::TakeSlices(buffer, &update.slices, &pieces)) {
    return Malformed("unreadable");
  }
  common::WireReader reader(std::move(pieces));
  while (!reader.done()) {
    int field = 0, type = 0;
    if (!reader.ReadTag(&field, &type)) return Malformed("truncated tag");
    uint64_t value = 0;
    bool ok = true;
    if (field == v1::OuterUpdate::kRoundFieldNumber &&
        type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      update.round = value;
    } else if (field == v1::OuterUpdate::kChunkIndexFieldNumber &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      update.chunk_index = static_cast<uint32_t>(value);
    } else if (field == v1::OuterUpdate::kCodecFieldNumber &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      ok = reader.ReadVarint(&value);
      update.codec = static_cast<int>(static_cast<int32_t>(value));
    } else if (field == v1::OuterUpdate::kAnchorDigestFieldNumber &&
               type == WireFormatLite::WIRETYPE_FIXED64) {
      ok = reader.ReadFixed64(&update.anchor_digest);
    } else if (field == v1::OuterUpdate::kPayloadFieldNumber &&
               type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      ok = reader.ReadLengthDelimited(&update.payload);
    } else if (field == v1::OuterUpdate::kHeldOutFieldNumber &&
               type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      // Small and rare: parsed by protobuf from a copy.
      std::vector<std::string_view> body;
      ok = reader.ReadLengthDelimited(&body);
      std::string bytes;
      for (const std::string_view b : body) bytes.append(b);
      ok = ok && update.held_out.emplace_back().ParseFromString(bytes);
    } else {
      ok = reader.Skip(type);
    }
    if (!ok) return Malformed(absl::StrCat("field ", field));
  }
  return update;
}

}  // namespace co2::client
