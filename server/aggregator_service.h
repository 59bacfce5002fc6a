// AggregatorService: the co2.v1.Aggregator gRPC service of one shard, on the
// callback API. It only validates requests and translates between the wire
// and the JobRegistry / JobShard logic; no reaction blocks (the outer step
// runs on the registry's poller thread). Thread-safe; the registry is
// borrowed and must outlive the service.
#ifndef CO2_SERVER_AGGREGATOR_SERVICE_H_
#define CO2_SERVER_AGGREGATOR_SERVICE_H_

#include "co2/v1/aggregator.grpc.pb.h"
#include "server/job_registry.h"

namespace co2::server {

// Ids (job, worker) longer than this are rejected with INVALID_ARGUMENT.
inline constexpr size_t kMaxIdLength = 128;

// The callback service, with Exchange on the raw (ByteBuffer) API so that
// payloads cross it without protobuf copies (see exchange_wire.h).
using AggregatorCallbackService = v1::Aggregator::WithCallbackMethod_Join<
    v1::Aggregator::WithCallbackMethod_Seed<
        v1::Aggregator::WithCallbackMethod_Fetch<
            v1::Aggregator::WithRawCallbackMethod_Exchange<
                v1::Aggregator::WithCallbackMethod_Heartbeat<
                    v1::Aggregator::WithCallbackMethod_Leave<
                        v1::Aggregator::Service>>>>>>;

class AggregatorService final : public AggregatorCallbackService {
 public:
  explicit AggregatorService(JobRegistry* registry) : registry_(registry) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerReadReactor<v1::AnchorChunk>* Seed(
      grpc::CallbackServerContext* context,
      v1::SeedResponse* response) override;
  grpc::ServerWriteReactor<v1::AnchorChunk>* Fetch(
      grpc::CallbackServerContext* context,
      const v1::FetchRequest* request) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;

 private:
  JobRegistry* const registry_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_AGGREGATOR_SERVICE_H_
