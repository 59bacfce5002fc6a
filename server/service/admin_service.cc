#include "server/service/admin_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/service/aggregator_service.h"
#include "server/service/call_auth.h"

namespace co2::server {

grpc::ServerUnaryReactor* AdminService::ListJobs(
    grpc::CallbackServerContext* context,
    const v1::ListJobsRequest* /*request*/, v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status access =
      refused_->Check(CheckAdminAccess(*context), context->peer());
  if (access.ok()) {
    for (v1::JobSummary& job : registry_->List()) {
      *response->add_jobs() = std::move(job);
    }
  }
  reactor->Finish(common::ToGrpcStatus(access));
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::DeleteJob(
    grpc::CallbackServerContext* context, const v1::DeleteJobRequest* request,
    v1::DeleteJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status =
      refused_->Check(CheckAdminAccess(*context), context->peer());
  if (status.ok() && request->job().empty()) {
    status = absl::InvalidArgumentError("DeleteJobRequest.job is empty");
  }
  if (status.ok() && request->job().size() > kMaxIdLength) {
    status = absl::InvalidArgumentError(
        absl::StrCat("DeleteJobRequest.job is ", request->job().size(),
                     " bytes long (limit ", kMaxIdLength, ")"));
  }
  if (!status.ok()) {
    reactor->Finish(common::ToGrpcStatus(status));
    return reactor;
  }
  registry_->Delete(
      request->job(),
      [reactor, response](absl::StatusOr<std::vector<std::string>> removed) {
        if (removed.ok()) {
          for (std::string& file : *removed) {
            response->add_removed_files(std::move(file));
          }
        }
        reactor->Finish(common::ToGrpcStatus(removed.status()));
      });
  return reactor;
}

}  // namespace co2::server
