#include "server/job/shard_durability.h"

#include <utility>

namespace co2::server {

void ShardDurability::AnchorReplaced() {
  anchor_durable_ = false;
  dirty_ = true;
}

std::optional<ShardDurability::Waiter> ShardDurability::Wait(Waiter done) {
  if (!checkpoints()) return done;
  dirty_ = true;
  waiters_.push_back(std::move(done));
  return std::nullopt;
}

bool ShardDurability::Due(bool update_waits, bool anchor_whole,
                          absl::Time now) const {
  if (!checkpoints()) return false;
  if (!update_waits && !(dirty_ && anchor_whole)) return false;
  return now >= retry_at_;
}

void ShardDurability::WriteFailed(absl::Time now) {
  dirty_ = true;
  retry_at_ = now + retry_;
}

std::vector<ShardDurability::Waiter> ShardDurability::Written() {
  anchor_durable_ = true;
  return std::exchange(waiters_, {});
}

bool ShardDurability::MayStream(uint64_t open_round) const {
  return !checkpoints() ||
         (anchor_durable_ && unjournaled_round_ != open_round);
}

std::vector<ShardDurability::Waiter> ShardDurability::Abandon() {
  return std::exchange(waiters_, {});
}

}  // namespace co2::server
