#include "server/service/refused_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace co2::server {

RefusedCalls::RefusedCalls(uint32_t shard_index, ShardObserver* observer,
                           common::Clock* clock, absl::Duration interval)
    : shard_index_(shard_index),
      observer_(observer),
      clock_(clock),
      interval_(interval) {}

absl::Status RefusedCalls::Check(absl::Status status, absl::string_view peer) {
  if (status.code() == absl::StatusCode::kUnauthenticated ||
      status.code() == absl::StatusCode::kPermissionDenied) {
    Note(status, peer);
  }
  return status;
}

std::optional<std::string> RefusedCalls::Note(const absl::Status& refusal,
                                              absl::string_view peer) {
  if (observer_ != nullptr) observer_->OnCallRefused(refusal.code());
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (now - last_logged_ < interval_) {
      ++left_out_;
      return std::nullopt;
    }
    line = absl::StrCat("shard ", shard_index_, ": refused a call from ", peer,
                        ": ", refusal.ToString());
    if (left_out_ > 0) {
      absl::StrAppend(&line, " (and ", left_out_,
                      " more refused calls since the last such line)");
    }
    last_logged_ = now;
    left_out_ = 0;
  }
  CO2_LOG(WARNING) << line;
  return line;
}

}  // namespace co2::server
