#include "server/job/update_sinks.h"

#include <algorithm>
#include <utility>

namespace co2::server {

void UpdateSinks::Add(std::weak_ptr<UpdateSink> sink) {
  sinks_.push_back(std::move(sink));
}

std::vector<std::shared_ptr<UpdateSink>> UpdateSinks::Live() {
  std::vector<std::shared_ptr<UpdateSink>> live;
  auto dead =
      std::remove_if(sinks_.begin(), sinks_.end(), [&](const auto& weak) {
        std::shared_ptr<UpdateSink> sink = weak.lock();
        if (sink == nullptr) return true;
        live.push_back(std::move(sink));
        return false;
      });
  sinks_.erase(dead, sinks_.end());
  return live;
}

}  // namespace co2::server
