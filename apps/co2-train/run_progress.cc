#include "apps/co2-train/run_progress.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"

namespace co2::client {
namespace {

std::string FormatMetric(const std::string& task, double metric) {
  if (metric < 0) return "";
  if (task == "fashion-mnist")
    return absl::StrFormat("  acc %5.2f%%", 100 * metric);
  return absl::StrFormat("  ppl %.2f", metric);
}

}  // namespace

std::vector<Progress> ReadProgress(const std::string& path) {
  std::vector<Progress> all;
  std::ifstream in(path);
  double last_metric = -1;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    Progress q;
    if (fields >> q.round >> q.total >> q.loss >> q.metric >> q.exposed >>
        q.elapsed) {
      if (q.metric >= 0) last_metric = q.metric;
      q.metric = last_metric;
      q.valid = true;
      all.push_back(q);
    }
  }
  return all;
}

std::string ProgressLine(const TrainerOptions& options, const Progress& p) {
  if (!p.valid) return "[co2-train] starting workers...";
  const double pct = p.elapsed > 0 ? 100 * p.exposed / p.elapsed : 0;
  return absl::StrFormat(
      "[co2-train] round %ld/%ld  loss %.4f%s  exposed comm %.1f%%  %.0fs",
      p.round, p.total, p.loss, FormatMetric(options.task, p.metric), pct,
      p.elapsed);
}

}  // namespace co2::client
