// MetricsServer: the Prometheus endpoint of one process. It owns a
// prometheus::Registry and the HTTP exposer (prometheus-cpp's pull exposer,
// civetweb underneath) that serves it at /metrics. Units that record metrics
// borrow the registry; the pure-logic units (RoundState, OuterOptimizer) never
// see it: the server reports through server::ShardObserver, the trainer through
// client::WorkerMetrics.
//
// Thread-safe after Start: the registry and its metrics may be updated from
// any thread while the exposer's threads serve scrapes. Destroy the users of
// the registry (or stop updating) before the MetricsServer.
#ifndef CO2_COMMON_METRICS_SERVER_H_
#define CO2_COMMON_METRICS_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace co2::common {

struct MetricsServerOptions {
  // host:port to serve /metrics on; port 0 picks a free one (see port()).
  std::string address = "0.0.0.0:9464";
  size_t num_threads = 2;  // HTTP worker threads of the exposer
};

class MetricsServer {
 public:
  // Binds and starts serving the (empty) registry. UNAVAILABLE naming the
  // address when it cannot listen (in use, bad host); INVALID_ARGUMENT for an
  // address that is not host:port.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options);
  ~MetricsServer();  // stops serving
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  // The bound port (the real one when the options asked for port 0).
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// The registry in the Prometheus text exposition format (what a scrape of
// /metrics returns), for tests and debugging.
std::string MetricsText(const prometheus::Registry& registry);

// Exponential histogram bucket bounds: start, start·factor, ... (count bounds).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace co2::common

#endif  // CO2_COMMON_METRICS_SERVER_H_
