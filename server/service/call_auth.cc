#include "server/service/call_auth.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace co2::server {
namespace {

// Compares without an early exit, so the time taken does not tell an
// attacker how many leading bytes of a guess were right.
bool SecretEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// The token of an `authorization: Bearer <token>` header; nullopt for a
// header without the prefix.
std::optional<absl::string_view> BearerToken(absl::string_view authorization) {
  if (!absl::ConsumePrefix(&authorization, common::kBearerPrefix)) {
    return std::nullopt;
  }
  return authorization;
}

// The refusal the processor recorded for this call, if any.
absl::Status Refusal(const grpc::AuthContext& auth) {
  const std::vector<grpc::string_ref> refused =
      auth.FindPropertyValues(kAuthRefusedProperty);
  if (refused.empty()) return absl::OkStatus();
  return absl::UnauthenticatedError(
      std::string(refused[0].data(), refused[0].size()));
}

}  // namespace

grpc::Status CallAuthProcessor::Process(const InputMetadata& auth_metadata,
                                        grpc::AuthContext* context,
                                        OutputMetadata* consumed_auth_metadata,
                                        OutputMetadata* /*response_metadata*/) {
  auto header = [&](const char* name) {
    auto it = auth_metadata.find(name);
    return it == auth_metadata.end()
               ? std::optional<absl::string_view>()
               : absl::string_view(it->second.data(), it->second.size());
  };
  const absl::string_view path = header(":path").value_or("");
  // Probes (Kubernetes, grpc_health_probe) carry no credentials.
  if (absl::StartsWith(path, "/grpc.health.v1.Health/")) {
    return grpc::Status::OK;
  }
  const std::optional<absl::string_view> authorization =
      header(common::kAuthorizationHeader);
  absl::Status verdict =
      certs_ != nullptr ? certs_->Verify(*context) : absl::OkStatus();
  if (verdict.ok() && !tokens_.empty()) {
    verdict =
        absl::StartsWith(path, "/co2.v1.AggregatorAdmin/")
            ? CheckAdminToken(authorization, context)
            : CheckJobToken(authorization, header(common::kJobHeader), context);
  }
  // The token stops here; handlers never see it.
  if (authorization.has_value()) {
    consumed_auth_metadata->insert(
        std::make_pair(std::string(common::kAuthorizationHeader),
                       std::string(*authorization)));
  }
  // A refused call still reaches the service, which refuses it where it
  // knows the peer's address to log and count (CheckJobAccess,
  // CheckAdminAccess); no handler acts before that check.
  if (!verdict.ok()) {
    context->AddProperty(kAuthRefusedProperty, std::string(verdict.message()));
  }
  return grpc::Status::OK;
}

absl::Status CallAuthProcessor::CheckJobToken(
    std::optional<absl::string_view> authorization,
    std::optional<absl::string_view> job_header,
    grpc::AuthContext* context) const {
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "no bearer token: this aggregator requires `authorization: Bearer "
        "<token>` (ClientOptions.token)");
  }
  if (!job_header.has_value() || job_header->empty()) {
    return absl::UnauthenticatedError(
        "no `co2-job` header naming the job the bearer token is for");
  }
  const std::string job(*job_header);
  const std::optional<absl::string_view> token = BearerToken(*authorization);
  if (!token.has_value()) {
    return absl::UnauthenticatedError(
        "the authorization header is not of the form `Bearer <token>`");
  }
  auto expected = tokens_.per_job.find(job);
  const std::string* want = expected != tokens_.per_job.end()
                                ? &expected->second
                                : (tokens_.any_job.empty() ? nullptr
                                                           : &tokens_.any_job);
  if (want == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("no token is configured for job \"", job, "\""));
  }
  if (!SecretEquals(*token, *want)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the bearer token is not valid for job \"", job, "\""));
  }
  context->AddProperty(kAuthJobProperty, job);
  return absl::OkStatus();
}

absl::Status CallAuthProcessor::CheckAdminToken(
    std::optional<absl::string_view> authorization,
    grpc::AuthContext* context) const {
  if (tokens_.admin.empty()) {
    return absl::UnauthenticatedError(
        "admin calls are disabled on this shard: start it with "
        "--admin_token_file");
  }
  const std::optional<absl::string_view> token =
      authorization.has_value() ? BearerToken(*authorization) : std::nullopt;
  if (!token.has_value() || !SecretEquals(*token, tokens_.admin)) {
    return absl::UnauthenticatedError(
        "admin calls need the shard's admin token (--admin_token_file) as "
        "`authorization: Bearer <token>`");
  }
  context->AddProperty(kAuthAdminProperty, "1");
  return absl::OkStatus();
}

absl::Status CheckAdminAccess(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return absl::OkStatus();
  CO2_RETURN_IF_ERROR(Refusal(*auth));
  if (!auth->FindPropertyValues(kAuthAdminProperty).empty()) {
    return absl::OkStatus();
  }
  if (auth->FindPropertyValues(kAuthJobProperty).empty()) {
    return absl::OkStatus();  // no tokens on this server
  }
  return absl::PermissionDeniedError(
      "a job's bearer token does not allow admin calls; use the shard's "
      "admin token (--admin_token_file)");
}

absl::Status CheckJobAccess(const grpc::ServerContextBase& context,
                            const std::string& job) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return absl::OkStatus();
  CO2_RETURN_IF_ERROR(Refusal(*auth));
  const std::vector<grpc::string_ref> jobs =
      auth->FindPropertyValues(kAuthJobProperty);
  if (jobs.empty()) return absl::OkStatus();  // no tokens on this server
  for (const grpc::string_ref& allowed : jobs) {
    if (absl::string_view(allowed.data(), allowed.size()) == job) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "this call's bearer token is for job \"",
      std::string(jobs[0].data(), jobs[0].size()), "\", the request names job \"",
      job, "\""));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeShardCredentials(
    const common::TlsOptions& tls, const JobTokens& tokens) {
  if (!tls.enabled()) {
    return absl::InvalidArgumentError(
        "TLS needs a certificate and key (none given)");
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a TLS server needs both a certificate and a key file (certificate \"",
        tls.cert_file, "\", key \"", tls.key_file, "\")"));
  }
  if (tls.require_client_cert && tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "requiring client certificates (mTLS) needs the CA file that signs "
        "them");
  }
  // The client certificate is checked per call, by the processor, where a
  // refusal can be logged with the peer and counted (server/service/client_cert.h).
  grpc::SslServerCredentialsOptions options(
      tls.require_client_cert
          ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY
          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  CO2_ASSIGN_OR_RETURN(pair.cert_chain,
                       common::ReadPemFile(tls.cert_file, "TLS certificate"));
  CO2_ASSIGN_OR_RETURN(pair.private_key,
                       common::ReadPemFile(tls.key_file, "TLS private key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  std::shared_ptr<const ClientCertVerifier> certs;
  if (tls.require_client_cert) {
    CO2_ASSIGN_OR_RETURN(const std::string ca,
                         common::ReadPemFile(tls.ca_file, "TLS client CA"));
    CO2_ASSIGN_OR_RETURN(certs, ClientCertVerifier::Create(ca, tls.ca_file));
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::SslServerCredentials(options);
  if (certs != nullptr || !tokens.empty()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<CallAuthProcessor>(tokens, std::move(certs)));
  }
  return credentials;
}

}  // namespace co2::server
