#include "server/service/rpc_wire.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/wire_frames.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace co2::server {

absl::Status ParseRequest(const grpc::ByteBuffer& buffer,
                          google::protobuf::MessageLite* message) {
  // The copy shares the received slices; the reader consumes it.
  grpc::ByteBuffer bytes(buffer);
  grpc::ProtoBufferReader reader(&bytes);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", message->GetTypeName(), ": the ", buffer.Length(),
        "-byte body is not its protobuf encoding"));
  }
  return absl::OkStatus();
}

grpc::ByteBuffer SerializeMessage(
    const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer SerializeAnchorChunk(
    const std::shared_ptr<const AnchorSnapshot>& snapshot, size_t chunk) {
  const v1::AnchorChunk& message = snapshot->chunks[chunk];
  // Every field but the payload, the highest-numbered one: the head and then
  // the payload are the message's own encoding.
  v1::AnchorChunk fields;
  fields.set_anchor_round(message.anchor_round());
  fields.set_chunk_index(message.chunk_index());
  return common::FrameWithPayload(fields.SerializeAsString(),
                                  v1::AnchorChunk::kPayloadFieldNumber,
                                  message.payload(), snapshot);
}

}  // namespace co2::server
