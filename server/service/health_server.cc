#include "server/service/health_server.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/grpc.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace co2::server {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& address) {
  std::unique_ptr<HealthServer> health(new HealthServer());
  // The default health service is added to every server built while this is
  // on; it is the only service of this one.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &health->port_);
  // A second process on the same port would answer for this one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  health->unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  builder.RegisterCallbackGenericService(health->unimplemented_.get());
  health->server_ = builder.BuildAndStart();
  if (health->server_ == nullptr || health->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC health on ", address,
                     " (address in use or invalid?)"));
  }
  health->server_->GetHealthCheckService()->SetServingStatus(true);
  CO2_LOG(INFO) << "gRPC health (plaintext) on port " << health->port_;
  return health;
}

HealthServer::~HealthServer() { Shutdown(absl::ZeroDuration()); }

void HealthServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace co2::server
