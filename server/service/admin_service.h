// AdminService: the co2.v1.AggregatorAdmin gRPC service of one shard: lists
// the shard's jobs and deletes one, for operators (co2-admin). It validates,
// checks that the call carries the admin token when the shard checks tokens
// (server/service/call_auth.h), and translates to the JobRegistry; a deletion
// runs on the registry's poller thread and the reaction finishes from there.
// Thread-safe; the registry is borrowed and must outlive the service.
#ifndef CO2_SERVER_SERVICE_ADMIN_SERVICE_H_
#define CO2_SERVER_SERVICE_ADMIN_SERVICE_H_

#include "co2/v1/aggregator.grpc.pb.h"
#include "server/job/job_registry.h"
#include "server/service/refused_calls.h"

namespace co2::server {

class AdminService final : public v1::AggregatorAdmin::CallbackService {
 public:
  // `registry` and `refused` are borrowed and must outlive the service.
  AdminService(JobRegistry* registry, RefusedCalls* refused)
      : registry_(registry), refused_(refused) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;

 private:
  JobRegistry* const registry_;
  RefusedCalls* const
      refused_;  // logs and counts calls refused for credentials
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_ADMIN_SERVICE_H_
