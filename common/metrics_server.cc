#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "prometheus/text_serializer.h"

namespace co2::common {
namespace {

constexpr size_t kMaxRequestBytes = 16 << 10;

// Waits until `fd` is ready for `events`, the deadline passes (false) or the
// server is stopping (false).
bool WaitReady(int fd, short events, int wake_fd, absl::Time deadline) {
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = poll(fds, 2, static_cast<int>(ms));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || fds[1].revents != 0) return false;
    return true;
  }
}

std::string Response(absl::string_view status, absl::string_view body,
                     bool head) {
  return absl::StrCat(
      "HTTP/1.1 ", status,
      "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
      "\r\nContent-Length: ",
      body.size(), "\r\nConnection: close\r\n\r\n", head ? "" : body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options) {
  const size_t colon = options.address.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", options.address, "\" is not host:port"));
  }
  std::string host = options.address.substr(0, colon);
  const std::string port = options.address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                              port.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", options.address, ": ", gai_strerror(gai)));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer(options));
  int error = 0;
  for (addrinfo* a = found; a != nullptr && server->listen_fd_ < 0;
       a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      error = errno;
      close(fd);
      continue;
    }
    server->listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (server->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ",
                                               options.address, ": ",
                                               std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  server->port_ = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  MetricsServer* raw = server.get();
  server->thread_ = std::thread([raw] { raw->Serve(); });
  CO2_LOG(INFO) << "metrics on http://" << options.address.substr(0, colon)
                << ":" << server->port_ << "/metrics";
  return server;
}

MetricsServer::MetricsServer(const MetricsServerOptions& options)
    : options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      process_(options.program.empty()
                   ? nullptr
                   : std::make_unique<ProcessCollector>(options.program)),
      host_tcp_(options.program.empty()
                    ? nullptr
                    : std::make_unique<HostTcpCollector>(options.link_path)) {}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      CO2_LOG(ERROR) << "metrics server: cannot wake: " << std::strerror(errno);
    }
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Waits for a connection or the destructor; nothing else to time out.
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      CO2_LOG(ERROR) << "metrics server: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the client gave up already, or out of fds
    HandleConnection(fd);
    close(fd);
  }
}

void MetricsServer::HandleConnection(int fd) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  std::string request;
  char buffer[4096];
  while (!absl::StrContains(request, "\r\n\r\n")) {
    if (request.size() > kMaxRequestBytes ||
        !WaitReady(fd, POLLIN, wake_fd_, deadline)) {
      return;
    }
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    if (n > 0) request.append(buffer, static_cast<size_t>(n));
  }
  // Request line: METHOD SP TARGET SP VERSION.
  const absl::string_view line =
      absl::string_view(request).substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 == line.npos ? 0 : sp1 + 1);
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view path = sp1 == line.npos || sp2 == line.npos
                               ? absl::string_view()
                               : line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  std::string response;
  if (method != "GET" && !head) {
    response = Response("405 Method Not Allowed", "GET /metrics\n", head);
  } else if (path != "/metrics") {
    response = Response("404 Not Found", "metrics are at /metrics\n", head);
  } else {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (const prometheus::Collectable* c :
         {static_cast<const prometheus::Collectable*>(process_.get()),
          static_cast<const prometheus::Collectable*>(host_tcp_.get())}) {
      if (c == nullptr) continue;
      for (prometheus::MetricFamily& f : c->Collect()) {
        families.push_back(std::move(f));
      }
    }
    response = Response("200 OK",
                        prometheus::TextSerializer().Serialize(families), head);
  }
  size_t sent = 0;
  while (sent < response.size()) {
    if (!WaitReady(fd, POLLOUT, wake_fd_, deadline)) return;
    const ssize_t n =
        send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return;
    if (n > 0) sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
}

std::string MetricsText(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  bounds.reserve(count > 0 ? count : 0);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

}  // namespace co2::common
