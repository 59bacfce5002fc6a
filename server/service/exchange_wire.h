// Exchange wire: the bytes of the Exchange stream, translated by hand so that
// payloads are never copied by serialisation. The service runs Exchange on
// gRPC's raw (ByteBuffer) callback API and uses these two functions:
//
// - SerializeUpdate turns one OuterUpdate chunk into a ByteBuffer whose
//   payload slice aliases the message's payload string (kept alive by a
//   reference to the shared message): every stream writes the same bytes,
//   and no stream holds a serialised copy of the update.
// - ParseExchangeRequest reads an ExchangeRequest out of the received
//   ByteBuffer; a contribution's payload stays in gRPC's slices and is handed
//   on as pieces, so the only pass that writes it is the accumulation.
//
// The bytes are the co2.v1 protobuf encoding, written and read with
// common/wire_frames.h; workers do the same on their side
// (client/worker_wire.h), and any gRPC client with the generated stubs works
// too. Pure functions; any thread.
#ifndef CO2_SERVER_SERVICE_EXCHANGE_WIRE_H_
#define CO2_SERVER_SERVICE_EXCHANGE_WIRE_H_

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "co2/v1/aggregator.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/job/job_shard.h"

namespace co2::server {

// One ExchangeRequest: the stream's opening message or a contribution. The
// contribution's payload pieces point into `slices`, which hold references
// to gRPC's receive buffers: valid while this message lives.
struct ExchangeMessage {
  std::optional<v1::ExchangeOpen> open;
  std::optional<ContributionView> contribution;
  std::vector<grpc::Slice> slices;
  std::vector<std::string_view> payload;
};

// Reads `buffer` (and leaves it empty). INVALID_ARGUMENT for bytes that are
// not an ExchangeRequest, or one that carries neither open nor contribution.
absl::StatusOr<ExchangeMessage> ParseExchangeRequest(grpc::ByteBuffer* buffer);

// The serialised `update`; its payload bytes are shared, not copied.
grpc::ByteBuffer SerializeUpdate(std::shared_ptr<const v1::OuterUpdate> update);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_EXCHANGE_WIRE_H_
