// AggregatorServer: one running aggregator shard: a gRPC server on a port
// with the AggregatorService, the JobRegistry behind it and the standard
// health service. Used by the co2-aggregator binary, by co2-train's embedded
// aggregator and by tests. Start/Shutdown from one thread; port() from any.
#ifndef CO2_SERVER_SERVICE_AGGREGATOR_SERVER_H_
#define CO2_SERVER_SERVICE_AGGREGATOR_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tls_config.h"
#include "server/job/job_registry.h"
#include "server/service/call_auth.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace co2::server {

class AdminService;
class AggregatorService;
class RefusedCalls;

struct AggregatorServerOptions {
  std::string address = "0.0.0.0:0";  // host:port; port 0 picks a free one
  JobRegistryOptions registry;        // shard index, shard count, limits
  // Largest message accepted (a 256 KiB chunk plus headers fits easily).
  int max_message_bytes = 8 << 20;
  // HTTP/2 receive windows of the worker streams: what a worker may have
  // sent that no read asked for yet, held in the shard's memory. By
  // default (0) each window grows with its path (gRPC's BDP probe: about
  // twice the bytes in flight over the round trip), and all of them share
  // `stream_memory_bytes` of gRPC memory quota, whose pressure shrinks the
  // windows again as it fills: a long path is filled, and memory stays
  // bounded whatever the number of workers. A positive value fixes every
  // window at that size instead (BDP probe off): a stream then moves at
  // most about that much per round trip.
  int stream_window_bytes = 0;
  int64_t stream_memory_bytes = int64_t{256} << 20;
  // TLS, or mTLS with tls.require_client_cert. Left empty it is plaintext:
  // for in-process use and tests on loopback only; co2-aggregator refuses
  // plaintext unless --insecure.
  common::TlsOptions tls;
  // Bearer tokens checked on every call (needs tls); empty = none checked.
  // tokens.admin (needs job tokens) opens the admin service (co2-admin).
  JobTokens tokens;
  common::Clock* clock = common::Clock::Real();  // borrowed
};

class AggregatorServer {
 public:
  // Binds and starts serving; UNAVAILABLE naming the address if it can't bind,
  // the TLS file errors, INVALID_ARGUMENT for tokens without TLS.
  static absl::StatusOr<std::unique_ptr<AggregatorServer>> Start(
      const AggregatorServerOptions& options);
  ~AggregatorServer();  // Shutdown(absl::ZeroDuration()) if still running

  // Stops accepting calls, cancels the ones still open after `grace`, and
  // returns once every reaction is done.
  void Shutdown(absl::Duration grace);
  // Blocks until Shutdown is called from another thread.
  void Wait();

  int port() const { return port_; }
  JobRegistry* registry() { return registry_.get(); }

 private:
  AggregatorServer() = default;

  std::unique_ptr<JobRegistry> registry_;
  // Calls refused for their credentials, by either service (one log limit).
  std::unique_ptr<RefusedCalls> refused_;
  std::unique_ptr<AggregatorService> service_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_AGGREGATOR_SERVER_H_
