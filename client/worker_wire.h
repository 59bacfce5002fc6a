// Worker wire: the worker's side of the Exchange stream, translated by hand
// (common/wire_frames.h) so that serialisation copies no payload; the shard's
// side is server/service/exchange_wire.h.
//
// - ExchangeMethod opens Exchange on a channel with raw (ByteBuffer)
//   messages, in place of the generated stub's protobuf ones.
// - SerializeContribution: the payload slice aliases the worker's send
//   buffer and holds a reference to it until gRPC has sent it.
// - ParseOuterUpdate: the payload stays in gRPC's receive slices, read in
//   place when the update is applied (common/payload_pieces.h), whatever
//   its codec.
//
// Pure functions and value types; any thread.
#ifndef CO2_CLIENT_WORKER_WIRE_H_
#define CO2_CLIENT_WORKER_WIRE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "co2/v1/aggregator.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/sync_stream.h"

namespace co2::client {

using ExchangeStream =
    grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// The Exchange method ("/co2.v1.Aggregator/Exchange") of one channel.
class ExchangeMethod {
 public:
  static constexpr char kName[] = "/co2.v1.Aggregator/Exchange";

  explicit ExchangeMethod(std::shared_ptr<grpc::Channel> channel);

  // Starts a call on `context` (borrowed; it must outlive the stream).
  std::unique_ptr<ExchangeStream> Open(grpc::ClientContext* context) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
};

// The fields of a v1::Contribution but its payload.
struct ContributionHeader {
  uint64_t round = 0;
  uint32_t chunk_index = 0;
  v1::Codec codec = v1::CODEC_FP32;
  double weight = 0;
};

// An ExchangeRequest carrying `open`.
grpc::ByteBuffer SerializeOpen(const v1::ExchangeOpen& open);

// An ExchangeRequest carrying the contribution `header` + `payload`, whose
// bytes are shared, not copied: the caller must not change them while
// `payload` is referenced by anyone else (gRPC holds a reference until the
// bytes are sent).
grpc::ByteBuffer SerializeContribution(
    const ContributionHeader& header,
    std::shared_ptr<const std::string> payload);

// One OuterUpdate chunk as received. Move-only: `payload` points into
// `slices`, which moving keeps in place and copying would not.
struct ReceivedUpdate {
  ReceivedUpdate() = default;
  ReceivedUpdate(ReceivedUpdate&&) = default;
  ReceivedUpdate& operator=(ReceivedUpdate&&) = default;

  uint64_t round = 0;
  uint32_t chunk_index = 0;
  int codec = 0;  // a co2.v1.Codec wire value
  uint64_t anchor_digest = 0;  // 0: none sent
  std::vector<std::string_view> payload;
  // Contributions the shard held out of this chunk's mean (outlier rule).
  std::vector<v1::HeldOutContribution> held_out;
  std::vector<grpc::Slice> slices;
};

// Reads an OuterUpdate out of `buffer` (leaving it empty). INVALID_ARGUMENT
// for bytes that are not one.
absl::StatusOr<ReceivedUpdate> ParseOuterUpdate(grpc::ByteBuffer* buffer);

}  // namespace co2::client

#endif  // CO2_CLIENT_WORKER_WIRE_H_
