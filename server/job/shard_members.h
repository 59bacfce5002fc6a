// ShardMembers: the workers of one job on one shard. A live member has the
// uplink codec it joined with, a lease its calls renew, and its run of
// invalid contribution chunks; a worker that sends max_rejected_chunks of
// them in a row is evicted, remembered with why (at most max_workers
// evictions, the oldest forgotten), and cannot rejoin under the same id.
// It decides membership only: the owner takes departed workers out of its
// rounds.
//
// Not thread-safe: the owner serialises calls (server::JobShard holds a
// mutex).
#ifndef CO2_SERVER_JOB_SHARD_MEMBERS_H_
#define CO2_SERVER_JOB_SHARD_MEMBERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/codec.h"

namespace co2::server {

struct ShardMember {
  common::Codec uplink = common::Codec::kFp32;
  absl::Time lease_expiry;
  uint32_t consecutive_rejects = 0;  // invalid chunks since the last valid
  // Rounds in a row with a contribution held out by the outlier rule, the
  // last of them `last_outlier_round`.
  uint32_t outlier_rounds = 0;
  uint64_t last_outlier_round = 0;
};

class ShardMembers {
 public:
  // `job` names the job in messages and logs; see JobShardOptions for the
  // limits (max_rejected_chunks 0: never evict).
  ShardMembers(std::string job, uint32_t max_workers, absl::Duration lease,
               uint32_t max_rejected_chunks);
  ShardMembers(const ShardMembers&) = delete;
  ShardMembers& operator=(const ShardMembers&) = delete;

  size_t size() const { return live_.size(); }
  const absl::flat_hash_map<std::string, ShardMember>& live() const {
    return live_;
  }
  // `worker`'s entry; null if it is not live. Valid until it is removed.
  ShardMember* Find(const std::string& worker);
  const ShardMember* Find(const std::string& worker) const;
  bool IsEvicted(const std::string& worker) const {
    return evicted_.contains(worker);
  }
  // NOT_FOUND for a worker that never joined or left; FAILED_PRECONDITION
  // saying why for one that was evicted.
  absl::Status NotMember(const std::string& worker) const;

  // `worker`'s entry, added if it is new (then `*added` is set);
  // RESOURCE_EXHAUSTED past max_workers.
  absl::StatusOr<ShardMember*> Add(const std::string& worker, bool* added);
  // A member from a checkpoint, replacing any entry of `worker`.
  void Restore(const std::string& worker, common::Codec uplink,
               absl::Time lease_expiry);
  // The lease runs `lease` from `now`.
  void Renew(ShardMember& member, absl::Time now) const;
  // False if `worker` was not live.
  bool Remove(const std::string& worker);
  // Counts a contribution chunk of `worker` that failed validation
  // (`invalid`, its message naming the round and chunk) and evicts the
  // worker after max_rejected_chunks in a row (then `*evicted` is set and
  // `member`, `worker`'s entry, is erased); returns the status for the
  // worker.
  absl::Status Reject(const std::string& worker, ShardMember& member,
                      const absl::Status& invalid, bool* evicted);
  // Counts a contribution of `worker` to round `round` held out of its
  // chunk's mean (`why` names the round, chunk and ratio) and evicts the
  // worker after max_rejected_chunks such rounds in a row, as Reject does.
  void HoldOut(const std::string& worker, ShardMember& member, uint64_t round,
               const std::string& why, bool* evicted);
  // Removes the members whose lease ran out by `now`; returns them.
  std::vector<std::string> ExpireLeases(absl::Time now);
  // The earliest lease expiry; InfiniteFuture without members.
  absl::Time NextExpiry() const;

 private:
  const std::string job_;
  const uint32_t max_workers_;
  const absl::Duration lease_;
  const uint32_t max_rejected_chunks_;
  // Erases `worker` (whose entry is gone after) and records why.
  void Evict(const std::string& worker, std::string reason);
  absl::flat_hash_map<std::string, ShardMember> live_;
  // Evicted workers → why.
  absl::flat_hash_map<std::string, std::string> evicted_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SHARD_MEMBERS_H_
