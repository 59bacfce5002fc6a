// HealthServer: a plaintext gRPC server that serves only the standard health
// service (grpc.health.v1.Health, reporting SERVING for the whole server).
// Kubernetes' native gRPC probes speak neither TLS nor bearer tokens, so a
// shard that serves its Aggregator service over TLS answers probes here, on a
// port of its own that carries no training data. Start/Shutdown from one
// thread; port() from any.
#ifndef CO2_SERVER_SERVICE_HEALTH_SERVER_H_
#define CO2_SERVER_SERVICE_HEALTH_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace co2::server {

class HealthServer {
 public:
  // Binds `address` (host:port, port 0 picks one) and reports SERVING.
  // UNAVAILABLE naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& address);
  ~HealthServer();  // Shutdown(absl::ZeroDuration()) if still running

  // Reports NOT_SERVING (probes fail from now on), then stops.
  void Shutdown(absl::Duration grace);
  int port() const { return port_; }

 private:
  HealthServer() = default;

  // Answers every other method UNIMPLEMENTED; it also gives the server the
  // callback machinery the (callback) health service needs to start.
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_HEALTH_SERVER_H_
