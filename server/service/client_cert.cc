#include "server/service/client_cert.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace co2::server {
namespace {

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

struct StackDeleter {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
struct StoreCtxDeleter {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

// Every certificate in `pem`, in order.
std::vector<X509Ptr> ParsePem(const std::string& pem) {
  std::vector<X509Ptr> out;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return out;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    out.emplace_back(x);
  }
  BIO_free(bio);
  return out;
}

std::string Subject(X509* x) {
  char buffer[512];
  X509_NAME_oneline(X509_get_subject_name(x), buffer, sizeof(buffer));
  return buffer;
}

std::string FirstValue(const grpc::AuthContext& context, const char* name) {
  const std::vector<grpc::string_ref> values = context.FindPropertyValues(name);
  if (values.empty()) return "";
  return std::string(values[0].data(), values[0].size());
}

}  // namespace

struct ClientCertVerifier::Store {
  ~Store() { X509_STORE_free(roots); }
  X509_STORE* roots = nullptr;
};

absl::StatusOr<std::unique_ptr<ClientCertVerifier>> ClientCertVerifier::Create(
    const std::string& ca_pem, const std::string& source) {
  auto store = std::make_unique<Store>();
  store->roots = X509_STORE_new();
  if (store->roots == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate an X509 store");
  }
  std::vector<X509Ptr> roots = ParsePem(ca_pem);
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client CA \"", source, "\" holds no PEM certificate"));
  }
  for (const X509Ptr& root : roots) {
    if (X509_STORE_add_cert(store->roots, root.get()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("client CA \"", source,
                       "\": cannot add certificate ", Subject(root.get())));
    }
  }
  return std::unique_ptr<ClientCertVerifier>(
      new ClientCertVerifier(std::move(store)));
}

ClientCertVerifier::ClientCertVerifier(std::unique_ptr<Store> store)
    : store_(std::move(store)) {}

ClientCertVerifier::~ClientCertVerifier() = default;

absl::Status ClientCertVerifier::Verify(const grpc::AuthContext& context) const {
  return VerifyPem(FirstValue(context, GRPC_X509_PEM_CERT_PROPERTY_NAME),
                   FirstValue(context, GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME));
}

absl::Status ClientCertVerifier::VerifyPem(const std::string& leaf_pem,
                                           const std::string& chain_pem) const {
  std::vector<X509Ptr> leaf = ParsePem(leaf_pem);
  if (leaf.empty()) {
    return absl::UnauthenticatedError(
        "no client certificate: this shard requires mTLS (co2-train "
        "--aggregator_cert/--aggregator_key, Python cert_file/key_file), "
        "signed by the CA of its --tls_client_ca");
  }
  std::unique_ptr<STACK_OF(X509), StackDeleter> untrusted(sk_X509_new_null());
  for (X509Ptr& cert : ParsePem(chain_pem)) {
    if (untrusted == nullptr || sk_X509_push(untrusted.get(), cert.get()) == 0) {
      return absl::ResourceExhaustedError("cannot hold the client's chain");
    }
    cert.release();  // owned by the stack now
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxDeleter> ctx(X509_STORE_CTX_new());
  if (ctx == nullptr ||
      X509_STORE_CTX_init(ctx.get(), store_->roots, leaf[0].get(),
                          untrusted.get()) != 1) {
    return absl::ResourceExhaustedError("cannot set up a certificate check");
  }
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  if (X509_verify_cert(ctx.get()) == 1) return absl::OkStatus();
  const int error = X509_STORE_CTX_get_error(ctx.get());
  return absl::UnauthenticatedError(absl::StrCat(
      "client certificate \"", Subject(leaf[0].get()),
      "\" refused: ", X509_verify_cert_error_string(error),
      error == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
              error == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
              error == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
          ? " (it is not signed by the CA of this shard's --tls_client_ca)"
          : ""));
}

}  // namespace co2::server
