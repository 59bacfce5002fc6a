// RPC wire: the bytes of Join, Seed, Fetch, Heartbeat and Leave. The service
// runs every RPC on gRPC's raw (ByteBuffer) callback API and parses requests
// itself, so that a body that is not the request's protobuf encoding is
// answered INVALID_ARGUMENT naming the message type, as for Exchange
// (exchange_wire.h); gRPC's own parsing would answer UNIMPLEMENTED with no
// message.
//
// A Fetch chunk is written without copying its payload: its slice aliases
// the shared anchor snapshot, which the frame keeps alive.
//
// Pure functions; any thread.
#ifndef CO2_SERVER_SERVICE_RPC_WIRE_H_
#define CO2_SERVER_SERVICE_RPC_WIRE_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/job/anchor_snapshot.h"

namespace co2::server {

// Parses `buffer` into `message`. INVALID_ARGUMENT "malformed <type>: ..."
// for bytes that are not a valid encoding of it.
absl::Status ParseRequest(const grpc::ByteBuffer& buffer,
                          google::protobuf::MessageLite* message);

// `message` serialised.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);

// Chunk `chunk` of `snapshot` serialised; its payload is shared, not copied.
grpc::ByteBuffer SerializeAnchorChunk(
    const std::shared_ptr<const AnchorSnapshot>& snapshot, size_t chunk);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_RPC_WIRE_H_
