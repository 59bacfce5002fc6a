#include "common/metrics_server.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace co2::common {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options) {
  const size_t colon = options.address.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", options.address, "\" is not host:port"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::make_shared<prometheus::Registry>();
  // prometheus-cpp reports a failed bind with an exception (civetweb's
  // CivetException); this is the one place that converts it.
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        options.address, options.num_threads);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", options.address, ": ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", options.address, ": no listening port"));
  }
  server->port_ = ports[0];
  server->exposer_->RegisterCollectable(server->registry_);
  CO2_LOG(INFO) << "metrics on http://" << options.address.substr(0, colon)
                << ":" << server->port_ << "/metrics";
  return server;
}

MetricsServer::~MetricsServer() {
  // Stop the HTTP threads before the registry they read goes away.
  exposer_.reset();
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
