#include "client/shard_calls.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/grpc_status.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace co2::client {

std::shared_ptr<grpc::Channel> MakeShardChannel(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration initial_backoff, absl::Duration max_backoff) {
  const int initial_ms =
      static_cast<int>(absl::ToInt64Milliseconds(initial_backoff));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  args.SetMaxSendMessageSize(8 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(max_backoff)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<uint64_t> SeedAnchor(v1::Aggregator::Stub* stub,
                                    const std::string& job,
                                    const std::string& worker_id,
                                    uint64_t anchor_round,
                                    absl::Span<const float> range,
                                    absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::SeedResponse response;
  auto writer = stub->Seed(&context, &response);
  v1::AnchorChunk chunk;
  chunk.set_job(job);
  chunk.set_worker_id(worker_id);
  chunk.set_anchor_round(anchor_round);
  for (size_t c = 0; c < common::NumChunks(range.size()); ++c) {
    const common::Range r = common::ChunkRange(range.size(), c);
    chunk.set_chunk_index(static_cast<uint32_t>(c));
    std::string* payload = chunk.mutable_payload();
    payload->resize(r.size() * sizeof(float));
    common::Encode(common::Codec::kFp32, range.subspan(r.begin, r.size()),
                   absl::MakeSpan(payload->data(), payload->size()));
    if (!writer->Write(chunk)) break;  // Finish says why
  }
  writer->WritesDone();
  CO2_RETURN_IF_ERROR(common::FromGrpcStatus(writer->Finish()));
  return response.anchor_round();
}

absl::StatusOr<uint64_t> FetchAnchorChunks(
    v1::Aggregator::Stub* stub, const std::string& job,
    const std::string& worker_id, size_t elements, absl::Time deadline,
    absl::FunctionRef<absl::Status(common::Range, const std::string&)> visit) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::FetchRequest request;
  request.set_job(job);
  request.set_worker_id(worker_id);
  auto reader = stub->Fetch(&context, request);
  const size_t chunks = common::NumChunks(elements);
  std::vector<bool> have(chunks, false);
  size_t received = 0;
  uint64_t anchor_round = 0;
  absl::Status status;
  v1::AnchorChunk chunk;
  while (reader->Read(&chunk)) {
    if (!status.ok()) continue;  // cancelled; read to the end
    if (chunk.chunk_index() >= chunks) {
      status = absl::InternalError(absl::StrCat(
          "fetch chunk ", chunk.chunk_index(), " out of ", chunks));
    } else if (received > 0 && chunk.anchor_round() != anchor_round) {
      status = absl::InternalError(absl::StrCat(
          "fetch chunk ", chunk.chunk_index(), " is of anchor round ",
          chunk.anchor_round(), ", the chunks before it of ", anchor_round));
    } else {
      const common::Range r = common::ChunkRange(elements, chunk.chunk_index());
      status =
          common::Validate(common::Codec::kFp32, chunk.payload(), r.size());
      if (status.ok()) status = visit(r, chunk.payload());
      if (status.ok()) {
        anchor_round = chunk.anchor_round();
        if (!have[chunk.chunk_index()]) ++received;
        have[chunk.chunk_index()] = true;
      }
    }
    if (!status.ok()) context.TryCancel();
  }
  const absl::Status finish = common::FromGrpcStatus(reader->Finish());
  CO2_RETURN_IF_ERROR(status);
  CO2_RETURN_IF_ERROR(finish);
  if (received != chunks) {
    return absl::DataLossError(absl::StrCat("fetch ended after ", received,
                                            " of ", chunks, " anchor chunks"));
  }
  return anchor_round;
}

absl::StatusOr<uint64_t> FetchAnchor(v1::Aggregator::Stub* stub,
                                     const std::string& job,
                                     const std::string& worker_id,
                                     absl::Span<float> range,
                                     absl::Time deadline) {
  return FetchAnchorChunks(stub, job, worker_id, range.size(), deadline,
                           [&](common::Range r, const std::string& payload) {
                             common::Decode(common::Codec::kFp32, payload,
                                            range.subspan(r.begin, r.size()));
                             return absl::OkStatus();
                           });
}

absl::StatusOr<AnchorComparison> CompareAnchor(v1::Aggregator::Stub* stub,
                                               const std::string& job,
                                               const std::string& worker_id,
                                               absl::Span<const float> range,
                                               absl::Time deadline) {
  AnchorComparison out;
  std::vector<float> theirs;
  CO2_ASSIGN_OR_RETURN(
      out.anchor_round,
      FetchAnchorChunks(
          stub, job, worker_id, range.size(), deadline,
          [&](common::Range r, const std::string& payload) {
            theirs.resize(r.size());
            common::Decode(common::Codec::kFp32, payload,
                           absl::MakeSpan(theirs));
            const absl::Span<const float> ours =
                range.subspan(r.begin, r.size());
            if (std::memcmp(theirs.data(), ours.data(),
                            r.size() * sizeof(float)) == 0) {
              return absl::OkStatus();
            }
            size_t i = 0;
            while (std::memcmp(&theirs[i], &ours[i], sizeof(float)) == 0) ++i;
            out.first_difference = std::min(out.first_difference, r.begin + i);
            return absl::OkStatus();
          }));
  return out;
}

absl::StatusOr<LeaseRenewal> RenewLease(v1::Aggregator::Stub* stub,
                                        const std::string& job,
                                        const std::string& worker_id,
                                        absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::HeartbeatRequest request;
  request.set_job(job);
  request.set_worker_id(worker_id);
  v1::HeartbeatResponse response;
  CO2_RETURN_IF_ERROR(
      common::FromGrpcStatus(stub->Heartbeat(&context, request, &response)));
  return LeaseRenewal{absl::Milliseconds(response.lease_ms()),
                      response.update_held()};
}

}  // namespace co2::client
