#include "server/job/shard_members.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace co2::server {

ShardMembers::ShardMembers(std::string job, uint32_t max_workers,
                           absl::Duration lease, uint32_t max_rejected_chunks)
    : job_(std::move(job)),
      max_workers_(max_workers),
      lease_(lease),
      max_rejected_chunks_(max_rejected_chunks) {}

ShardMember* ShardMembers::Find(const std::string& worker) {
  auto it = live_.find(worker);
  return it == live_.end() ? nullptr : &it->second;
}

const ShardMember* ShardMembers::Find(const std::string& worker) const {
  auto it = live_.find(worker);
  return it == live_.end() ? nullptr : &it->second;
}

absl::Status ShardMembers::NotMember(const std::string& worker) const {
  auto evicted = evicted_.find(worker);
  if (evicted == evicted_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker \"", worker,
                     "\" is not a live member of this job (join first)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "worker \"", worker, "\" was evicted from job \"", job_,
      "\": ", evicted->second, "; it cannot rejoin under this id"));
}

absl::StatusOr<ShardMember*> ShardMembers::Add(const std::string& worker,
                                               bool* added) {
  auto it = live_.find(worker);
  if (it != live_.end()) return &it->second;
  if (live_.size() >= max_workers_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job \"", job_, "\" already has ", live_.size(),
                     " workers (limit ", max_workers_, ")"));
  }
  *added = true;
  return &live_.emplace(worker, ShardMember{}).first->second;
}

void ShardMembers::Restore(const std::string& worker, common::Codec uplink,
                           absl::Time lease_expiry) {
  live_[worker] = ShardMember{uplink, lease_expiry};
}

void ShardMembers::Renew(ShardMember& member, absl::Time now) const {
  member.lease_expiry = now + lease_;
}

bool ShardMembers::Remove(const std::string& worker) {
  return live_.erase(worker) > 0;
}

absl::Status ShardMembers::Reject(const std::string& worker,
                                  ShardMember& member,
                                  const absl::Status& invalid, bool* evicted) {
  // Dropped before anything is accumulated; a worker that keeps sending
  // garbage (a diverged model) is evicted so it cannot stall the rounds.
  std::string message(invalid.message());
  const uint32_t rejects = ++member.consecutive_rejects;
  if (max_rejected_chunks_ > 0 && rejects >= max_rejected_chunks_) {
    std::string reason = absl::StrCat(
        rejects, " invalid contribution chunks in a row (last: ", message, ")");
    Evict(worker, std::move(reason));
    *evicted = true;
    absl::StrAppend(&message, "; worker \"", worker, "\" is evicted after ",
                    rejects, " invalid chunks in a row");
  }
  return absl::Status(invalid.code(), message);
}

void ShardMembers::HoldOut(const std::string& worker, ShardMember& member,
                           uint64_t round, const std::string& why,
                           bool* evicted) {
  // Per round: a round's chunks are judged one by one, and a diverged
  // worker's chunks are all accepted on arrival, so a count of chunks in a
  // row would be reset by them.
  if (member.outlier_rounds > 0 && member.last_outlier_round == round) return;
  member.outlier_rounds =
      member.outlier_rounds > 0 && member.last_outlier_round + 1 == round
          ? member.outlier_rounds + 1
          : 1;
  member.last_outlier_round = round;
  if (max_rejected_chunks_ == 0 ||
      member.outlier_rounds < max_rejected_chunks_) {
    return;
  }
  Evict(worker, absl::StrCat(member.outlier_rounds,
                             " rounds in a row with a contribution held out "
                             "of the mean (last: ",
                             why, ")"));
  *evicted = true;
}

void ShardMembers::Evict(const std::string& worker, std::string reason) {
  CO2_LOG(WARNING) << "job " << job_ << ": evicting worker " << worker << ": "
                   << reason;
  live_.erase(worker);
  if (evicted_.size() >= max_workers_) evicted_.erase(evicted_.begin());
  evicted_[worker] = std::move(reason);
}

std::vector<std::string> ShardMembers::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.lease_expiry > now) {
      ++it;
      continue;
    }
    CO2_LOG(WARNING) << "job " << job_ << ": lease of worker " << it->first
                     << " expired; rounds close without it";
    expired.push_back(it->first);
    live_.erase(it++);
  }
  return expired;
}

absl::Time ShardMembers::NextExpiry() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [worker, member] : live_) {
    next = std::min(next, member.lease_expiry);
  }
  return next;
}

}  // namespace co2::server
