// MetricsServer: the Prometheus endpoint of one process. It owns a
// prometheus::Registry (prometheus-cpp core) and a small HTTP/1.1 server that
// answers GET /metrics with the registry in the text exposition format. Units
// that record metrics borrow the registry; the pure-logic units (RoundState,
// OuterOptimizer) never see it: the server reports through
// server::ShardObserver, the trainer through client::WorkerMetrics.
//
// Why not prometheus-cpp's pull Exposer: it serves from civetweb threads with
// a fixed 100 KiB stack, from which glibc also carves the static TLS; in a
// process that links LibTorch that leaves a few KiB, and the first scrape of a
// trainer overflowed it (SIGSEGV in vsnprintf). This server runs on one
// thread with a normal stack, answers one connection at a time (scrapes are
// rare and small) and bounds each by `io_timeout`.
//
// Thread-safe after Start: metrics may be updated from any thread while
// scrapes are served. Destroy the users of the registry (or stop updating)
// before the MetricsServer.
#ifndef CO2_COMMON_METRICS_SERVER_H_
#define CO2_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/host_tcp.h"
#include "common/process_metrics.h"
#include "prometheus/registry.h"

namespace co2::common {

struct MetricsServerOptions {
  // host:port to serve /metrics on ("[::]:9464" for IPv6); port 0 picks a
  // free one (see port()).
  std::string address = "0.0.0.0:9464";
  // Longest time one connection may take to send its request and read the
  // reply; a slower client is dropped.
  absl::Duration io_timeout = absl::Seconds(5);
  // The binary's name: every scrape also returns the process's process_*
  // metrics and co2_build_info (common/process_metrics.h), and the host's
  // TCP settings against `link_path` (common/host_tcp.h), from the first
  // second. Empty: the registry alone.
  std::string program;
  LinkPath link_path;  // the path the process's streams cross, if said
};

class MetricsServer {
 public:
  // Binds, listens and starts the serving thread. UNAVAILABLE naming the
  // address when it cannot listen (in use, unknown host); INVALID_ARGUMENT
  // for an address that is not host:port.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options);
  ~MetricsServer();  // stops serving and joins the thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  // The bound port (the real one when the options asked for port 0).
  int port() const { return port_; }

 private:
  explicit MetricsServer(const MetricsServerOptions& options);
  void Serve();  // the serving thread
  void HandleConnection(int fd);

  const MetricsServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ProcessCollector> process_;  // null without a program
  std::unique_ptr<HostTcpCollector> host_tcp_;  // null without a program
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the thread through it
  int port_ = 0;
  std::thread thread_;
};

// The registry in the Prometheus text exposition format (what a scrape of
// /metrics returns), for tests and debugging.
std::string MetricsText(const prometheus::Registry& registry);

// Exponential histogram bucket bounds: start, start·factor, ... (count bounds).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace co2::common

#endif  // CO2_COMMON_METRICS_SERVER_H_
