// TLS material for co2's gRPC channels, read from PEM files, and the client's
// channel credentials built from it (TLS, optionally with a client
// certificate for mTLS, optionally with a bearer token sent on every call);
// a shard's credentials are built in server/service/call_auth.h. Plaintext is
// never a default: callers that want it say so (AggregatorServerOptions /
// ClientOptions leave `tls` empty only for in-process use; co2-aggregator needs
// --insecure for it). Pure functions; any thread.
#ifndef CO2_COMMON_TLS_CONFIG_H_
#define CO2_COMMON_TLS_CONFIG_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace co2::common {

// Metadata keys of co2's call credentials. The job travels in metadata too
// because an AuthMetadataProcessor sees headers, never request bodies; the
// server then checks that every request names the job its token is for.
inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kJobHeader[] = "co2-job";
inline constexpr char kBearerPrefix[] = "Bearer ";

// One side's TLS files (PEM). Empty cert_file and ca_file = plaintext.
struct TlsOptions {
  std::string cert_file;  // this side's certificate chain (client: for mTLS)
  std::string key_file;   // its private key; required with cert_file
  // CAs that verify the peer. Server: client certificates (mTLS). Client: the
  // server's certificate (empty = the system roots).
  std::string ca_file;
  // Server only: refuse calls without a certificate signed by ca_file
  // (server/service/call_auth.h builds a shard's credentials).
  bool require_client_cert = false;

  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// The whole file; NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT (empty)
// naming `path` and what it was supposed to hold (`what`).
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what);

// A bearer token kept in a file (its first line, without surrounding
// whitespace), so that it stays out of command lines. Errors name the path;
// an empty token is INVALID_ARGUMENT.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Channel credentials: SslCredentials when tls.enabled() (with the client
// certificate when cert_file is set), insecure otherwise. With a non-empty
// `token`, every call also carries `authorization: Bearer <token>` and
// `co2-job: <job>`; a token on a plaintext channel is INVALID_ARGUMENT (it
// would travel in clear, and gRPC drops call credentials there anyway).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsOptions& tls, const std::string& token,
                       const std::string& job);

// For a connection that failed (UNAVAILABLE or DEADLINE_EXCEEDED): `status`
// with a hint about the transport this client used, since gRPC reports a TLS
// mismatch (plaintext vs TLS, a CA that does not match, a missing client
// certificate) only as "Socket closed" or "handshake failed". Other statuses
// are returned unchanged.
absl::Status WithTransportHint(const absl::Status& status,
                               const TlsOptions& tls);

}  // namespace co2::common

#endif  // CO2_COMMON_TLS_CONFIG_H_
