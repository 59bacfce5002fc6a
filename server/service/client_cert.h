// ClientCertVerifier: checks a call's client certificate (mTLS) against the
// CA that signs the workers' certificates.
//
// A shard with --tls_client_ca requests a client certificate in the TLS
// handshake but does not refuse the handshake over it (gRPC gives a service
// no hook there, so a refusal could be neither logged with the peer's
// address nor counted). The call's auth processor (server/service/call_auth.h)
// runs this check on every call instead: no certificate, one that does not
// chain to the CA, or one not valid for client authentication is refused
// UNAUTHENTICATED before any handler acts, where RefusedCalls logs and counts
// it. TLS still proves that the client holds the certificate's key.
//
// Immutable after Create; thread-safe.
#ifndef CO2_SERVER_SERVICE_CLIENT_CERT_H_
#define CO2_SERVER_SERVICE_CLIENT_CERT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class AuthContext;
}  // namespace grpc

namespace co2::server {

class ClientCertVerifier {
 public:
  // `ca_pem`: one or more PEM certificates, the trusted roots; `source` names
  // them in errors (the file's path). INVALID_ARGUMENT if none parses.
  static absl::StatusOr<std::unique_ptr<ClientCertVerifier>> Create(
      const std::string& ca_pem, const std::string& source);
  ~ClientCertVerifier();
  ClientCertVerifier(const ClientCertVerifier&) = delete;
  ClientCertVerifier& operator=(const ClientCertVerifier&) = delete;

  // OK when the call's peer presented a certificate (with the chain it sent)
  // that chains to the CA and may authenticate a TLS client; UNAUTHENTICATED
  // saying what is wrong and naming the certificate's subject otherwise.
  absl::Status Verify(const grpc::AuthContext& context) const;
  // The same for a PEM leaf certificate and the PEM chain sent with it.
  absl::Status VerifyPem(const std::string& leaf_pem,
                         const std::string& chain_pem) const;

 private:
  struct Store;
  explicit ClientCertVerifier(std::unique_ptr<Store> store);
  const std::unique_ptr<Store> store_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_CLIENT_CERT_H_
