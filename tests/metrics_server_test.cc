#include "common/metrics_server.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "tests/http_get.h"

namespace co2::common {
namespace {

std::unique_ptr<MetricsServer> StartOnFreePort() {
  MetricsServerOptions options;
  options.address = "127.0.0.1:0";
  auto server = MetricsServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
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
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_TRUE(absl::StrContains(*body, "co2_test_events_total{kind=\"a\"} 3"))
      << *body;
  // The same text as MetricsText, which tests use without HTTP.
  EXPECT_TRUE(absl::StrContains(MetricsText(server->registry()),
                                "co2_test_events_total{kind=\"a\"} 3"));
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

TEST(MetricsServerTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.5, 2.0, 4),
            (std::vector<double>{0.5, 1.0, 2.0, 4.0}));
  EXPECT_TRUE(ExponentialBuckets(1.0, 2.0, 0).empty());
}

}  // namespace
}  // namespace co2::common
