// AggregatorService: the co2.v1.Aggregator gRPC service of one shard, on the
// callback API. It only validates requests and translates between the wire
// and the JobRegistry / JobShard logic; no reaction blocks: the outer step
// runs on the registry's poller thread, and a replayed update that is kept
// only in its checkpoint is read on the service's ReadThread. Thread-safe;
// the registry is borrowed and must outlive the service, which must outlive
// the server's shutdown.
#ifndef CO2_SERVER_SERVICE_AGGREGATOR_SERVICE_H_
#define CO2_SERVER_SERVICE_AGGREGATOR_SERVICE_H_

#include "co2/v1/aggregator.grpc.pb.h"
#include "server/job/job_registry.h"
#include "server/service/read_thread.h"
#include "server/service/refused_calls.h"

namespace co2::server {

// Ids (job, worker) longer than this are rejected with INVALID_ARGUMENT.
inline constexpr size_t kMaxIdLength = 128;

// The callback service, every method on the raw (ByteBuffer) API: the
// service parses each request itself, so that a malformed body is answered
// INVALID_ARGUMENT (rpc_wire.h), and Exchange and Fetch payloads cross it
// without protobuf copies (exchange_wire.h, rpc_wire.h).
using AggregatorCallbackService = v1::Aggregator::WithRawCallbackMethod_Join<
    v1::Aggregator::WithRawCallbackMethod_Seed<
        v1::Aggregator::WithRawCallbackMethod_Fetch<
            v1::Aggregator::WithRawCallbackMethod_Exchange<
                v1::Aggregator::WithRawCallbackMethod_Heartbeat<
                    v1::Aggregator::WithRawCallbackMethod_Leave<
                        v1::Aggregator::Service>>>>>>;

class AggregatorService final : public AggregatorCallbackService {
 public:
  // `registry` and `refused` are borrowed and must outlive the service.
  AggregatorService(JobRegistry* registry, RefusedCalls* refused)
      : registry_(registry), refused_(refused) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Seed(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  JobRegistry* const registry_;
  RefusedCalls* const
      refused_;       // logs and counts calls refused for credentials
  ReadThread reads_;  // checkpoint reads for replays
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_AGGREGATOR_SERVICE_H_
