#include "common/tls_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace co2::common {
namespace {

struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslDeleter {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

// A connected TCP socket, closed on destruction.
class Socket {
 public:
  Socket() = default;
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  absl::Status Connect(const std::string& host, const std::string& port,
                       absl::Time deadline) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
        rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found,
                                                             &freeaddrinfo);
    absl::Status last = absl::UnavailableError("no address");
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      last = ConnectOne(a, deadline);
      if (last.ok()) return last;
    }
    return last;
  }

  int fd() const { return fd_; }

 private:
  absl::Status ConnectOne(const addrinfo* a, absl::Time deadline) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd_ < 0) return absl::UnavailableError(std::strerror(errno));
    const int flags = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    if (::connect(fd_, a->ai_addr, a->ai_addrlen) != 0 &&
        errno != EINPROGRESS) {
      return absl::UnavailableError(std::strerror(errno));
    }
    pollfd p{fd_, POLLOUT, 0};
    const int ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (::poll(&p, 1, ms) != 1) {
      return absl::UnavailableError("TCP connect timed out");
    }
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) return absl::UnavailableError(std::strerror(error));
    ::fcntl(fd_, F_SETFL, flags);
    return absl::OkStatus();
  }

  int fd_ = -1;
};

// The OpenSSL error queue as text ("" if empty); empties it.
std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    if (!text.empty()) text += "; ";
    text += buffer;
  }
  return text;
}

// What the server's alert (in OpenSSL's error text) means for this client.
std::string ExplainAlert(const std::string& errors, const TlsOptions& tls) {
  const std::string theirs = "the shard refused this client's certificate";
  if (tls.cert_file.empty() &&
      (absl::StrContains(errors, "certificate required") ||
       absl::StrContains(errors, "handshake failure"))) {
    return "the shard requires a client certificate (mTLS) and this client "
           "sent none: give the worker's certificate and key";
  }
  if (absl::StrContains(errors, "unknown ca") ||
      absl::StrContains(errors, "bad certificate") ||
      absl::StrContains(errors, "certificate unknown")) {
    return absl::StrCat(theirs, " (", tls.cert_file,
                        "): it is not signed by the CA the shard trusts "
                        "(its --tls_client_ca)");
  }
  if (absl::StrContains(errors, "certificate expired")) {
    return absl::StrCat(theirs, " (", tls.cert_file, "): it has expired");
  }
  return "the shard ended the TLS handshake";
}

absl::Status ProbeOnce(const std::string& address, const TlsOptions& tls,
                       absl::Time deadline) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = address.substr(colon + 1);
  std::unique_ptr<SSL_CTX, SslCtxDeleter> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError(OpenSslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (!tls.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), tls.ca_file.c_str(),
                                      nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load the CA file ", tls.ca_file, ": ", OpenSslErrors()));
    }
  } else {
    SSL_CTX_set_default_verify_paths(ctx.get());
  }
  if (!tls.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls.cert_file.c_str()) !=
            1 ||
        SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key_file.c_str(),
                                    SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot load the client certificate ", tls.cert_file,
                       " with key ", tls.key_file, ": ", OpenSslErrors()));
    }
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));

  Socket socket;
  if (absl::Status connected = socket.Connect(host, port, deadline);
      !connected.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no TCP connection to ", address, ": ", connected.message()));
  }
  const int ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

  std::unique_ptr<SSL, SslDeleter> ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), socket.fd());
  SSL_set_tlsext_host_name(ssl.get(), host.c_str());
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  unsigned char ip[16];
  if (inet_pton(AF_INET, host.c_str(), ip) == 1 ||
      inet_pton(AF_INET6, host.c_str(), ip) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  }
  ERR_clear_error();
  const std::string where =
      absl::StrCat("TLS handshake with ", address, " failed: ");
  if (SSL_connect(ssl.get()) != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    std::string errors = OpenSslErrors();
    if (verify != X509_V_OK) {
      return absl::UnauthenticatedError(absl::StrCat(
          where, "the shard's certificate failed verification: ",
          X509_verify_cert_error_string(verify),
          tls.ca_file.empty()
              ? std::string(" (against the system's CAs: give the CA that "
                            "signs the shards' certificates)")
              : absl::StrCat(" (against the CA file ", tls.ca_file, ")")));
    }
    if (absl::StrContains(errors, "alert")) {
      return absl::UnauthenticatedError(
          absl::StrCat(where, ExplainAlert(errors, tls), " [", errors, "]"));
    }
    return absl::UnavailableError(absl::StrCat(
        where, errors.empty() ? "the connection closed" : errors,
        " (is the shard serving TLS on this port?)"));
  }
  // With TLS 1.3 the shard checks the client's certificate after the
  // client's side of the handshake is done. A gRPC server that accepts it
  // sends its HTTP/2 settings at once; one that refuses it sends an alert,
  // or (gRPC) just closes the connection.
  char byte;
  const int read = SSL_read(ssl.get(), &byte, 1);
  if (read > 0) return absl::OkStatus();
  const int error = SSL_get_error(ssl.get(), read);
  const int saved_errno = errno;
  std::string errors = OpenSslErrors();
  if (absl::StrContains(errors, "alert")) {
    return absl::UnauthenticatedError(
        absl::StrCat(where, ExplainAlert(errors, tls), " [", errors, "]"));
  }
  const bool timed_out = error == SSL_ERROR_SYSCALL &&
                         (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK);
  if (timed_out || error == SSL_ERROR_WANT_READ) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(
      where, "the shard closed the connection right after the handshake: ",
      tls.cert_file.empty()
          ? std::string("it requires a client certificate (mTLS) and this "
                        "client sent none: give the worker's certificate and "
                        "key")
          : absl::StrCat("it did not accept this client's certificate (",
                         tls.cert_file,
                         "): is it signed by the CA the shard trusts (its "
                         "--tls_client_ca)?")));
}

}  // namespace

absl::Status ProbeTlsHandshake(const std::string& address,
                               const TlsOptions& tls, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status status = ProbeOnce(address, tls, deadline);
  // A shard going down can close a connection as a refusal would: only a
  // refusal that repeats on a new connection counts.
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    const absl::Status again = ProbeOnce(address, tls, deadline);
    if (again.code() != absl::StatusCode::kUnauthenticated) return again;
  }
  return status;
}

}  // namespace co2::common
