// Per-job bearer tokens on an aggregator shard.
//
// A client sends `authorization: Bearer <token>` and `co2-job: <job>` on every
// call (common::MakeChannelCredentials). TokenAuthProcessor, installed on the
// server's TLS credentials, checks that the token is the one configured for
// that job (or the service-wide token) and records in the call's AuthContext
// the job, or why it refused the token. Every handler begins with
// CheckJobAccess (or CheckAdminAccess), which answers a refused call
// UNAUTHENTICATED before anything else, where the service can log and count
// it with the peer's address (the processor never sees that). Because the
// processor sees headers only, the service then
// calls CheckJobAccess with the job the request body names: a token for job A
// can never act on job B (PERMISSION_DENIED). The standard health service
// (grpc.health.v1) is exempt so that probes work without a token. The admin
// service (co2.v1.AggregatorAdmin) takes only the admin token, with no job
// header; without one configured, admin calls are refused.
//
// Tokens require TLS: gRPC does not run an AuthMetadataProcessor on plaintext
// listeners, and a token in clear text would be worth nothing.
// JobTokens is a value; TokenAuthProcessor is immutable and thread-safe.
#ifndef CO2_SERVER_TOKEN_AUTH_H_
#define CO2_SERVER_TOKEN_AUTH_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace co2::server {

// The AuthContext property holding the job a call's token was accepted for.
inline constexpr char kAuthJobProperty[] = "co2-job";
// The AuthContext property set on a call that carried the admin token.
inline constexpr char kAuthAdminProperty[] = "co2-admin";
// The AuthContext property holding why a call's token was refused.
inline constexpr char kAuthRefusedProperty[] = "co2-refused";

struct JobTokens {
  absl::flat_hash_map<std::string, std::string> per_job;  // job → token
  std::string any_job;  // accepted for jobs without their own; empty = none
  // For the admin service only (--admin_token_file); empty: admin calls are
  // refused. Needs job tokens: a shard without them checks no token at all.
  std::string admin;

  // No job token: the shard checks no tokens.
  bool empty() const { return per_job.empty() && any_job.empty(); }
};

// Parses a tokens file: one `job token` pair per line, `*` as the job for a
// token valid for every job without its own line; blank lines and lines
// starting with # are ignored. INVALID_ARGUMENT naming `source` and the line
// for anything else (a third field, a duplicate job, an empty token).
absl::StatusOr<JobTokens> ParseJobTokens(absl::string_view text,
                                         const std::string& source);
// Reads and parses the file at `path` (errors name the path).
absl::StatusOr<JobTokens> LoadJobTokensFile(const std::string& path);

class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(JobTokens tokens) : tokens_(std::move(tokens)) {}

  // Cheap and non-blocking: runs inline on gRPC's thread.
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
};

// UNAUTHENTICATED with the processor's reason for a refused token; OK when
// the call was authenticated for `job`, or when the server checks no tokens
// (no job recorded); PERMISSION_DENIED naming both jobs otherwise.
absl::Status CheckJobAccess(const grpc::ServerContextBase& context,
                            const std::string& job);
// UNAUTHENTICATED for a refused token; OK when the call carried the admin
// token, or when the server checks no tokens; PERMISSION_DENIED otherwise.
absl::Status CheckAdminAccess(const grpc::ServerContextBase& context);

}  // namespace co2::server

#endif  // CO2_SERVER_TOKEN_AUTH_H_
