#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "tests/http_get.h"
#include "tests/status_matchers.h"

namespace co2::common {
namespace {

std::unique_ptr<MetricsServer> StartOnFreePort() {
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  auto server = MetricsServer::Start(options);
  CO2_EXPECT_OK(server);
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsServerTest, ServesTheRegistryOnAnEphemeralPort) {
  std::unique_ptr<MetricsServer> server = StartOnFreePort();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  prometheus::BuildCounter()
      .Name("co2_test_events_total")
      .Help("Events.")
      .Register(server->registry())
      .Add({{"kind", "a"}})
      .Increment(3);
  auto body = testing::HttpGet(server->port(), "/metrics", absl::Seconds(10));
  CO2_ASSERT_OK(body);
  EXPECT_TRUE(absl::StrContains(*body, "co2_test_events_total{kind=\"a\"} 3"))
      << *body;
  // The same text as MetricsText, which tests use without HTTP.
  EXPECT_TRUE(absl::StrContains(MetricsText(server->registry()),
                                "co2_test_events_total{kind=\"a\"} 3"));
}

// A process with nothing recorded yet still says what it is and what it
// uses: /metrics is never empty.
TEST(MetricsServerTest, ServesProcessMetricsAndBuildInfoFromTheStart) {
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  options.program = "co2-test";
  auto server = MetricsServer::Start(options);
  CO2_ASSERT_OK(server);
  auto body =
      testing::HttpGet((*server)->port(), "/metrics", absl::Seconds(10));
  CO2_ASSERT_OK(body);
  for (const char* series :
       {"# TYPE process_cpu_seconds_total counter", "process_open_fds ",
        "process_max_fds ", "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ", "process_start_time_seconds ",
        "co2_build_info{program=\"co2-test\",version=\"",
        "protocol_version=\"2\",codecs=\"fp32,bf16,int8\"} 1"}) {
    EXPECT_TRUE(absl::StrContains(*body, series)) << series << "\n" << *body;
  }
  // The start time is this process's: within a day of now.
  const size_t at = body->find("\nprocess_start_time_seconds ");
  ASSERT_NE(at, std::string::npos);
  const double start = std::stod(body->substr(at + 28));
  EXPECT_NEAR(start, absl::ToUnixSeconds(absl::Now()), 86400);
  // Without a program: the registry alone.
  std::unique_ptr<MetricsServer> bare = StartOnFreePort();
  ASSERT_NE(bare, nullptr);
  auto empty = testing::HttpGet(bare->port(), "/metrics", absl::Seconds(10));
  CO2_ASSERT_OK(empty);
  EXPECT_FALSE(absl::StrContains(*empty, "process_")) << *empty;
}

TEST(MetricsServerTest, ABusyPortIsUnavailable) {
  std::unique_ptr<MetricsServer> first = StartOnFreePort();
  ASSERT_NE(first, nullptr);
  MetricsServerOptions options;
  options.address = absl::StrCat("127.0.0.1:", first->port());
  auto second = MetricsServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), options.address))
      << second.status();
}

TEST(MetricsServerTest, AnAddressWithoutPortIsInvalid) {
  MetricsServerOptions options;
  options.address = "localhost";
  auto server = MetricsServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

// A blocking TCP connection to 127.0.0.1:`port`; -1 if connect fails.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A raw exchange: sends `request`, returns all the server wrote back.
std::string RawExchange(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string reply;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    ssize_t n;
    while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0)
      reply.append(buffer, n);
  }
  close(fd);
  return reply;
}

TEST(MetricsServerTest, AnswersOnlyGetMetrics) {
  std::unique_ptr<MetricsServer> server = StartOnFreePort();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StartsWith(
      RawExchange(server->port(), "GET /other HTTP/1.1\r\nHost: x\r\n\r\n"),
      "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(
      RawExchange(server->port(), "POST /metrics HTTP/1.1\r\n\r\n"),
      "HTTP/1.1 405"));
  const std::string head =
      RawExchange(server->port(), "HEAD /metrics?x=1 HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << "HEAD has no body";
  EXPECT_TRUE(
      absl::StrContains(head, "Content-Type: text/plain; version=0.0.4"));
}

TEST(MetricsServerTest, AStalledClientIsDroppedAfterTheTimeout) {
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  options.io_timeout = absl::Milliseconds(300);
  auto server = MetricsServer::Start(options);
  CO2_ASSERT_OK(server);
  // Connects and sends half a request, then nothing.
  const int stalled = ConnectLoopback((*server)->port());
  ASSERT_GE(stalled, 0);
  ASSERT_GT(send(stalled, "GET /metr", 9, MSG_NOSIGNAL), 0);
  // The next scrape is served once the stalled one times out.
  auto body =
      testing::HttpGet((*server)->port(), "/metrics", absl::Seconds(10));
  CO2_EXPECT_OK(body);
  close(stalled);
}

TEST(MetricsServerTest, StopsPromptlyWithAClientConnected) {
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  options.io_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start(options);
  CO2_ASSERT_OK(server);
  const int stalled = ConnectLoopback((*server)->port());
  ASSERT_GE(stalled, 0);
  absl::SleepFor(absl::Milliseconds(100));  // the server is in the request
  const absl::Time start = absl::Now();
  server->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(stalled);
}

TEST(MetricsServerTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.5, 2.0, 4),
            (std::vector<double>{0.5, 1.0, 2.0, 4.0}));
  EXPECT_TRUE(ExponentialBuckets(1.0, 2.0, 0).empty());
}

}  // namespace
}  // namespace co2::common
