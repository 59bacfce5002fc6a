#include "common/tls_config.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "grpcpp/security/credentials.h"

namespace co2::common {
namespace {

// Adds the bearer token and the job to every call. Non-blocking: the values
// are fixed, so gRPC may call it inline.
class BearerTokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  BearerTokenPlugin(std::string token, std::string job)
      : authorization_(absl::StrCat(kBearerPrefix, token)),
        job_(std::move(job)) {}

  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "co2-bearer-token"; }

  grpc::Status GetMetadata(
      grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
      const grpc::AuthContext& /*channel_auth_context*/,
      std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace(kAuthorizationHeader, authorization_);
    metadata->emplace(kJobHeader, job_);
    return grpc::Status::OK;
  }

  std::string DebugString() override {
    return absl::StrCat("co2 bearer token for job ", job_);
  }

 private:
  const std::string authorization_;
  const std::string job_;
};

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    const std::string message = absl::StrCat(
        "cannot read ", what, " \"", path, "\": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    if (error == EACCES) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  std::string contents;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    contents.append(buffer, n);
  }
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read ", what, " \"", path, "\": ", std::strerror(error)));
  }
  if (contents.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", path, "\" is ", contents.empty() ? "empty" : "not PEM",
        " (expected a -----BEGIN ...----- block)"));
  }
  return contents;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot read token file \"", path,
                                             "\": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message)
                           : absl::PermissionDeniedError(message);
  }
  char buffer[4096];
  const size_t n = std::fread(buffer, 1, sizeof(buffer), file);
  std::fclose(file);
  absl::string_view text(buffer, n);
  text = text.substr(0, text.find('\n'));
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file \"", path, "\" is empty"));
  }
  return std::string(text);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls, const std::string& token, const std::string& job) {
  if (!tls.enabled()) {
    if (!token.empty()) {
      return absl::InvalidArgumentError(
          "a bearer token needs TLS: give the CA file (and for mTLS the client "
          "certificate and key); it is never sent in plaintext");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a client certificate needs both the certificate and the key file "
        "(certificate \"",
        tls.cert_file, "\", key \"", tls.key_file, "\")"));
  }
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    CO2_ASSIGN_OR_RETURN(options.pem_root_certs,
                         ReadPemFile(tls.ca_file, "TLS CA certificate"));
  }
  if (!tls.cert_file.empty()) {
    CO2_ASSIGN_OR_RETURN(options.pem_cert_chain,
                         ReadPemFile(tls.cert_file, "TLS client certificate"));
    CO2_ASSIGN_OR_RETURN(options.pem_private_key,
                         ReadPemFile(tls.key_file, "TLS client private key"));
  }
  std::shared_ptr<grpc::ChannelCredentials> channel =
      grpc::SslCredentials(options);
  if (token.empty()) return channel;
  return grpc::CompositeChannelCredentials(
      channel, grpc::MetadataCredentialsFromPlugin(
                   std::make_unique<BearerTokenPlugin>(token, job)));
}

absl::Status WithTransportHint(const absl::Status& status,
                               const TlsOptions& tls) {
  if (status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kDeadlineExceeded) {
    return status;
  }
  const std::string hint =
      tls.enabled()
          ? absl::StrCat(
                " (this client uses TLS, trusting CA \"", tls.ca_file,
                "\", client certificate \"", tls.cert_file,
                "\": if the shard is up, check that its certificate is signed "
                "by that CA and names the address you dial, that it does not "
                "require a client certificate you lack, and that it is not "
                "plaintext; its log names the handshake error)")
          : " (this client uses plaintext: if the shard is up, it may serve "
            "TLS; give ClientOptions.tls the CA that signed its certificate)";
  return absl::Status(status.code(), absl::StrCat(status.message(), hint));
}

}  // namespace co2::common
