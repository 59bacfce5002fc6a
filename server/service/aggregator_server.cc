#include "server/service/aggregator_server.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/service/admin_service.h"
#include "server/service/aggregator_service.h"

namespace co2::server {

namespace {
constexpr int64_t kMinStreamMemoryBytes = int64_t{16} << 20;
}  // namespace

absl::StatusOr<std::unique_ptr<AggregatorServer>> AggregatorServer::Start(
    const AggregatorServerOptions& options) {
  if (options.stream_window_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_window_bytes is ", options.stream_window_bytes,
        ": must be 0 (windows that grow with the path) or a size in bytes"));
  }
  if (options.stream_memory_bytes < kMinStreamMemoryBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_memory_bytes is ", options.stream_memory_bytes,
        ": must be at least ", kMinStreamMemoryBytes,
        " (16 MiB: gRPC's own buffers come out of it too)"));
  }
  std::unique_ptr<AggregatorServer> server(new AggregatorServer());
  server->registry_ =
      std::make_unique<JobRegistry>(options.registry, options.clock);
  server->refused_ = std::make_unique<RefusedCalls>(
      options.registry.shard_index, options.registry.shard.observer,
      options.clock);
  server->service_ = std::make_unique<AggregatorService>(
      server->registry_.get(), server->refused_.get());
  server->admin_ = std::make_unique<AdminService>(server->registry_.get(),
                                                  server->refused_.get());
  if (!options.tokens.admin.empty() && options.tokens.empty()) {
    return absl::InvalidArgumentError(
        "an admin token needs job tokens: a shard without them checks no "
        "token and takes admin calls from every client");
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    CO2_ASSIGN_OR_RETURN(credentials,
                         MakeShardCredentials(options.tls, options.tokens));
  } else if (!options.tokens.empty()) {
    return absl::InvalidArgumentError(
        "bearer tokens need TLS (a certificate and key): gRPC checks them "
        "only on secure connections");
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->admin_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.stream_window_bytes > 0) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               options.stream_window_bytes);
  } else {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  }
  grpc::ResourceQuota quota("co2-aggregator-streams");
  quota.Resize(static_cast<size_t>(options.stream_memory_bytes));
  builder.SetResourceQuota(quota);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.address, " (address in use or invalid?)"));
  }
  CO2_LOG(INFO) << "aggregator shard " << options.registry.shard_index << "/"
                << options.registry.num_shards << " listening on port "
                << server->port_
                << (options.tls.enabled()
                        ? (options.tls.require_client_cert ? " (mTLS" : " (TLS")
                        : " (plaintext")
                << (options.tokens.empty() ? ")" : ", bearer tokens)");
  return server;
}

AggregatorServer::~AggregatorServer() { Shutdown(absl::ZeroDuration()); }

void AggregatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;  // never started
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

void AggregatorServer::Wait() { server_->Wait(); }

}  // namespace co2::server
