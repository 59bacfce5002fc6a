// How a shard authenticates its calls: the gRPC server credentials
// (MakeShardCredentials) and the auth processor they carry (CallAuthProcessor).
//
// With mTLS (--tls_client_ca) the TLS handshake asks for a client certificate
// and the processor checks it on every call (server/service/client_cert.h).
// With job tokens, a client sends `authorization: Bearer <token>` and `co2-job:
// <job>` on every call (common::MakeChannelCredentials) and the processor
// checks that the token is the one configured for that job (or the service-wide
// token). The processor records in the call's AuthContext the job, or why it
// refused the call. Every handler begins with CheckJobAccess (or
// CheckAdminAccess), which answers a refused call UNAUTHENTICATED before
// anything else, where the service can log and count it with the peer's
// address (the processor never sees that). Because the processor sees
// headers only, the service then calls CheckJobAccess with the job the
// request body names: a token for job A can never act on job B
// (PERMISSION_DENIED). The standard health service (grpc.health.v1) is
// exempt from both checks so that probes work without credentials. The
// admin service (co2.v1.AggregatorAdmin) takes only the admin token, with no
// job header; without one configured, admin calls are refused.
//
// Both need TLS: gRPC does not run an AuthMetadataProcessor on plaintext
// listeners, and a token in clear text would be worth nothing.
// CallAuthProcessor is immutable and thread-safe.
#ifndef CO2_SERVER_SERVICE_CALL_AUTH_H_
#define CO2_SERVER_SERVICE_CALL_AUTH_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tls_config.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "server/service/client_cert.h"
#include "server/service/job_tokens.h"

namespace grpc {
class ServerContextBase;
class ServerCredentials;
}  // namespace grpc

namespace co2::server {

// The AuthContext property holding the job a call's token was accepted for.
inline constexpr char kAuthJobProperty[] = "co2-job";
// The AuthContext property set on a call that carried the admin token.
inline constexpr char kAuthAdminProperty[] = "co2-admin";
// The AuthContext property holding why a call's token was refused.
inline constexpr char kAuthRefusedProperty[] = "co2-refused";

class CallAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  // `tokens` empty: no token is checked. `certs` null: no client certificate
  // is checked.
  CallAuthProcessor(JobTokens tokens,
                    std::shared_ptr<const ClientCertVerifier> certs)
      : tokens_(std::move(tokens)), certs_(std::move(certs)) {}

  // Non-blocking (CPU only: a certificate check is a few signature
  // verifications), so it runs inline on gRPC's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  // UNAUTHENTICATED saying why, or OK after recording in `context` the job
  // (CheckJobToken) or the admin right (CheckAdminToken) the token grants.
  absl::Status CheckJobToken(std::optional<absl::string_view> authorization,
                             std::optional<absl::string_view> job_header,
                             grpc::AuthContext* context) const;
  absl::Status CheckAdminToken(std::optional<absl::string_view> authorization,
                               grpc::AuthContext* context) const;

  const JobTokens tokens_;
  const std::shared_ptr<const ClientCertVerifier> certs_;
};

// UNAUTHENTICATED with the processor's reason for a refused token; OK when
// the call was authenticated for `job`, or when the server checks no tokens
// (no job recorded); PERMISSION_DENIED naming both jobs otherwise.
absl::Status CheckJobAccess(const grpc::ServerContextBase& context,
                            const std::string& job);
// UNAUTHENTICATED for a refused token; OK when the call carried the admin
// token, or when the server checks no tokens; PERMISSION_DENIED otherwise.
absl::Status CheckAdminAccess(const grpc::ServerContextBase& context);

// The credentials of a shard's listening port: TLS from `tls` (the client
// certificate requested, not verified in the handshake, when
// tls.require_client_cert), with a CallAuthProcessor when it checks client
// certificates or `tokens`. INVALID_ARGUMENT when TLS is not enabled,
// cert_file or key_file is missing, require_client_cert has no ca_file, or
// the CA file holds no certificate; common::ReadPemFile's errors for
// unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeShardCredentials(
    const common::TlsOptions& tls, const JobTokens& tokens);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_CALL_AUTH_H_
