#include "client/worker_metrics.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/metrics_server.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/http_get.h"
#include "tests/status_matchers.h"

namespace co2::client {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return absl::StrContains(text, line + "\n");
}

// The value on the line of `series` (name and labels); NaN if absent.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find(series + " ");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + series.size() + 1, nullptr);
}

TEST(WorkerMetricsTest, ARoundBecomesItsSeries) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry, "job", "worker-1");
  WorkerRoundSample sample;
  sample.inner_steps = 4;
  sample.compute = absl::Milliseconds(400);
  sample.exposed_comm = absl::Milliseconds(30);
  sample.push = absl::Milliseconds(5);
  sample.bytes_sent = 4096;
  sample.staleness = 1;
  sample.anchor_mismatches = 1;
  metrics.ObserveRound(sample);
  metrics.ObserveRound(sample);
  const std::string text = common::MetricsText(registry);
  const std::string labels = "{co2_job=\"job\",worker=\"worker-1\"}";
  EXPECT_TRUE(Has(text, "co2_worker_rounds_total" + labels + " 2")) << text;
  EXPECT_TRUE(Has(text, "co2_worker_bytes_sent_total" + labels + " 8192"));
  EXPECT_TRUE(Has(text, "co2_worker_staleness_rounds" + labels + " 1"));
  EXPECT_TRUE(Has(text, "co2_worker_anchor_mismatches_total" + labels + " 2"));
  // One sample per inner step, each the round's mean step time (0.1 s).
  EXPECT_TRUE(Has(text, "co2_worker_inner_step_seconds_count" + labels + " 8"));
  EXPECT_NEAR(Sample(text, "co2_worker_inner_step_seconds_sum" + labels), 0.8,
              1e-9);
  EXPECT_TRUE(
      Has(text, "co2_worker_exposed_comm_seconds_count" + labels + " 2"));
  EXPECT_NEAR(Sample(text, "co2_worker_exposed_comm_seconds_total" + labels),
              0.06, 1e-9);
  EXPECT_NEAR(Sample(text, "co2_worker_push_seconds_sum" + labels), 0.01, 1e-9);
  metrics.ObserveInnerStep(absl::Milliseconds(200));
  EXPECT_TRUE(Has(common::MetricsText(registry),
                  "co2_worker_inner_step_seconds_count" + labels + " 9"));
}

TEST(WorkerMetricsTest, HealsAreCountedByReasonAndTimed) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry, "job", "worker-1");
  WorkerRoundSample sample;
  metrics.ObserveRound(sample);  // no heal: no series with a reason
  EXPECT_FALSE(absl::StrContains(common::MetricsText(registry),
                                 "co2_worker_heals_total{"));
  sample.heal_reason = "behind";
  sample.heal_time = absl::Milliseconds(300);
  metrics.ObserveRound(sample);
  metrics.ObserveRound(sample);
  sample.heal_reason = "dropped";
  sample.heal_time = absl::Milliseconds(100);
  metrics.ObserveRound(sample);
  const std::string text = common::MetricsText(registry);
  EXPECT_TRUE(Has(text,
                  "co2_worker_heals_total{co2_job=\"job\",reason=\"behind\","
                  "worker=\"worker-1\"} 2"))
      << text;
  EXPECT_TRUE(Has(text,
                  "co2_worker_heals_total{co2_job=\"job\",reason=\"dropped\","
                  "worker=\"worker-1\"} 1"));
  const std::string labels = "{co2_job=\"job\",worker=\"worker-1\"}";
  EXPECT_TRUE(Has(text, "co2_worker_heal_seconds_count" + labels + " 3"));
  EXPECT_NEAR(Sample(text, "co2_worker_heal_seconds_sum" + labels), 0.7, 1e-9);
}

TEST(WorkerMetricsTest, ServeExposesThemOverHttp) {
  auto metrics = WorkerMetrics::Serve("127.0.0.1:0", "job", "w0");
  CO2_ASSERT_OK(metrics);
  ASSERT_GT((*metrics)->port(), 0);
  WorkerRoundSample sample;
  sample.bytes_sent = 100;
  (*metrics)->ObserveRound(sample);
  auto body =
      testing::HttpGet((*metrics)->port(), "/metrics", absl::Seconds(10));
  CO2_ASSERT_OK(body);
  EXPECT_TRUE(absl::StrContains(
      *body, "co2_worker_bytes_sent_total{co2_job=\"job\",worker=\"w0\"} 100"))
      << *body;
}

}  // namespace
}  // namespace co2::client
