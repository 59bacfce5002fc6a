// A minimal HTTP/1.0 GET over a plain socket for tests that read /metrics or
// Prometheus's HTTP API on loopback. Every step has a deadline. Header only.
#ifndef CO2_TESTS_HTTP_GET_H_
#define CO2_TESTS_HTTP_GET_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace co2::testing {

// GETs http://127.0.0.1:port<path_and_query>. The body on status 200;
// UNAVAILABLE for a refused connection (not up yet), DEADLINE_EXCEEDED,
// or INTERNAL with the status line otherwise.
inline absl::StatusOr<std::string> HttpGet(int port,
                                           const std::string& path_and_query,
                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", errno));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Waits until fd is ready for `events` or the deadline passes.
  auto wait = [&](short events) -> absl::Status {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("HTTP GET timed out");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(ms));
    if (n == 0) return absl::DeadlineExceededError("HTTP GET timed out");
    if (n < 0) return absl::InternalError(absl::StrCat("poll: ", errno));
    return absl::OkStatus();
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("connect to port ", port, ": ", std::strerror(errno)));
    }
    absl::Status ready = wait(POLLOUT);
    if (!ready.ok()) return ready;
    int error = 0;
    socklen_t len = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      return absl::UnavailableError(
          absl::StrCat("connect to port ", port, ": ", std::strerror(error)));
    }
  }
  const std::string request = absl::StrCat(
      "GET ", path_and_query, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    absl::Status ready = wait(POLLOUT);
    if (!ready.ok()) return ready;
    const ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) {
      return absl::InternalError(absl::StrCat("send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[16384];
  for (;;) {
    absl::Status ready = wait(POLLIN);
    if (!ready.ok()) return ready;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN) continue;
      return absl::InternalError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  const size_t line_end = response.find("\r\n");
  const std::string status_line = response.substr(0, line_end);
  const size_t body = response.find("\r\n\r\n");
  if (status_line.find(" 200") == std::string::npos ||
      body == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("GET ", path_and_query, ": ", status_line));
  }
  return response.substr(body + 4);
}

}  // namespace co2::testing

#endif  // CO2_TESTS_HTTP_GET_H_
